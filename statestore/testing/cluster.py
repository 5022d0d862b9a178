"""A ring of real nodes in one process, on the in-memory network and simulated time.

Each node is the daemon's own ``Node`` with its own API (``node.api.build_app``) and its real
background loops (gossip, repair, compaction), given the simulation's clock (the loop's
simulated time), a seeded RNG, a ``MemoryTransport`` named by its address, an inline storage
writer and a ``MemoryBackend`` that outlives it: a crash drops the node and everything it was
doing, a restart builds a new ``Node`` over the same data (its id and incarnation come from its
data dir, as after a real restart).

The storage is a :class:`~statestore.testing.disk.Disk` (a ``MemoryBackend`` that can also lose,
tear and rot what it holds, and be wiped: ``--disk-faults``). With ``skew``, each node's clock
is the simulated time times a rate within 1 +- 0.1 %, plus an offset within +-``skew``
seconds of a common 1,000 s, drawn again at every start (a reboot restarts a monotonic
clock): nodes never agree on the time, as real ones don't.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace

from aiohttp import web

from statestore.net.memory import MemoryNetwork
from statestore.node.api import build_app
from statestore.node.config import NodeConfig
from statestore.node.daemon import Loop, Node
from statestore.node.moves import check_returning
from statestore.node.server import LOOPS
from statestore.testing.clock import InlineExecutor
from statestore.testing.disk import Disk

__all__ = ["SCRUB_COUNTS", "SIM_CONFIG", "AppFactory", "Cluster"]

SCRUB_COUNTS = ("scrubbed", "scrub_corrupt", "scrub_replaced")  # node stats summed per run

AppFactory = Callable[[Node], web.Application]

# Small and quick: a 3-of-5 ring with W=2 whose detectors, repair and compaction act within a
# few simulated seconds, and short chains so snapshots and retention happen in every run.
SIM_CONFIG = NodeConfig(
    replicas=3,
    write_quorum=2,
    vnodes=16,
    gossip_interval=0.5,
    suspect_after=2.0,
    down_after=5.0,
    repair_interval=2.0,
    compact_interval=3.0,
    snapshot_every=3,
    retain_versions=6,
    thin_snapshots=0,  # every seed's schedule as before thinning (statestore-sim --thin)
    dht=False,
    storage="memory://",
)


def _sim_time() -> float:
    return asyncio.get_running_loop().time()


class _Slot:
    def __init__(self, address: str, data_dir: str) -> None:
        self.address = address
        self.data_dir = data_dir
        self.backend = Disk(_sim_time)
        self.node: Node | None = None
        self.started_at = 0.0  # simulated time of the last start
        self.wipes = 0
        self.starting = False  # a start waits for the ring (Cluster.start after a wipe)
        self.empty = False  # wiped, not started since


def _write_identity(data_dir: str, node_id: str) -> None:
    with open(os.path.join(data_dir, "node.json"), "w") as f:
        json.dump({"id": node_id, "incarnation": 0}, f)  # the same ids every run


class Cluster:
    """``size`` nodes ``n0:7400``, ``n1:7400``, ... under ``data_root``.

    Args:
        app_factory: builds a node's application (a test passes a broken one).
        loops: the background loops each node runs besides gossip.
        skew: the bound of each node's clock offset (0: every node reads the loop's time).
        skew_rng: draws the offsets and rates (its own generator, so ``skew`` 0 changes no
            schedule).
    """

    def __init__(
        self,
        network: MemoryNetwork,
        size: int,
        rng: random.Random,
        data_root: str,
        *,
        config: NodeConfig = SIM_CONFIG,
        app_factory: AppFactory = build_app,
        loops: Sequence[tuple[str, Loop]] = LOOPS,
        skew: float = 0.0,
        skew_rng: random.Random | None = None,
    ) -> None:
        self.network = network
        self.rng = rng
        self.config = config
        self.app_factory = app_factory
        self.loops = tuple(loops)
        self.skew = skew
        self.skew_rng = skew_rng or random.Random(0)
        self.scrub: dict[str, int] = dict.fromkeys(SCRUB_COUNTS, 0)
        self.slots: dict[str, _Slot] = {}
        for i in range(size):
            address = f"n{i}:7400"
            data_dir = os.path.join(data_root, f"n{i}")
            os.makedirs(data_dir)
            _write_identity(data_dir, f"n{i}")
            self.slots[address] = _Slot(address, data_dir)

    @property
    def addresses(self) -> list[str]:
        return list(self.slots)

    def up(self) -> list[str]:
        return [a for a, s in self.slots.items() if s.node is not None]

    def down(self) -> list[str]:
        return [a for a, s in self.slots.items() if s.node is None]

    def node(self, address: str) -> Node | None:
        return self.slots[address].node

    def disk(self, address: str) -> Disk:
        return self.slots[address].backend

    def started_at(self, address: str) -> float:
        return self.slots[address].started_at

    def wipe(self, address: str) -> None:
        """The crashed node's data dir is gone (its disk too): the next start is on an empty
        data dir at the same address, as a real restart's (:meth:`start`)."""
        slot = self.slots[address]
        assert slot.node is None, "wipe a crashed node"
        slot.backend.wipe()
        slot.wipes += 1
        shutil.rmtree(slot.data_dir)
        os.makedirs(slot.data_dir)
        slot.empty = True
        self.network.note(f"wipe {address}: its data dir is empty")

    def _clock(self) -> Callable[[], float]:
        loop = asyncio.get_running_loop()
        if not self.skew:
            return loop.time
        offset = 1000.0 + self.skew_rng.uniform(-self.skew, self.skew)
        rate = 1.0 + self.skew_rng.uniform(-1e-3, 1e-3)
        return lambda: offset + rate * loop.time()

    async def start(self, address: str) -> None:
        """Start (or restart) the node at ``address`` over the data it kept."""
        slot = self.slots[address]
        if slot.node is not None or slot.starting:
            return
        slot.starting = True
        try:
            await self._start(slot, address)
        finally:
            slot.starting = False

    async def _start(self, slot: _Slot, address: str) -> None:
        loop = asyncio.get_running_loop()
        config = replace(
            self.config,
            data_dir=slot.data_dir,
            advertise=address,
            seeds=[a for a in self.slots if a != address],
        )
        adopt = None
        if slot.empty:  # wiped
            # as the daemon's start (node/server.start_node): it takes the place of the
            # member the ring knows at its address, else it is a new one (a fixed id here)
            asking = self.network.transport(address, timeout=5.0)
            try:
                adopt = await check_returning(config, asking)
            except ValueError as exc:  # the member never went down: a new one, as before
                self.network.note(f"start {address}: {exc}")
            finally:
                await asking.close()
            if adopt is None:
                _write_identity(slot.data_dir, f"{address.split(':')[0]}w{slot.wipes}")
            self.network.note(f"start {address} on its empty data dir: taking {adopt}")
        node = Node(
            config,
            clock=self._clock(),
            rng=random.Random(self.rng.getrandbits(64)),
            transport=self.network.transport(address, timeout=5.0),
            backend=slot.backend,
            writer=InlineExecutor(),
            adopt=adopt,
        )
        self.network.attach(address, self.app_factory(node), config.max_body)
        slot.node = node
        slot.empty = False
        slot.started_at = loop.time()
        self.network.note(f"start {address}")
        await node.start(7400, self.loops)

    async def crash(self, address: str) -> None:
        """Stop the node at once: requests it serves die unanswered, its loops stop, its
        storage stays (every write the node finished is durable, as with LMDB's fsync)."""
        slot = self.slots[address]
        if slot.node is None:
            return
        node, slot.node = slot.node, None
        self.network.note(f"crash {address}")
        await self.network.detach(address)
        await node.stop()
        for name in SCRUB_COUNTS:
            self.scrub[name] += node.stats.get(name, 0)

    async def start_all(self) -> None:
        for address in self.slots:
            await self.start(address)

    async def stop_all(self) -> None:
        for address in self.slots:
            await self.crash(address)
