"""The compaction loop plans a store again only when its inputs change (node/compaction.py).

Real nodes (the daemon's ``Node`` with its own loops) on the in-memory network and simulated
time (statestore/testing): a store is committed past ``snapshot_every``, the leader folds it into
a snapshot, and then, with nothing new, no node decodes the store's manifests again; a new
commit makes its leader plan (and compact) it again.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

from client import AsyncRingClient, StoreId
from statestore.net.memory import MemoryNetwork
from statestore.testing.clock import run_simulated
from statestore.testing.cluster import SIM_CONFIG, Cluster

STORE = StoreId("compact", 0, 0)


def test_a_settled_store_is_not_planned_again(tmp_path: Path) -> None:
    async def main() -> tuple[Counter[str], Counter[str], list[int]]:
        network = MemoryNetwork(random.Random(1))
        cluster = Cluster(network, 3, random.Random(2), str(tmp_path))
        await cluster.start_all()
        await asyncio.sleep(SIM_CONFIG.down_after)
        planned: Counter[str] = Counter()
        for address in cluster.addresses:
            node = cluster.node(address)
            assert node is not None
            real = node.store.manifests

            def counted(store: StoreId, real=real, address=address):  # type: ignore[no-untyped-def]
                if store == STORE:
                    planned[address] += 1
                return real(store)

            node.store.manifests = counted  # type: ignore[method-assign]
        client = AsyncRingClient(
            cluster.addresses,
            chunk_size=256,
            key_groups=8,
            transport=network.transport("w1", timeout=5.0),
            clock=asyncio.get_running_loop().time,
        )
        await client.connect()
        try:
            for v in range(1, 5):  # snapshot_every 3: version 4 gets folded
                await client.commit(STORE, v, {f"k{v}".encode(): b"v"}, [], {"v": v})
            await asyncio.sleep(10 * SIM_CONFIG.compact_interval)
            settled = planned.copy()
            await asyncio.sleep(10 * SIM_CONFIG.compact_interval)
            quiet = planned - settled
            await client.commit(STORE, 5, {b"k5": b"v"}, [], {"v": 5})
            await asyncio.sleep(3 * SIM_CONFIG.compact_interval)
            again = planned - settled
            snapshots = [n.stats["snapshots"] for n in map(cluster.node, cluster.addresses) if n]
            state = await client.restore(STORE, 5)
            assert dict(state) == {f"k{v}".encode(): b"v" for v in range(1, 6)}
            return quiet, again, snapshots
        finally:
            await client.close()
            await cluster.stop_all()

    quiet, again, snapshots = run_simulated(main)
    assert not quiet  # ten intervals with nothing new: nobody decoded the store
    assert sum(again.values()) >= 1  # a new version: its leader planned it again
    assert sum(snapshots) >= 1, "the leader folded the chain into a snapshot"
