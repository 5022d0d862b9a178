"""One random fault schedule over a simulated ring, from one seed.

A schedule starts five real nodes (testing/cluster.py) on the in-memory network, gives every store
a writer, and then for a random number of steps, a few simulated seconds apart, does one of:
commit (the store's writer, or a fenced zombie that keeps going), take over a store with a
higher epoch (restore the latest version, continue from it), restore or read a head, crash or
restart a node (storage kept; one node crashed or isolated at a time, the failures R=3, W=2
promises to survive), block a directed link or isolate a node, heal, or change the
rates of dropped, delayed, duplicated and cut messages. Client operations run concurrently with
the next steps and with the nodes' own gossip, repair and compaction loops. At the end every
link heals, every node restarts and the ring repairs itself; then each store's head and every
acknowledged version in its retention window are restored, and testing/history.py judges the run.

Everything random comes from ``random.Random(seed)`` and time is simulated (testing/clock.py), so
a seed replays exactly: the same operations, faults, outcomes and findings.

With ``disk_faults`` (a share of the steps), a step may also hit one node's disk
(testing/disk.py): crash it losing the writes of its last seconds (**lost**), crash it tearing
the last chunk or manifest it wrote (**torn**), flip bits in one chunk or manifest it holds
(**flip**, the node stays up), or crash it and wipe its data dir (**wipe**: it restarts as a
new, empty node at the same address). The fault budget: a node with a disk fault counts as
out (as a crashed or isolated one) until :data:`RECOVERY` seconds after it is up again, and
one node is out at a time. The scrub (node/scrub.py) then runs every
:data:`SCRUB_INTERVAL` seconds. With ``skew``, the nodes' clocks disagree (testing/cluster.py).
Both draw from generators of their own: off, a seed's schedule is what it was before them.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from client import AsyncRingClient
from statestore.core.errors import NodeUnavailable
from statestore.core.ids import StoreId
from statestore.net.memory import LinkFaults, MemoryNetwork
from statestore.node.api import build_app
from statestore.testing.clock import run_simulated
from statestore.testing.cluster import SIM_CONFIG, AppFactory, Cluster
from statestore.testing.history import History, Violation, check
from statestore.testing.ops import ClientOps, Writer

__all__ = ["DISK_FAULTS", "RECOVERY", "Outcome", "run_schedule"]

NODES = 5
STORES = tuple(StoreId("sim", 0, p, "s") for p in range(2))
ACTIONS = {
    "commit": 8.0,
    "zombie": 1.0,
    "takeover": 1.0,
    "restore": 2.0,
    "head": 1.0,
    "crash": 1.0,
    "restart": 1.5,
    "partition": 1.0,
    "isolate": 0.5,
    "heal": 1.0,
    "faults": 1.0,
}
# disk faults by kind (testing/disk.py), weighted
DISK_FAULTS = {"lost": 1.0, "torn": 1.0, "flip": 2.0, "wipe": 0.5}
RECOVERY = 20.0  # a disk-faulted node is out this long after it is up again (repair's time)
SCRUB_INTERVAL = 5.0  # between scrub passes when disk faults are on
# versions retained when --rebase-at is on, with snapshot_every 1: a schedule's few versions
# per store then meet the rule (a snapshot only once the deltas weigh that share of the last)
REBASE_RETAIN = 20
# versions retained with --thin: few enough that a schedule's stores (about a dozen versions
# each) see their floor climb by rungs folded below the head (core/retention.py), not only
# their snapshots thinned
THIN_RETAIN = 5


@dataclass
class Outcome:
    """What one schedule did and found."""

    seed: int
    violations: list[Violation]
    log: list[str]
    commits: int = 0
    acks: int = 0
    tentative: int = 0
    rolled_back: int = 0
    refused: int = 0
    reads: int = 0
    sim_seconds: float = 0.0
    disk_faults: Counter[str] = field(default_factory=Counter)  # by kind, and "lost batches"
    scrub: dict[str, int] = field(default_factory=dict)  # node stats: scrubbed, corrupt, ...


class _Run(ClientOps):
    def __init__(
        self,
        seed: int,
        app_factory: AppFactory,
        data_root: str,
        tentative: float = 0.0,
        disk_faults: float = 0.0,
        skew: float = 0.0,
        rebase_at: float = 0.0,
        thin: int = 0,
    ) -> None:
        self.rng = random.Random(seed)
        # tentative commits, disk faults and clock skew draw from generators of their own:
        # off, a seed's schedule is what it was before they existed (the regression seeds of
        # tests/ring/test_sim.py)
        self.tentative = tentative
        self.trng = random.Random(seed ^ 0x7E47)
        self.disk_faults = disk_faults
        self.drng = random.Random(seed ^ 0xD15C)
        self.network = MemoryNetwork(random.Random(self.rng.getrandbits(64)))
        config = replace(SIM_CONFIG, scrub_interval=SCRUB_INTERVAL) if disk_faults else SIM_CONFIG
        if rebase_at:  # the weight decides, not snapshot_every, within what is retained
            config = replace(
                config, rebase_at=rebase_at, retain_versions=REBASE_RETAIN, snapshot_every=1
            )
        if thin:  # snapshots every version, most of them thinned, within what is retained
            config = replace(
                config, thin_snapshots=thin, retain_versions=THIN_RETAIN, snapshot_every=1
            )
        self.cluster = Cluster(
            self.network,
            NODES,
            random.Random(self.rng.getrandbits(64)),
            data_root,
            config=config,
            app_factory=app_factory,
            skew=skew,
            skew_rng=random.Random(seed ^ 0x5CE3),
        )
        self.faulted: dict[str, float] = {}  # address -> simulated time of its disk fault
        self.fault_counts: Counter[str] = Counter()
        self.history = History()
        self.clients: list[AsyncRingClient] = []
        self.writers: dict[StoreId, list[Writer]] = {s: [] for s in STORES}
        self.tasks: list[asyncio.Task[None]] = []
        self.serial = 0
        self.isolated: str | None = None

    async def client(self, name: str) -> AsyncRingClient:
        c = AsyncRingClient(
            self.cluster.addresses,
            chunk_size=256,
            key_groups=8,
            concurrency=4,
            transport=self.network.transport(name, timeout=5.0),
            clock=asyncio.get_running_loop().time,
        )
        # a client that reaches no seed now tries again, as a real one would (run seed 372014
        # ended here when every seed was slow); a schedule where it never does is unchanged
        for attempt in range(30):
            try:
                await c.connect()
                break
            except NodeUnavailable:
                if attempt == 29:
                    raise
                await asyncio.sleep(1.0)
        self.clients.append(c)
        return c

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(coro))

    # -- the schedule ----------------------------------------------------------------
    def _step(self, action: str) -> None:
        rng, net, cluster = self.rng, self.network, self.cluster
        store = rng.choice(STORES)
        live = [w for w in self.writers[store] if not w.fenced and not w.busy]
        if action == "commit" and live:
            w = max(live, key=lambda w: w.epoch)
            w.busy = True
            tentative = self.tentative > 0 and self.trng.random() < self.tentative
            self.spawn(self.commit(w, *self.delta(w), tentative))
        elif action == "zombie":
            old = [w for w in self.writers[store][:-1] if not w.busy and not w.fenced]
            if old:
                w = rng.choice(old)
                w.busy = True
                self.spawn(self.commit(w, *self.delta(w)))
        elif action == "takeover":
            self.spawn(self.takeover(store))
        elif action == "restore":
            acked = sorted({c.version for c in self.history.acked() if c.store == store.path})
            version = rng.choice([None, *acked[-6:]])
            self.spawn(self._void(self.restore(rng.choice(self.clients), store, version)))
        elif action == "head":
            self.spawn(self.head(rng.choice(self.clients), store))
        elif action == "crash" and not self._out():
            self.spawn(cluster.crash(rng.choice(cluster.up())))
        elif action == "restart" and cluster.down():
            self.spawn(cluster.start(rng.choice(cluster.down())))
        elif action == "partition":
            ends = cluster.addresses + [f"w{i + 1}" for i in range(self.serial)]
            src, dst = rng.sample(ends, 2)
            net.note(f"block {src}->{dst}")
            net.block(src, dst)
        elif action == "isolate" and not self._out():
            a = rng.choice(cluster.addresses)
            self.isolated = a
            net.note(f"isolate {a}")
            for b in cluster.addresses:
                if b != a:
                    net.block(a, b)
                    net.block(b, a)
        elif action == "heal":
            net.note("heal")
            net.heal()
            self.isolated = None
        elif action == "faults":
            if rng.random() < 0.3:
                net.faults = LinkFaults()
            else:
                net.faults = LinkFaults(
                    drop=rng.choice([0.0, 0.01, 0.05]),
                    duplicate=rng.choice([0.0, 0.05, 0.2]),
                    cut=rng.choice([0.0, 0.1, 0.3]),
                    delay=rng.choice([0.0, 0.1, 0.5]),
                    max_delay=rng.choice([0.05, 0.5, 2.0]),
                )
            net.note(f"faults {net.faults}")

    def _out(self) -> bool:
        """A node is crashed or isolated already, or its disk fault is not repaired yet: the
        schedule takes out one node at a time, the failures R=3, W=2 promises to survive
        (docs/reliability.md)."""
        return bool(self.cluster.down()) or self.isolated is not None or self._disk_out()

    def _disk_out(self) -> bool:
        now = asyncio.get_running_loop().time()
        down = self.cluster.down()
        return any(
            a in down or now < max(at, self.cluster.started_at(a)) + RECOVERY
            for a, at in self.faulted.items()
        )

    def _disk_step(self) -> None:
        """Maybe hit one node's disk (testing/disk.py), within the fault budget."""
        if not self.disk_faults or self.drng.random() >= self.disk_faults or self._out():
            return
        kind = self.drng.choices(list(DISK_FAULTS), list(DISK_FAULTS.values()))[0]
        address = self.drng.choice(self.cluster.up())
        self.faulted[address] = asyncio.get_running_loop().time()
        self.spawn(self._disk_fault(kind, address))

    async def _disk_fault(self, kind: str, address: str) -> None:
        cluster, note, disk = self.cluster, self.network.note, self.cluster.disk(address)
        self.fault_counts[kind] += 1
        if kind == "flip":
            key = disk.flip(self.drng)
            note(f"disk flip {address}: {key!r}")
            return
        since = asyncio.get_running_loop().time() - self.drng.uniform(0.2, 3.0)
        await cluster.crash(address)
        if kind == "lost":
            lost = disk.lose(since)
            self.fault_counts["lost batches"] += lost
            note(f"disk lost {address}: {lost} write batches acknowledged since {since:.3f}")
        elif kind == "torn":
            note(f"disk torn {address}: {disk.tear(self.drng)!r}")
        else:
            cluster.wipe(address)

    @staticmethod
    async def _void(coro: Coroutine[Any, Any, Any]) -> None:
        await coro

    async def main(self, steps: int) -> Outcome:
        loop = asyncio.get_running_loop()
        await self.cluster.start_all()
        await asyncio.sleep(SIM_CONFIG.down_after)  # let gossip converge
        checker = await self.client("checker")
        for store in STORES:
            await self.new_writer(store)
        names, weights = list(ACTIONS), list(ACTIONS.values())
        for _ in range(steps):
            self._disk_step()
            self._step(self.rng.choices(names, weights)[0])
            await asyncio.sleep(self.rng.uniform(0.05, 3.0))
        # the end: heal everything, let the ring repair, then check every acknowledged version
        self.network.note("final: heal, restart all, repair")
        self.network.heal()
        self.network.faults = LinkFaults()
        await asyncio.gather(*self.tasks)
        for a in self.cluster.down():
            await self.cluster.start(a)
        await asyncio.sleep(4 * SIM_CONFIG.down_after)
        await self.verdicts(checker, 60.0)
        for store in STORES:
            top = await self.restore(checker, store, None, final=True)
            acked = sorted({c.version for c in self.history.stable() if c.store == store.path})
            # retention keeps the last versions below the highest one the store had: a writer
            # that took over from an older head (a lower version at a higher epoch) does not
            # bring back what retention dropped before (seed 163285530910507)
            head = max([top.head[1] if top.head else 0, *acked])
            for v in acked:
                if v > head - self.cluster.config.retain_versions:
                    await self.restore(checker, store, v, final=True)
        for c in self.clients:
            await c.close()
        await self.cluster.stop_all()
        commits = self.history.commits
        return Outcome(
            seed=0,
            violations=check(self.history),
            log=self.history.lines + self.network.log,
            commits=len(commits),
            acks=sum(1 for c in commits if c.outcome == "ack"),
            tentative=sum(1 for c in commits if c.outcome == "tentative"),
            rolled_back=sum(1 for v, _ in self.history.verdicts.values() if v == "rolled_back"),
            refused=sum(1 for c in commits if c.outcome == "refused"),
            reads=len(self.history.reads),
            sim_seconds=loop.time(),
            disk_faults=self.fault_counts,
            scrub=dict(self.cluster.scrub),
        )


