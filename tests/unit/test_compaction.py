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
from dataclasses import replace
from pathlib import Path

from client import AsyncRingClient, StoreId
from statestore.core.ids import parse_chunk_key
from statestore.net.memory import MemoryNetwork
from statestore.node.config import NodeConfig
from statestore.node.daemon import Node
from statestore.node.replica import Prefix, _skey
from statestore.testing.clock import run_simulated
from statestore.testing.cluster import SIM_CONFIG, Cluster

STORE = StoreId("compact", 0, 0)


async def _client(cluster: Cluster, network: MemoryNetwork, chunk_size: int) -> AsyncRingClient:
    client = AsyncRingClient(
        cluster.addresses,
        chunk_size=chunk_size,
        key_groups=8,
        transport=network.transport("w1", timeout=5.0),
        clock=asyncio.get_running_loop().time,
    )
    await client.connect()
    return client


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
        client = await _client(cluster, network, 256)
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


def test_light_deltas_stay_layers_until_they_weigh_rebase_at(tmp_path: Path) -> None:
    """--rebase-at (core/retention.needs_snapshot) on real nodes: a big first version and
    light deltas past snapshot_every (3 here) get no new base; a heavy delta that brings the
    deltas to half the base does; every version restores exactly throughout."""
    store = StoreId("rebase", 0, 0)

    async def main() -> tuple[int, int, list[bool]]:
        network = MemoryNetwork(random.Random(3))
        config = replace(SIM_CONFIG, rebase_at=0.5)
        cluster = Cluster(network, 3, random.Random(4), str(tmp_path), config=config)
        await cluster.start_all()
        await asyncio.sleep(SIM_CONFIG.down_after)
        nodes = [n for n in map(cluster.node, cluster.addresses) if n]
        client = await _client(cluster, network, 4096)
        rng = random.Random(5)
        states: dict[int, dict[bytes, bytes]] = {}
        state: dict[bytes, bytes] = {}
        try:
            keys = [f"key-{i:05d}".encode() for i in range(2000)]
            for v in range(1, 13):  # v1: every key; then 1% a version
                puts = {k: rng.randbytes(24) for k in (keys if v == 1 else rng.sample(keys, 20))}
                await client.commit(store, v, puts, [], {"v": v})
                state.update(puts)
                states[v] = dict(state)
            await asyncio.sleep(10 * SIM_CONFIG.compact_interval)
            light = sum(n.stats["snapshots"] for n in nodes)
            puts = {k: rng.randbytes(24) for k in keys[:1200]}  # 60% of the keys: heavy
            await client.commit(store, 13, puts, [], {"v": 13})
            state.update(puts)
            states[13] = dict(state)
            await asyncio.sleep(10 * SIM_CONFIG.compact_interval)
            heavy = sum(n.stats["snapshots"] for n in nodes)
            exact = [dict(await client.restore(store, v)) == states[v] for v in states]
            return light, heavy, exact
        finally:
            await client.close()
            await cluster.stop_all()

    light, heavy, exact = run_simulated(main)
    assert light == 0, "11 deltas of 1% are layers over the base, not worth a new one"
    assert heavy >= 1, "deltas weighing half the base: a new base"
    assert all(exact)


def _held(node: Node | None, store: StoreId) -> tuple[list[int], set[int]]:
    """The versions a node holds a snapshot manifest of, and those it holds snapshot chunks
    of (chunk names start with their kind)."""
    assert node is not None
    chunks = set()
    for key in node.store.chunk_keys():
        of, v, name = parse_chunk_key(key)
        if of == store and name.startswith("s"):
            chunks.add(v)
    return node.store.snapshot_versions(store), chunks


async def _thinning_ring(
    tmp_path: Path, config: NodeConfig, nodes: int = 3
) -> tuple[Cluster, AsyncRingClient]:
    """``nodes`` nodes at ``config`` on a seeded in-memory network, and a client of theirs."""
    network = MemoryNetwork(random.Random(6))
    cluster = Cluster(network, nodes, random.Random(7), str(tmp_path), config=config)
    await cluster.start_all()
    await asyncio.sleep(SIM_CONFIG.down_after)
    return cluster, await _client(cluster, network, 256)


