"""Partition schedules on real node processes, judged by the simulator's history checker.

A :class:`PartitionRing` runs ``n`` ``statestore node`` processes, each in its own network
namespace (testing/netns.py), the clients in the test's own namespace on the bridge.
A schedule (:func:`run_schedule`, one seed) gives each of its stores a writer (an
``AsyncRingClient`` of its own, epoch 1) and then, a fraction of a second apart, does one of:

- commit (the store's newest writer), a zombie commit (an older, fenced writer keeps going),
  take over (a new writer, epoch + 1, restores the latest and continues from it), restore
  (the latest or an acknowledged version), read the head;
- ``split``: the nodes in two random halves, the clients with one of them;
- ``isolate``: one node cut off from the other nodes (the clients see it or not);
- ``bridge``: one node sees everyone, the others in two groups that do not see each other
  (the clients on one side, or everywhere);
- ``pause`` (SIGSTOP, resumed later), ``kill`` (``kill -9``, restarted later), ``heal``.

At the end everything heals (rules cleared, paused nodes continued, killed ones restarted), the
ring settles (every node sees every member up at one epoch), and every store's head and every
acknowledged version are restored, retried while the ring answers "unavailable" (repair may
still be copying) until a deadline; then ``statestore.testing.history.check`` holds the run to its
promises: acknowledged commits restore byte for byte, heads never go back, no version is
acknowledged with two contents, a fenced writer is never acknowledged.

Real processes are not deterministic: a seed fixes the schedule (the operations, their
contents and the faults, in order), not the timing of what the ring does in between.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import statestore
from client import AsyncRingClient
from statestore.cli.local import LocalRing, NodeProcess
from statestore.core.errors import StateStoreError, Unavailable
from statestore.core.ids import StoreId
from statestore.testing.history import History, ReadOp, Violation, check
from statestore.testing.ops import ClientOps, Writer

from .netns import Netns

__all__ = ["PartitionRing", "ScheduleOutcome", "run_schedule"]

PORT = 7400
NODE_ARGS = [
    "--no-dht",
    "--gossip-interval",
    "0.2",
    "--suspect-after",
    "1.5",
    "--down-after",
    "3.5",
    "--log-level",
    os.environ.get("STATESTORE_PARTITION_LOG", "ERROR"),
]
ACTIONS = {
    "commit": 7.0,
    "zombie": 1.0,
    "takeover": 1.0,
    "restore": 2.0,
    "head": 1.0,
    "split": 1.0,
    "isolate": 1.0,
    "bridge": 1.0,
    "pause": 0.7,
    "kill": 0.7,
    "heal": 1.2,
}
CLIENT_TIMEOUT = 1.0
FINAL_DEADLINE = 15.0
SCHEDULE_DEADLINE = 150.0


class PartitionRing:
    """``n`` node processes in namespaces; the clients are on the bridge (``client_ip``)."""

    def __init__(
        self,
        base_dir: str,
        n: int = 5,
        tag: int | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.net = Netns(n, tag)
        self.base_dir = base_dir
        root = str(Path(statestore.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
        self.local = LocalRing(base_dir, nodes=n)
        for i in range(n):
            self.local.procs.append(
                NodeProcess(
                    os.path.join(base_dir, f"node-{i}"),
                    PORT,
                    list(NODE_ARGS if args is None else args),
                    host=self.net.ips[i],
                    prefix=self.net.prefix(i),
                    env=env,
                )
            )
        self.addresses = [f"{ip}:{PORT}" for ip in self.net.ips]

    @property
    def procs(self) -> list[NodeProcess]:
        return self.local.procs

    def start(self) -> PartitionRing:
        self.net.setup()
        try:
            for i, p in enumerate(self.procs):
                p.start([a for j, a in enumerate(self.addresses) if j != i])
            self.local.wait_ring(self.net.n)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node and delete the namespaces and their rules (safe to call twice)."""
        try:
            for p in self.procs:
                p.stop(signal.SIGKILL)
        finally:
            self.net.teardown()

    # -- process faults ------------------------------------------------------------------
    def pause(self, i: int) -> None:
        if self.procs[i].alive and not self.procs[i].paused:
            self.local.pause(i)

    def resume(self, i: int) -> None:
        if self.procs[i].alive and self.procs[i].paused:
            self.local.resume(i)

    def kill(self, i: int) -> None:
        self.local.kill(i)

    def restart(self, i: int) -> None:
        if not self.procs[i].alive:
            self.procs[i].start([a for j, a in enumerate(self.addresses) if j != i])

    def heal_all(self) -> None:
        """Clear every cut, continue every paused node, restart every killed one, and wait
        until every node sees all of them up at one epoch."""
        self.net.heal()
        for i in range(self.net.n):
            self.resume(i)
            self.restart(i)
        self.wait_settled()

    def wait_settled(self, timeout: float = 25.0) -> None:
        """Every node sees every member alive (``up`` or ``suspect``: not ``down``) at one
        ring epoch, so every replica set is the full ring's again. Not "every member up at
        once": after some partitions a node's heartbeats reach a peer only every ~2 s for a
        while, and it flaps between up and suspect there without being declared down
        (docs/reliability.md, "Partitions")."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                views = [self.local.ring(a) for a in self.addresses]
                alive = [sum(1 for m in v["members"] if m["status"] != "down") for v in views]
                epochs = {v["epoch"] for v in views}
                last = (alive, epochs)
                if all(a == self.net.n for a in alive) and len(epochs) == 1:
                    return
            except (OSError, ValueError) as exc:
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"ring did not settle: {last}; views: {self.views()}")

    def views(self) -> dict[str, object]:
        """Each node's view of the members (address -> status, incarnation), for reports."""
        out: dict[str, object] = {}
        for p in self.procs:
            try:
                v = self.local.ring(p.address)
                out[p.address] = [
                    (m.get("address"), m.get("status"), m.get("incarnation"), m.get("heartbeat"))
                    for m in v["members"]
                ] + [("epoch", v["epoch"])]
            except OSError as exc:
                out[p.address] = str(exc)
        return out


