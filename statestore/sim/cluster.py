"""A ring of real nodes in one process, on the in-memory network and simulated time.

Each node is the daemon's own ``Node`` with its own API (``node.api.build_app``) and its real
background loops (gossip, repair, compaction), given the simulation's clock (the loop's
simulated time), a seeded RNG, a ``MemoryTransport`` named by its address, an inline storage
writer and a ``MemoryBackend`` that outlives it: a crash drops the node and everything it was
doing, a restart builds a new ``Node`` over the same data (its id and incarnation come from its
data dir, as after a real restart).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from aiohttp import web

from statestore.net.memory import MemoryNetwork
from statestore.node.api import build_app
from statestore.node.backends import MemoryBackend
from statestore.node.config import NodeConfig
from statestore.node.daemon import Loop, Node
from statestore.node.server import LOOPS
from statestore.sim.clock import InlineExecutor

__all__ = ["SIM_CONFIG", "AppFactory", "Cluster"]

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
    dht=False,
    storage="memory://",
)


class _Slot:
    def __init__(self, address: str, data_dir: str) -> None:
        self.address = address
        self.data_dir = data_dir
        self.backend = MemoryBackend()
        self.node: Node | None = None


class Cluster:
    """``size`` nodes ``n0:7400``, ``n1:7400``, ... under ``data_root``.

    Args:
        app_factory: builds a node's application (a test passes a broken one).
        loops: the background loops each node runs besides gossip.
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
    ) -> None:
        self.network = network
        self.rng = rng
        self.config = config
        self.app_factory = app_factory
        self.loops = tuple(loops)
        self.slots: dict[str, _Slot] = {}
        for i in range(size):
            address = f"n{i}:7400"
            data_dir = os.path.join(data_root, f"n{i}")
            os.makedirs(data_dir)
            with open(os.path.join(data_dir, "node.json"), "w") as f:
                json.dump({"id": f"n{i}", "incarnation": 0}, f)  # the same ids every run
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

    async def start(self, address: str) -> None:
        """Start (or restart) the node at ``address`` over the data it kept."""
        slot = self.slots[address]
        if slot.node is not None:
            return
        loop = asyncio.get_running_loop()
        config = replace(
            self.config,
            data_dir=slot.data_dir,
            advertise=address,
            seeds=[a for a in self.slots if a != address],
        )
        node = Node(
            config,
            clock=loop.time,
            rng=random.Random(self.rng.getrandbits(64)),
            transport=self.network.transport(address, timeout=5.0),
            backend=slot.backend,
            writer=InlineExecutor(),
        )
        self.network.attach(address, self.app_factory(node), config.max_body)
        slot.node = node
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

    async def start_all(self) -> None:
        for address in self.slots:
            await self.start(address)

    async def stop_all(self) -> None:
        for address in self.slots:
            await self.crash(address)