def test_thinning_drops_the_bases_between_rungs_on_every_node(tmp_path: Path) -> None:
    """--thin-snapshots on real nodes (core/retention.Thinning): a store committed version
    by version, one node down for a stretch of it. Every node ends up holding, above the
    floor, only the newest snapshot and those at multiples of N, manifests and chunks
    alike (the node that was down too: repair brings it the line and brings nothing back);
    every retained version restores exactly."""
    store = StoreId("thin", 0, 0)
    n = 4

    async def main() -> tuple[dict[str, tuple[list[int], set[int]]], int, int, list[bool]]:
        config = replace(SIM_CONFIG, thin_snapshots=n, retain_versions=12, snapshot_every=2)
        cluster, client = await _thinning_ring(tmp_path, config)
        rng = random.Random(8)
        states: dict[int, dict[bytes, bytes]] = {}
        state: dict[bytes, bytes] = {}
        away = cluster.addresses[2]
        try:
            for v in range(1, 41):
                if v == 12:
                    await cluster.crash(away)
                if v == 28:
                    await cluster.start(away)
                puts = {f"k{rng.randrange(30)}".encode(): rng.randbytes(8) for _ in range(3)}
                await client.commit(store, v, puts, [], {"v": v})
                state.update(puts)
                states[v] = dict(state)
                await asyncio.sleep(SIM_CONFIG.compact_interval)
            # the chunks' step waits 10 passes after a line (node/compaction.py)
            await asyncio.sleep(70 * SIM_CONFIG.compact_interval)
            held = {a: _held(cluster.node(a), store) for a in cluster.addresses}
            some = cluster.node(cluster.addresses[0])
            assert some is not None
            floor, line = some.store.floor(store), some.store.thinning(store).below
            exact = [dict(await client.restore(store, v)) == states[v] for v in range(29, 41)]
            return held, floor, line, exact
        finally:
            await client.close()
            await cluster.stop_all()

    held, floor, line, exact = run_simulated(main)
    assert all(exact)
    assert floor >= 40 - 12 - 2 * n, floor
    assert line > floor, (floor, line)
    for address, (manifests, chunks) in held.items():
        above = [v for v in manifests if v > floor]
        thinned = [v for v in above if v < line and v % n]
        assert not thinned, (address, manifests, floor, line)
        assert len(above) <= 1 + (40 - floor) // n, (address, manifests)
        # off the rungs, only the newest snapshot (which may be a rung itself)
        assert [v for v in above if v % n] in ([], above[-1:]), (address, manifests)
        assert not {v for v in chunks if floor < v < line and v % n}, (address, chunks)


class _Versions:
    """Versions of a store committed one a compaction pass (3 of 30 keys each, seeded), and
    the state of each, to restore against."""

    def __init__(self, client: AsyncRingClient, store: StoreId) -> None:
        self.client, self.store = client, store
        self.rng = random.Random(8)
        self.states: dict[int, dict[bytes, bytes]] = {}
        self.state: dict[bytes, bytes] = {}

    async def commit(self, versions: range, *, paced: bool = True) -> None:
        for v in versions:
            puts = {f"k{self.rng.randrange(30)}".encode(): self.rng.randbytes(8) for _ in range(3)}
            await self.client.commit(self.store, v, puts, [], {"v": v})
            self.state.update(puts)
            self.states[v] = dict(self.state)
            if paced:  # a compaction pass after each
                await asyncio.sleep(SIM_CONFIG.compact_interval)

    async def exact(self, versions: range) -> list[bool]:
        return [dict(await self.client.restore(self.store, v)) == self.states[v] for v in versions]


# rungs every 4 versions, 12 retained: after 42 versions the floor is 28 and the line above
# 39; 8 versions more move the retention line to 39, whose rung is 36
_THINNED = replace(SIM_CONFIG, thin_snapshots=4, retain_versions=12, snapshot_every=2)


def test_a_ring_restarted_with_thinning_off_folds_where_its_line_keeps(tmp_path: Path) -> None:
    """A thinned ring restarted at ``--thin-snapshots 0`` (the advice while a member reads no
    chunk format 3) keeps its line: every node refuses a snapshot the line drops. Its
    leader folds only where the line keeps one, so the floor climbs by the line's rungs, no
    fold is refused, no new line is drawn, and every retained version restores exactly. The
    build before planned as if no line were held: it folded at the retention line, every
    node refused it every pass, and the floor stopped (a hostile review ran it)."""
    store = StoreId("thin", 0, 0)

    async def main() -> tuple[list[int], list[int], list[int], int, list[bool]]:
        cluster, client = await _thinning_ring(tmp_path, _THINNED)
        w = _Versions(client, store)
        try:
            await w.commit(range(1, 43))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            line = [cluster.node(a).store.thinning(store).below for a in cluster.addresses]
            await cluster.stop_all()
            cluster.config = replace(_THINNED, thin_snapshots=0)
            await cluster.start_all()
            await asyncio.sleep(SIM_CONFIG.down_after)
            await w.commit(range(43, 51))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            nodes = [cluster.node(a) for a in cluster.addresses]
            floors = [n.store.floor(store) for n in nodes]
            after = [n.store.thinning(store).below for n in nodes]
            failed = sum(n.stats["compaction_failed"] for n in nodes)
            return floors, line, after, failed, await w.exact(range(39, 51))
        finally:
            await client.close()
            await cluster.stop_all()

    floors, line, after, failed, exact = run_simulated(main)
    assert all(exact)
    assert after == line, (line, after)  # no line drawn with thinning off
    assert min(line) > 39, line  # the retention line (39) is below the line
    assert floors == [36, 36, 36], floors  # the rung under it; the build before stayed at 28
    assert failed == 0


