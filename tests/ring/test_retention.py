"""Retention set by the writer: a commit may carry ``retain=N`` (Spark's minBatchesToRetain),
and the store's replicas keep its last N versions instead of the node's ``--retain``.

Real node processes: one store committed with ``retain=3`` loses its old versions to
compaction while a store committed without it keeps all of them; a bad ``retain`` is refused
and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from client import AsyncRingClient, RingClient, StoreId, VersionNotFound
from statestore.cli.local import http_json
from statestore.node.daemon import Node
from statestore.node.repair import repair_pass
from tests.ringkit import FAST, Restartable, commit_row, eventually, local_ring, nodes, sees


def test_a_writer_sets_how_many_versions_its_store_keeps(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, [*FAST, "--snapshot-every", "2"]) as ring:
        short, long = StoreId("ret", 0, 0, "short"), StoreId("ret", 0, 0, "long")
        seed = ring.seeds[0]
        assert commit_row(seed, short, 1, "&retain=0") == 400  # refused: nothing written
        assert commit_row(seed, short, 1, "&retain=x") == 400
        for v in range(1, 13):
            assert commit_row(seed, short, v, "&retain=3") == 201
            assert commit_row(seed, long, v) == 201
        with RingClient(ring.seeds) as client:
            deadline = time.monotonic() + 60
            while client.versions(short)[0] < 10 - 2 and time.monotonic() < deadline:
                time.sleep(0.3)
            kept = client.versions(short)
            assert kept[0] >= 8 and kept[-1] == 12, kept  # the last 3, from a snapshot below
            assert client.versions(long) == list(range(1, 13))  # the node's default: 100
            state = client.restore(short, 10)
            assert dict(state) == {f"k{v}".encode(): b"v" for v in range(1, 11)}
            with pytest.raises(VersionNotFound):
                client.restore(short, 2)


def _snapshots(address: str, store: StoreId) -> tuple[list[int], set[int], dict[str, int], int]:
    """A node's snapshot manifests, the versions it holds snapshot chunks of, its thinning
    lines and its floor (``GET /v1/inventory/<store>``, this node only)."""
    obj = http_json(address, f"/v1/inventory/{store.path}")
    assert isinstance(obj, dict)
    snaps = sorted({m["version"] for m in obj["manifests"] if m["kind"] == "snapshot"})
    chunks = {int(k.split("/")[4]) for k in obj["chunks"] if k.split("/")[5].startswith("s")}
    return snaps, chunks, obj["thinning"], obj["floor"]


def test_thinning_on_node_processes_with_one_killed_and_restarted(tmp_path: Path) -> None:
    """--thin-snapshots on node processes (core/retention.Thinning): a store committed a
    version at a time, one node SIGKILLed for a stretch and restarted on its data dir. Every
    node ends up holding, above the floor, only the newest snapshot and the rungs
    (multiples of 4), manifests and chunks alike: the restarted node drops what it missed,
    and nothing comes back; every retained version restores exactly."""
    n, retain = 4, 12
    args = [*FAST, "--snapshot-every", "2", "--thin-snapshots", str(n), "--retain", str(retain)]
    store = StoreId("thin", 0, 0, "s")
    with local_ring(tmp_path, 3, args) as ring, RingClient(ring.seeds, timeout=30) as client:
        states: dict[int, dict[bytes, bytes]] = {}
        state: dict[bytes, bytes] = {}
        for v in range(1, 41):
            if v == 12:
                ring.kill(2)
            if v == 26:
                ring.restart(2)
            puts = {f"k{(v * 7) % 23}".encode(): f"v{v}".encode(), f"n{v}".encode(): b"x"}
            client.commit(store, v, puts, [], epoch=1)
            state.update(puts)
            states[v] = dict(state)
            time.sleep(0.25)

        def settled() -> bool:
            # above the floor, only rungs and the newest snapshot, manifests and chunks
            for address in ring.seeds:
                snaps, chunks, line, floor = _snapshots(address, store)
                above = [s for s in snaps if s > floor]
                if not line["every"] or line["chunks"] < line["below"]:
                    return False
                if [s for s in above[:-1] if s % n]:
                    return False
                if {c for c in chunks if floor < c < max(above, default=0) and c % n}:
                    return False
            return True

        # the chunks' step waits 10 compaction passes (20 s) after a line: node/compaction.py
        eventually(settled, "every node thinned its snapshots", limit=180, every=1.0)
        for address in ring.seeds:
            snaps, _, _, floor = _snapshots(address, store)
            assert floor >= 40 - retain - 2 * n, (address, floor)
            assert len([s for s in snaps if s > floor]) <= 1 + (40 - floor) // n, snaps
        for v in range(40 - retain + 1, 41):
            assert dict(client.restore(store, v)) == states[v], v


async def test_a_node_holding_manifests_it_does_not_own_takes_the_whole_line(
    tmp_path: Path,
) -> None:
    """A node holding a snapshot's manifest of a store it does not own (what a stand-in or a
    former owner keeps: the owners refuse it once thinned, so repair never drops it) takes
    the whole thinning line and drops it, and the chunks' step waits for every live node:
    no node is left naming a snapshot whose chunks are gone, to name it to readers again once
    it owns the store (a node removed, a token moved)."""
    store = StoreId("thin", 0, 1, "s")
    kw = {"thin_snapshots": 4, "snapshot_every": 2, "compact_interval": 0.2}
    async with (
        nodes(tmp_path, 3, **kw) as live,
        AsyncRingClient([live[0].address], timeout=30) as client,
    ):
        owners = [n for n in live if n.address in live[0].view().store_replicas(store)]
        outsider = next(n for n in live if n not in owners)
        done = 0

        async def commit_to(top: int) -> None:
            nonlocal done
            while done < top:
                done += 1
                await client.commit(store, done, {f"k{done}".encode(): b"x" * 100}, [], {}, epoch=1)
                await asyncio.sleep(0.1)

        def off_rung() -> list[int]:
            return [v for v in owners[0].store.snapshot_versions(store) if v % 4]

        await commit_to(3)
        while True:  # a snapshot that is no rung (rungs every 4), copied before it is thinned
            await commit_to(done + 1)
            assert done < 60, owners[0].store.snapshot_versions(store)
            if not off_rung():
                continue
            held = owners[0].store.get_manifest(store, off_rung()[-1], "snapshot")
            assert held is not None
            if await outsider.write(outsider.store.copy_manifest, held):  # a stand-in's copy
                break
        assert outsider.store.snapshot_versions(store) == [held.version]
        await commit_to(done + 16)

        def gone() -> bool:  # the owners dropped its manifests and its chunks
            return all(n.store.thinning(store).chunks > held.version for n in owners)

        await eventually(gone, "the owners dropped the snapshot's chunks", limit=60)
        assert held.version not in outsider.store.snapshot_versions(store)
        assert outsider.store.thinning(store).below > held.version


@pytest.mark.parametrize("whole_at", [1, 4])
async def test_a_store_with_a_version_committed_whole_thins_above_it(
    tmp_path: Path, whole_at: int
) -> None:
    """A version committed whole (``snapshot=True``: no delta of it, so no line may drop it;
    the first version of a store, or version 4 of one whose versions 1-3 are deltas) and
    deltas above it, snapshots folded at every one: the nodes keep the whole version, the
    newest snapshot and nothing between them, long before the floor passes the whole
    version, and every version restores. The builds before kept every snapshot folded above
    it, a full copy each, until the floor passed it (~110 versions at the defaults): the
    line stopped below it."""
    store = StoreId("thin", 0, 2, "whole")
    kw = {"snapshot_every": 1, "compact_interval": 0.2, "replicas": 2, "write_quorum": 2}
    async with (
        nodes(tmp_path, 2, **kw) as live,
        AsyncRingClient([live[0].address], timeout=30) as client,
    ):
        state: dict[bytes, bytes] = {}
        expected = {}
        for v in range(1, whole_at + 8):
            if v == whole_at:
                state = {f"k{i}".encode(): f"w{v}".encode() for i in range(200)}
                await client.commit(store, v, state, [], {}, epoch=1, snapshot=True)
            else:
                puts = {f"k{i}".encode(): f"v{v}".encode() for i in range(v, 200, 7)}
                await client.commit(store, v, puts, [], {}, epoch=1)
                state.update(puts)
            expected[v] = dict(state)
            await asyncio.sleep(0.3)  # a compaction pass or so: a snapshot folded at v
        top = whole_at + 7

        def thinned() -> bool:
            for n in live:
                held = n.store.snapshot_versions(store)
                if whole_at not in held or [v for v in held if v > whole_at] != [top]:
                    return False
            return True

        await eventually(thinned, f"the snapshots between {whole_at} and {top} dropped", limit=30)
        for v, want in expected.items():
            assert dict(await client.restore(store, v)) == want, v


async def test_a_whole_commit_taken_by_nodes_that_missed_the_line_survives_it(
    tmp_path: Path,
) -> None:
    """The known gap of the build before (docs/operations.md, "Thinning"). Three nodes
    (R=3, W=1); two stop, and the third (the store's compactor) goes on alone: its line
    drops the snapshot of version 5. It stops; the two come back and a newer writer, gone
    back to version 4, commits version 5 whole and 6-7 on it: taken by the two nodes that
    missed the line, acknowledged. The third comes back; repair brings the two its line and
    its newer snapshots. Version 5's snapshot is whole (its chunks are named ``w``): no line
    drops it, manifest or chunks, the third node takes a copy from repair, and versions 5-7
    restore exactly. The build before dropped it on both (it could not tell it from a
    folded snapshot whose delta it lacked): versions 5-7 were lost."""
    store = StoreId("thin", 0, 3, "rewind")
    kw = {
        "thin_snapshots": 4,
        "snapshot_every": 2,
        "write_quorum": 1,
    }
    ring = Restartable(tmp_path, **kw)

    try:
        await ring.start_all()
        lname = ring.leader(store)
        lead = ring[lname]
        others = [k for k in "abc" if k != lname]
        state: dict[bytes, bytes] = {}
        async with AsyncRingClient([lead.address], timeout=30) as old:
            for v in range(1, 15):
                if v == 5:
                    for k in others:
                        await ring.stop(k)
                    await eventually(lambda: sees(lead, 1), "the others down")
                state[f"k{v % 5}".encode()] = f"v{v}".encode()
                await old.commit(store, v, dict(state), [], {}, epoch=1)
                await asyncio.sleep(0.3)  # a compaction pass: a snapshot folded every 2

            def dropped() -> bool:
                return lead.store.thinning(store).below > 8 and lead.store.thinned(store, 5)

            await eventually(dropped, "the compactor's line passed version 5")
        await ring.stop(lname)
        for k in others:
            await ring.start(k, ring.address(others[0]) if k != others[0] else None)
        missed = [ring[k] for k in others]
        await eventually(lambda: all(sees(n, 2) for n in missed), "the two see each other")
        assert all(n.store.thinning(store).below <= 5 for n in missed)
        whole = {b"k0": b"w5", b"k1": b"w5"}
        want = {5: whole, 6: {**whole, b"k6": b"x"}, 7: {**whole, b"k6": b"x", b"k7": b"y"}}
        async with AsyncRingClient([n.address for n in missed], timeout=30) as new:
            await new.commit(store, 5, whole, [], {}, epoch=2, snapshot=True)
            await new.commit(store, 6, {b"k6": b"x"}, [], {}, epoch=2)
            await new.commit(store, 7, {b"k7": b"y"}, [], {}, epoch=2)
            await ring.start(lname, missed[0].address)
            live = ring.live()
            await eventually(lambda: all(sees(n, 3) for n in live), "3 nodes again")

            def line_taken() -> bool:
                lines = [n.store.thinning(store) for n in live]
                took = all(n.store.thinning(store).below > 8 for n in missed)
                return took and all(t.chunks == t.below for t in lines)

            await eventually(line_taken, "the two took the line, chunks too", limit=60)
            for n in missed:
                assert 5 in n.store.snapshot_versions(store), n.address
            await eventually(
                lambda: 5 in ring[lname].store.snapshot_versions(store),
                "the third got a copy",
            )
            for v, expect in want.items():
                assert dict(await new.restore(store, v)) == expect, v
    finally:
        await ring.close()


async def _committed_with_retain(live: list[Node], store: StoreId, retain: int) -> None:
    """Versions 1 and 2 of ``store`` committed with ``retain=N`` through the first node."""
    for v in (1, 2):
        query = f"&retain={retain}"
        assert await asyncio.to_thread(commit_row, live[0].address, store, v, query) == 201


async def test_a_replica_that_missed_the_writers_commits_takes_its_retain_from_repair(
    tmp_path: Path,
) -> None:
    """A writer's ``retain=N`` reaches the replicas that take its commits. One that missed
    them (down meanwhile: here its copy of the store is wiped; not the store's compaction
    leader, which asks on its own) takes the manifests and the ``retain`` from the others'
    repair pass (``/v1/sync/have`` carries the asker's), so as the store's compactor it
    would keep what the writer asked. The build before brought the manifests back and no
    ``retain``: that replica's compactor would keep ``--retain`` (100 here)."""
    store = StoreId("ret-repair", 0, 0, "s")
    async with nodes(tmp_path, 3, replicas=3, write_quorum=2, repair_interval=3600.0) as live:
        await _committed_with_retain(live, store, 400)
        lagging = next(n for n in live if n.view().store_replicas(store)[0] != n.address)
        assert lagging.store.retain(store) == 400
        held = lagging.store.query_keys(store.query)
        lagging.store.backend.write({}, [k for keys in held.values() for k in keys])
        assert lagging.store.retain(store) is None and lagging.store.head(store) is None
        for n in live:
            if n is not lagging:
                await repair_pass(n, n.view(), allow_handoff=True)
        assert lagging.store.versions(store) == [1, 2]
        assert lagging.store.retain(store) == 400


async def test_a_leader_with_no_retain_asks_the_other_owners_for_it(tmp_path: Path) -> None:
    """The store's compaction leader holds its manifests but no writer-set ``retain`` (it
    joined after the writer's commits: a join's pulls do not carry it). Its compaction loop
    asks the other owners (``sync/have``'s answer carries theirs) and takes it, before it
    would fold and raise the floor by ``--retain`` (100 here). The build before never did."""
    store = StoreId("ret-leader", 0, 0, "s")
    async with nodes(tmp_path, 3, replicas=3, write_quorum=2, repair_interval=3600.0) as live:
        await _committed_with_retain(live, store, 400)
        leader = next(n for n in live if n.view().store_replicas(store)[0] == n.address)
        leader.store.backend.write({}, leader.store.query_keys(store.query)["retention"])
        assert leader.store.retain(store) is None
        await eventually(lambda: leader.store.retain(store) == 400, "the leader took the retain")