@dataclass
class ScheduleOutcome:
    seed: int
    violations: list[Violation]
    log: list[str]
    commits: int = 0
    acks: int = 0
    refused: int = 0
    tentative: int = 0
    rolled_back: int = 0
    reads: int = 0
    faults: int = 0
    seconds: float = 0.0
    # not a checker violation: the schedule ran past its deadline, or the ring did not settle
    # (every node seeing every member up at one epoch) after the final heal
    trouble: str = ""


class _Schedule(ClientOps):
    COMMIT_ATTEMPTS = 2  # real processes: fewer, quicker retries than the simulator's
    RETRY_PAUSE = 0.3

    def __init__(
        self, ring: PartitionRing, seed: int, label: str, stores: int, tentative: float = 0.0
    ) -> None:
        self.ring = ring
        self.rng = random.Random(seed)
        self.tentative = tentative  # share of commits allowed to be tentative (own generator)
        self.trng = random.Random(seed ^ 0x7E47)
        self.history = History()
        self.stores = [StoreId("part", 0, p, f"{label}x{p}") for p in range(stores)]
        self.writers: dict[StoreId, list[Writer]] = {s: [] for s in self.stores}
        self.clients: list[AsyncRingClient] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.serial = 0
        self.faults = 0
        self.paused: int | None = None
        self.killed: int | None = None
        self.process_lock = asyncio.Lock()  # one pause, resume, kill or restart at a time
        self.net_lock = asyncio.Lock()  # one change of the cuts at a time
        self.log: list[str] = []

    def note(self, line: str) -> None:
        self.log.append(f"[{self.history.now()}] {line}")

    async def client(self, name: str = "") -> AsyncRingClient:
        c = AsyncRingClient(
            self.ring.addresses, timeout=CLIENT_TIMEOUT, chunk_size=512, key_groups=8
        )
        await c.connect()
        self.clients.append(c)
        return c

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        async def run() -> None:
            await coro

        self.tasks.append(asyncio.create_task(run()))

    # -- the nemesis ---------------------------------------------------------------------
    def topology(self, action: str) -> tuple[set[tuple[str, str]], str]:
        """A new random cut of the kind ``action`` (drawn now, in schedule order)."""
        rng, ips, client = self.rng, self.ring.net.ips, self.ring.net.client_ip
        nodes = list(range(len(ips)))
        rng.shuffle(nodes)
        cut: set[tuple[str, str]] = set()
        if action == "split":
            half = rng.randint(1, len(nodes) - 1) if len(nodes) > 2 else 1
            a, b = nodes[:half], nodes[half:]
            cut |= {(ips[i], ips[j]) for i in a for j in b}
            away = rng.choice([a, b])  # the clients are on the other side
            cut |= {(client, ips[i]) for i in away}
            what = f"split {sorted(a)} | {sorted(b)}, clients with {sorted(set(nodes) - set(away))}"
        elif action == "isolate":
            x = nodes[0]
            cut |= {(ips[x], ips[j]) for j in nodes[1:]}
            sees = rng.random() < 0.5
            if not sees:
                cut.add((client, ips[x]))
            what = f"isolate {x} (clients {'see' if sees else 'do not see'} it)"
        else:  # bridge: nodes[0] sees all; the others in two groups that do not see each other
            hub, rest = nodes[0], nodes[1:]
            half = max(1, len(rest) // 2)
            b, c = rest[:half], rest[half:]
            cut |= {(ips[i], ips[j]) for i in b for j in c}
            side = rng.choice(["b", "c", "all"])
            if side == "b":
                cut |= {(client, ips[j]) for j in c}
            elif side == "c":
                cut |= {(client, ips[j]) for j in b}
            what = f"bridge {hub} between {sorted(b)} and {sorted(c)}, clients see {side}"
        self.faults += 1
        return cut, what

    async def change_net(self, cut: set[tuple[str, str]], what: str) -> None:
        """Replace the current cut (one change at a time, in the order drawn)."""
        async with self.net_lock:
            self.note(what)
            await asyncio.to_thread(self.ring.net.apply, cut)

    def process_fault(self, action: str) -> tuple[str, int] | None:
        """Draw a pause, resume, kill -9 or restart now (one process out at a time)."""
        n = self.ring.net.n
        if action == "pause":
            if self.paused is not None:
                i, self.paused = self.paused, None
                return "resume", i
            if self.killed is None:
                self.paused = self.rng.randrange(n)
                self.faults += 1
                return "pause", self.paused
        elif action == "kill":
            if self.killed is not None:
                i, self.killed = self.killed, None
                return "restart", i
            if self.paused is None:
                self.killed = self.rng.randrange(n)
                self.faults += 1
                return "kill -9", self.killed
        return None

    async def do_process(self, what: str, i: int) -> None:
        ring = self.ring
        do = {"resume": ring.resume, "pause": ring.pause, "restart": ring.restart}
        async with self.process_lock:
            self.note(f"{what} {i}")
            await asyncio.to_thread(do.get(what, ring.kill), i)

    def step(self, action: str) -> None:
        rng = self.rng
        store = rng.choice(self.stores)
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
            self.spawn(self.restore(rng.choice(self.clients), store, version))
        elif action == "head":
            self.spawn(self.head(rng.choice(self.clients), store))
        elif action in ("split", "isolate", "bridge"):
            self.spawn(self.change_net(*self.topology(action)))
        elif action in ("pause", "kill"):
            fault = self.process_fault(action)
            if fault is not None:
                self.spawn(self.do_process(*fault))
        elif action == "heal":
            self.spawn(self.change_net(set(), "heal the network"))

    async def main(self, steps: int) -> None:
        checker = await self.client()
        for store in self.stores:
            await self.new_writer(store)
        names, weights = list(ACTIONS), list(ACTIONS.values())
        for _ in range(steps):
            self.step(self.rng.choices(names, weights)[0])
            await asyncio.sleep(self.rng.uniform(0.1, 0.6))
        await asyncio.gather(*self.tasks)
        self.note("final: heal, resume, restart, wait for the ring")
        await asyncio.to_thread(self.ring.heal_all)
        await self.verdicts(checker, 60.0)  # tentative commits: confirmed or rolled back
        for store in self.stores:
            await self.final_restore(checker, store, None)
            for v in sorted({c.version for c in self.history.stable() if c.store == store.path}):
                await self.final_restore(checker, store, v)
        for c in self.clients:
            await c.close()

    async def final_restore(self, c: AsyncRingClient, store: StoreId, version: int | None) -> None:
        """Restore until it answers something other than "unavailable" (repair may still be
        copying what moved), or the deadline: then the last answer is the final one."""
        deadline = time.monotonic() + FINAL_DEADLINE
        while True:
            start = self.history.now()
            try:
                st = await c.restore(store, version, plan="star")
                op = ReadOp(
                    "restore", store.path, version, start, self.history.now(),
                    (st.epoch, st.version), dict(st), final=True,
                )  # fmt: skip
            except Unavailable as exc:
                if time.monotonic() < deadline:
                    self.note(f"final restore {store.path} {version}: {type(exc).__name__}, again")
                    await asyncio.sleep(0.5)
                    continue
                op = ReadOp(
                    "restore", store.path, version, start, self.history.now(),
                    error=type(exc).__name__, final=True,
                )  # fmt: skip
            except StateStoreError as exc:
                op = ReadOp(
                    "restore", store.path, version, start, self.history.now(),
                    error=type(exc).__name__, final=True,
                )  # fmt: skip
            self.history.add_read(op)
            return


def run_schedule(
    ring: PartitionRing,
    seed: int,
    *,
    steps: int | None = None,
    stores: int = 2,
    label: str | None = None,
    tentative: float = 0.0,
) -> ScheduleOutcome:
    """Run the schedule of ``seed`` on ``ring`` (healed at the end) and judge it;
    ``tentative``: the share of commits allowed to be tentative (core/tentative.py)."""
    started = time.monotonic()
    sched = _Schedule(ring, seed, label or f"s{seed}", stores, tentative)
    n = steps if steps is not None else sched.rng.randint(6, 10)
    trouble = ""
    try:
        asyncio.run(asyncio.wait_for(sched.main(n), SCHEDULE_DEADLINE))
    except TimeoutError as exc:
        trouble = str(exc) or f"schedule ran past its {SCHEDULE_DEADLINE:.0f} s deadline"
    try:
        ring.heal_all()  # whatever happened, leave the ring whole for the next schedule
    except TimeoutError as exc:
        trouble = trouble or str(exc)
    commits = sched.history.commits
    lines = sorted(sched.history.lines + sched.log, key=_start)
    return ScheduleOutcome(
        seed=seed,
        violations=check(sched.history),
        log=lines,
        commits=len(commits),
        acks=sum(1 for c in commits if c.outcome == "ack"),
        refused=sum(1 for c in commits if c.outcome == "refused"),
        tentative=sum(1 for c in commits if c.outcome == "tentative"),
        rolled_back=sum(1 for v, _ in sched.history.verdicts.values() if v == "rolled_back"),
        reads=len(sched.history.reads),
        faults=sched.faults,
        seconds=time.monotonic() - started,
        trouble=trouble,
    )


def _start(line: str) -> int:
    head = line[1:].split("]", 1)[0].split("-", 1)[0]
    return int(head) if head.isdigit() else 0