def _rot_line(node: Node, store: StoreId) -> bool:
    """Flip the store's thinning line record on ``node``'s disk; whether it reads as lost."""
    key = _skey(Prefix.THINNING, store)
    node.store.backend.write({key: b"rot" + (node.store.backend.get(key) or b"")})
    return node.store.thinning_lost(store)


def test_a_leader_whose_line_rotted_folds_below_its_head_only_once_repair_gives_it_back(
    tmp_path: Path,
) -> None:
    """The store's leader finds its thinning line rotted on disk (it refuses every snapshot
    below the head meanwhile, and knows no spacing): it folds only its head and draws no line
    until repair gives it the line back from a peer; then the floor climbs by the line's
    rungs, no fold refused, and every retained version restores exactly. The build before
    planned a fold at the retention line (refused), and repair, whose passes list no item of
    a store whose ranges agree, never gave the line back."""
    store = StoreId("thin", 0, 0)

    async def main() -> tuple[list[int], int, bool, list[bool]]:
        cluster, client = await _thinning_ring(tmp_path, _THINNED)
        w = _Versions(client, store)
        try:
            await w.commit(range(1, 43))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            nodes = [cluster.node(a) for a in cluster.addresses]
            leader = next(n for n in nodes if n.view().store_replicas(store)[0] == n.address)
            lost = _rot_line(leader, store)
            await w.commit(range(43, 51))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            floors = [n.store.floor(store) for n in nodes]
            failed = sum(n.stats["compaction_failed"] for n in nodes)
            back = not leader.store.thinning_lost(store)
            return floors, failed, lost and back, await w.exact(range(39, 51))
        finally:
            await client.close()
            await cluster.stop_all()

    floors, failed, lost_then_back, exact = run_simulated(main)
    assert lost_then_back and all(exact)
    assert floors == [36, 36, 36], floors
    assert failed == 0


def test_a_sole_owner_whose_line_rotted_goes_on_compacting(tmp_path: Path) -> None:
    """A store on one node (R=1) whose line rotted: no peer can give the line back, and the
    node goes on folding its head and raising its floor to the snapshots it holds, no fold
    refused, every retained version restored exactly. A draft of this build folded nothing
    while the line was lost: the floor stayed at 28 for good (a hostile review ran it)."""
    store = StoreId("thin", 0, 0)
    config = replace(_THINNED, replicas=1, write_quorum=1)

    async def main() -> tuple[int, bool, int, list[bool]]:
        cluster, client = await _thinning_ring(tmp_path, config, nodes=1)
        w = _Versions(client, store)
        try:
            await w.commit(range(1, 43))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            node = cluster.node(cluster.addresses[0])
            assert _rot_line(node, store)
            await w.commit(range(43, 71))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            return (
                node.store.floor(store),
                node.store.thinning_lost(store),
                node.stats["compaction_failed"],
                await w.exact(range(59, 71)),
            )
        finally:
            await client.close()
            await cluster.stop_all()

    floor, lost, failed, exact = run_simulated(main)
    assert lost and all(exact)
    assert floor == 58, floor  # the newest snapshot at or below the retention line, 59
    assert failed == 0


def test_a_fold_no_replica_takes_holds_back_no_gc(tmp_path: Path) -> None:
    """Every replica read-only (a full disk) right after a commit the leader will fold: the
    fold fails every pass, but the line's second step, waiting for its grace, still runs:
    the chunks of the snapshots the line dropped go on every node (on a full disk, that is
    room given back). The build before ended the pass at the failed fold, every pass, and
    the chunks stayed (a hostile review found it by reading)."""
    store = StoreId("thin", 0, 0)

    async def main() -> tuple[dict[str, tuple[list[int], set[int]]], int, int, int]:
        cluster, client = await _thinning_ring(tmp_path, _THINNED)
        w = _Versions(client, store)
        try:
            await w.commit(range(1, 42))
            await w.commit(range(42, 43), paced=False)  # worth a fold: 2 deltas on 40
            nodes = [cluster.node(a) for a in cluster.addresses]
            for n in nodes:
                n.read_only_reason = lambda: "disk nearly full (the test)"  # type: ignore[method-assign]
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            held = {n.address: _held(n, store) for n in nodes}
            some = nodes[0].store
            failed = sum(n.stats["compaction_failed"] for n in nodes)
            return held, some.floor(store), some.thinning(store).below, failed
        finally:
            await client.close()
            await cluster.stop_all()

    held, floor, line, failed = run_simulated(main)
    assert failed > 0  # the fold of 42 was refused, pass after pass
    assert line > 38 > floor, (floor, line)
    for address, (manifests, chunks) in held.items():
        assert 42 not in manifests, (address, manifests)
        assert not {v for v in chunks if floor < v < line and v % 4}, (address, chunks)