def run_schedule(
    seed: int,
    *,
    steps: int | None = None,
    app_factory: AppFactory = build_app,
    tentative: float = 0.0,
    disk_faults: float = 0.0,
    skew: float = 0.0,
    rebase_at: float = 0.0,
    thin: int = 0,
) -> Outcome:
    """Run the schedule of ``seed`` to the end and judge it (testing/history.py); ``tentative``:
    the share of the writers' commits allowed to be tentative (core/tentative.py);
    ``disk_faults``: the share of steps that also hit a node's disk; ``skew``: the bound of
    the nodes' clock offsets, in seconds; ``rebase_at``: the nodes' ``--rebase-at`` (0: every
    seed's schedule as before it existed; else with ``REBASE_RETAIN`` versions retained and
    ``snapshot_every`` 1, so the deltas' weight decides); ``thin``: the nodes'
    ``--thin-snapshots`` (0: off; else a snapshot every version, most of them thinned, and
    ``THIN_RETAIN`` versions retained, so that floors climb by rungs)."""
    with tempfile.TemporaryDirectory(prefix="statestore-sim-") as root:
        run = _Run(seed, app_factory, root, tentative, disk_faults, skew, rebase_at, thin)
        n = steps if steps is not None else run.rng.randint(15, 40)
        outcome = run_simulated(lambda: run.main(n))
    outcome.seed = seed
    return outcome