def test_the_floor_climbs_under_a_new_writer_every_few_versions(tmp_path: Path) -> None:
    """Thinning's rungs are folded below the head (core/retention.py), so a rung under the
    version a new writer took over at carries the older epoch: it is taken by the head's
    lineage (node/replica.py ``_fence_head``), not refused by the head's epoch. With a new
    writer every 10 versions, the floor keeps up with retention, every retained version
    restores exactly, and an idle store settles: no snapshot folded again and again."""
    store = StoreId("epochs", 0, 0)
    n, retain, every = 4, 12, 3

    async def main() -> tuple[list[tuple[int, int]], list[bool], int]:
        config = replace(SIM_CONFIG, thin_snapshots=n, retain_versions=retain, snapshot_every=every)
        cluster, client = await _thinning_ring(tmp_path, config)
        rng = random.Random(8)
        states: dict[int, dict[bytes, bytes]] = {}
        state: dict[bytes, bytes] = {}
        floors: list[tuple[int, int]] = []
        nodes = [cluster.node(a) for a in cluster.addresses]
        try:
            epoch = 1
            for v in range(1, 113):
                if v % 10 == 1 and v > 1:  # a new writer restores v - 1 and goes on
                    epoch += 1
                    await client.restore(store, v - 1)
                puts = {f"k{rng.randrange(30)}".encode(): rng.randbytes(8) for _ in range(3)}
                await client.commit(store, v, puts, [], {"v": v}, epoch=epoch)
                state.update(puts)
                states[v] = dict(state)
                if v % 7 == 0:  # commits in bursts: compaction does not see every head
                    await asyncio.sleep(SIM_CONFIG.compact_interval)
                    floors.append((v, min(nd.store.floor(store) for nd in nodes if nd)))
            await asyncio.sleep(20 * SIM_CONFIG.compact_interval)
            folded = sum(nd.stats["snapshots"] for nd in nodes if nd)
            await asyncio.sleep(30 * SIM_CONFIG.compact_interval)
            idle = sum(nd.stats["snapshots"] for nd in nodes if nd) - folded
            floors.append((112, min(nd.store.floor(store) for nd in nodes if nd)))
            exact = [
                dict(await client.restore(store, v)) == states[v]
                for v in range(112 - retain + 1, 113)
            ]
            return floors, exact, idle
        finally:
            await client.close()
            await cluster.stop_all()

    floors, exact, idle = run_simulated(main)
    assert all(exact)
    assert idle == 0, idle
    for head, floor in floors[3:]:
        # the floor lags the retention line by less than a rung and a burst of commits
        assert head - floor <= retain + n + every + 7, floors


def test_a_version_committed_whole_is_never_thinned(tmp_path: Path) -> None:
    """A writer that commits a version whole (a snapshot with no delta: Spark's provider after
    a reload from empty) leaves that snapshot as its version's only state: thinning keeps it
    (core/retention.py) until the floor passes it, on every node, and every retained version
    restores exactly. With one newest base kept and no such rule it went, and version 6 with
    every version above it (CI's Spark change-feed test found it)."""
    store = StoreId("whole", 0, 0)

    async def main() -> tuple[list[bool], list[list[int]]]:
        config = replace(SIM_CONFIG, thin_snapshots=4, retain_versions=40, snapshot_every=2)
        cluster, client = await _thinning_ring(tmp_path, config)
        rng = random.Random(8)
        states: dict[int, dict[bytes, bytes]] = {}
        state: dict[bytes, bytes] = {}
        try:
            for v in range(1, 31):
                puts = {f"k{rng.randrange(30)}".encode(): rng.randbytes(8) for _ in range(3)}
                if v == 6:  # the writer's whole state, not a delta
                    state = dict(puts)
                    await client.commit(store, v, puts, [], {"v": v}, snapshot=True)
                else:
                    state.update(puts)
                    await client.commit(store, v, puts, [], {"v": v})
                states[v] = dict(state)
                await asyncio.sleep(SIM_CONFIG.compact_interval)
            await asyncio.sleep(30 * SIM_CONFIG.compact_interval)
            held = [
                node.store.snapshot_versions(store)
                for a in cluster.addresses
                if (node := cluster.node(a)) is not None
            ]
            exact = [dict(await client.restore(store, v)) == states[v] for v in range(6, 31)]
            return exact, held
        finally:
            await client.close()
            await cluster.stop_all()

    exact, held = run_simulated(main)
    assert all(exact), exact
    assert all(6 in versions for versions in held), held
