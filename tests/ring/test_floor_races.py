"""Retention floors against newer writers and stale compactors (hostile review 69): a floor
never drops what an acknowledged version needs, whichever lands first.

- A newer writer that restored the version just below a floor before the floor rose, then
  commits on it: its delta at the floor is refused (its base is gone), where the builds
  before acknowledged it and could never restore it.
- A floor checked, then a newer writer's delta at it landing before the floor's write: the
  floor is checked again on the writer thread and refused there (the builds before dropped
  the acknowledged delta's base).
- A compactor with a stale, lower ``retain`` (it missed the writer's raise while down): the
  replicas that hold the writer's value refuse its floor, and it takes none of it itself
  (the builds before dropped, on every replica, versions the writer keeps; then its own
  copies of them).
- Nodes holding only a store's chunks take only a floor its live home replicas took
  (hostile reviews 70 and 71), and no chunk copy below a floor is taken back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import statestore.node.api as api
from client import AsyncRingClient, StoreId
from statestore.core.chunk import encode_chunks
from statestore.core.errors import InvalidRequest, QuorumNotReached
from statestore.core.ids import chunk_key
from statestore.core.items import Prefix
from statestore.node.daemon import Node
from statestore.node.repair import ask_have
from statestore.node.replica import _skey
from tests.ringkit import Restartable, call, commit_row, eventually, nodes, sees

# the floor is the whole snapshot the old writer commits at 6 (the compactor folds nothing)
RING = {
    "replicas": 3,
    "write_quorum": 2,
    "thin_snapshots": 0,
    "snapshot_every": 100,
    "retain_versions": 3,
    "compact_interval": 0.2,
}


async def _old_history(old: AsyncRingClient, store: StoreId) -> dict[bytes, bytes]:
    """Epoch 1's v1-v5 (deltas), v6 (whole), v7: the state at 5."""
    state: dict[bytes, bytes] = {}
    for v in range(1, 6):
        state[f"k{v}".encode()] = f"a{v}".encode()
        await old.commit(store, v, {f"k{v}".encode(): f"a{v}".encode()}, [], {}, epoch=1)
    at5 = dict(state)
    await old.commit(store, 6, {**state, b"k6": b"a6"}, [], {}, epoch=1, snapshot=True)
    await old.commit(store, 7, {b"k7": b"a7"}, [], {}, epoch=1)
    return at5


async def test_a_newer_writers_delta_at_the_floor_is_refused_not_acknowledged(
    tmp_path: Path,
) -> None:
    store = StoreId("rew", 0, 0, "floor")
    async with nodes(tmp_path, 3, **RING) as ring:
        addrs = [n.address for n in ring]
        async with (
            AsyncRingClient(addrs, timeout=30) as old,
            AsyncRingClient(addrs, timeout=30) as new,
        ):
            at5 = await _old_history(old, store)
            assert dict(await new.restore(store, 5)) == at5  # retained: head 7, retain 3
            # the old writer's last commit (a zombie's): the floor rises to 6 everywhere
            await old.commit(store, 8, {b"k8": b"a8"}, [], {}, epoch=1)
            await eventually(lambda: all(n.store.floor(store) == 6 for n in ring), "floor 6")
            # the newer writer's v6 on the v5 it restored: its base is gone
            with pytest.raises((InvalidRequest, QuorumNotReached), match="below retention"):
                await new.commit(store, 6, {b"k6": b"b6"}, [], {}, epoch=2, base_epoch=1)
            assert all(n.store.head(store).epoch == 1 for n in ring)  # type: ignore[union-attr]
            # the old writer's delta at the floor, of the floor snapshot's epoch, is held
            assert dict(await new.restore(store, 8)) == {
                **at5,
                b"k6": b"a6",
                b"k7": b"a7",
                b"k8": b"a8",
            }


async def test_a_floor_checked_before_a_newer_writers_delta_at_it_is_not_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StoreId("rew", 0, 0, "race")
    checked = resumed = 0
    go = asyncio.Event()
    real = api.check_floor

    async def held_check(node: Any, s: StoreId, floor: int) -> None:
        nonlocal checked, resumed
        await real(node, s, floor)  # the check passes: the head is the old writer's
        if s == store and floor == 6 and not go.is_set():
            checked += 1
            await go.wait()  # ... and the floor's write waits
            resumed += 1

    monkeypatch.setattr(api, "check_floor", held_check)
    async with nodes(tmp_path, 3, **RING) as ring:
        addrs = [n.address for n in ring]
        async with (
            AsyncRingClient(addrs, timeout=30) as old,
            AsyncRingClient(addrs, timeout=30) as new,
        ):
            at5 = await _old_history(old, store)
            assert dict(await new.restore(store, 5)) == at5
            await old.commit(store, 8, {b"k8": b"a8"}, [], {}, epoch=1)
            await eventually(lambda: checked >= 2, "the compactor's floor 6 checked on two")
            assert all(n.store.floor(store) < 6 for n in ring)
            mine = {**at5, b"k6": b"b6"}
            result = await new.commit(store, 6, {b"k6": b"b6"}, [], {}, epoch=2, base_epoch=1)
            assert result.version == 6 and not result.tentative
            go.set()  # the held gc handlers go on to write their floor
            await eventually(lambda: resumed >= checked, "the held handlers went on")
            await asyncio.sleep(1.0)  # their writes ran (the writer queue is idle)
            assert all(n.store.floor(store) < 6 for n in ring)
            assert dict(await new.restore(store, 6)) == mine


async def test_a_compactor_with_a_stale_lower_retain_drops_nothing_the_writer_keeps(
    tmp_path: Path,
) -> None:
    store = StoreId("ret", 0, 0, "stale")
    kw = {
        "thin_snapshots": 0,
        "snapshot_every": 2,
        "retain_versions": 100,
        "write_quorum": 2,
    }
    ring = Restartable(tmp_path, **kw)

    try:
        await ring.start_all()
        leader = ring.leader(store)
        others = [k for k in "abc" if k != leader]
        via = ring[others[0]].address
        for v in range(1, 7):  # the writer keeps 3 versions at first
            assert await asyncio.to_thread(commit_row, via, store, v, "&retain=3") == 201
        await eventually(lambda: ring[leader].store.retain(store) == 3, "leader: 3")
        # the leader goes down; the writer, started again keeping 20, goes on
        await ring.stop(leader)
        await eventually(lambda: all(sees(ring[k], 2) for k in others), "the two alone")
        for v in range(7, 21):
            assert await asyncio.to_thread(commit_row, via, store, v, "&retain=20") == 201
        kept_from = max(ring[k].store.floor(store) for k in others)
        assert kept_from <= 8
        # the leader comes back with its record of 3; repair brings it the versions
        node = await ring.start(leader, via)
        await eventually(lambda: all(sees(n, 3) for n in ring.live()), "3 nodes again")
        await eventually(
            lambda: (h := node.store.head(store)) is not None and h.version == 20,
            "the leader at head 20",
            limit=30,
        )
        # its compactor plans a floor of 18 (its retain of 3) and sends it to the other
        # owners first: refused by the two that keep 20, so it takes none of it itself (the
        # builds before dropped its own copies: the versions at R-1)
        await eventually(lambda: node.stats["gc_within_retain"] > 0, "a floor refused")
        await asyncio.sleep(1.0)  # a few more of its passes
        assert all(ring[k].store.floor(store) <= kept_from for k in "abc")
        async with AsyncRingClient([ring[k].address for k in others], timeout=30) as c:
            for v in range(max(1, kept_from), 21):
                got = dict(await c.restore(store, v))
                assert got == {f"k{u}".encode(): b"v" for u in range(1, v + 1)}, v
    finally:
        await ring.close()


async def test_a_node_holding_no_manifest_of_a_store_takes_only_a_floor_its_owners_took(
    tmp_path: Path,
) -> None:
    """A chunk holder cannot tell a floor that keeps the store restorable (hostile review
    70): a dead branch's floor the owners refuse must not drop, on the nodes holding only
    chunks (most of a store's chunk copies on a ring of more than R), the base of a newer
    writer's acknowledged versions."""
    async with nodes(tmp_path, 7, **{**RING, "retain_versions": 100}) as ring:
        view = ring[0].view()
        (v1,) = encode_chunks({b"k1": b"a1"}, [], block_size=view.block_size())
        # a store whose v1 chunk (the old writer's, under the newer writer's chain) lives on
        # three nodes that hold none of its manifests
        store = next(
            s
            for p in range(5000)
            if not set(view.replicas_of(chunk_key(s := StoreId("rew", 0, p, "chk"), 1, v1.name)))
            & set(view.store_replicas(s))
        )
        addrs = [n.address for n in ring]
        async with (
            AsyncRingClient(addrs, timeout=30) as old,
            AsyncRingClient(addrs, timeout=30) as new,
        ):
            await _old_history(old, store)
            # the newer writer restores v4 and goes on from it, past the old snapshot at 6
            mine = dict(await new.restore(store, 4))
            for v in range(5, 13):
                mine[f"k{v}".encode()] = f"b{v}".encode()
                base = 1 if v == 5 else 2
                row = {f"k{v}".encode(): f"b{v}".encode()}
                await new.commit(store, v, row, [], {}, epoch=2, base_epoch=base)
            # the floor a compactor of the old writer's plans (its snapshot at 6), to every
            # node, owners first as the compactor sends it
            owners = set(view.store_write_replicas(store))
            for n in sorted(ring, key=lambda n: n.address not in owners):
                status, body = await call(
                    n, "POST", f"/v1/stores/{store.path}/gc", json={"floor": 6}
                )
                assert status == 400, (n.address in owners, body)
            assert all(n.store.floor(store) == 0 for n in ring)
            assert dict(await new.restore(store, 12)) == mine


def _below(ring: list[Node], store: StoreId, floor: int) -> dict[str, tuple[int, list[str]]]:
    """Per node, its floor and the chunks of ``store`` it holds below ``floor``."""
    out = {}
    for n in ring:
        keys = [
            k
            for k in n.store.chunk_keys()
            if k.startswith(store.path + "/") and int(k.split("/")[-2]) < floor
        ]
        if keys:
            out[n.address] = (n.store.floor(store), sorted(keys))
    return out


async def test_chunk_holders_take_a_floor_with_a_home_down_and_nothing_below_comes_back(
    tmp_path: Path,
) -> None:
    """With one home replica down (fewer than W), a node holding only a store's chunks takes
    the floor every live home took (hostile review 71: it refused every floor while any
    home was down, and its repair pushed the chunks below the floor back to the nodes that
    had dropped them; an idle store kept them for good). The home that comes back refuses
    the floor until repair brings its head to it, then passes again at once (it waited for
    its next safety-net slot, up to 30 s more: the wait below ran out under a loaded CI run)."""
    names = "abcdefg"
    ring = Restartable(tmp_path, names, write_quorum=2, snapshot_every=2, retain_versions=3)
    try:
        await ring.start_all()
        view = ring["a"].view()
        (c1,) = encode_chunks({b"k1": b"a1"}, [], block_size=view.block_size())
        # a store whose v1 chunk lives on a home replica and on nodes that are not homes, and
        # a home that is neither its compaction leader nor a holder of that chunk
        for p in range(5000):
            store = StoreId("r71", 0, p, "idle")
            homes = view.write_homes(store.path)
            holders = view.replicas_of(chunk_key(store, 1, c1.name))
            down = [h for h in homes if h not in holders and h != view.store_replicas(store)[0]]
            if set(holders) - set(homes) and set(holders) & set(homes) and down:
                break
        name = next(k for k in names if ring.address(k) == down[0])
        seeds = [ring.address(k) for k in names if k != name]
        async with AsyncRingClient(seeds, timeout=30) as c:
            await c.commit(store, 1, {b"k1": b"a1"}, [], {}, epoch=1)
            await ring.stop(name)
            await eventually(lambda: all(sees(n, 6) for n in ring.live()), "6 live")
            for v in range(2, 15):
                await c.commit(store, v, {f"k{v}".encode(): b"v"}, [], {}, epoch=1)
        live_homes = [n for n in ring.live() if n.address in homes]
        await eventually(lambda: all(n.store.floor(store) >= 10 for n in live_homes), "floors")
        floor = min(n.store.floor(store) for n in live_homes)
        await eventually(lambda: not _below(ring.live(), store, floor), "chunks below dropped")
        # the home comes back (seeded by a live node: it may be "a"); the store is idle
        await ring.start(name, ring.live()[0].address)
        await eventually(lambda: all(sees(n, 7) for n in ring.live()), "7 live")
        await eventually(
            lambda: ring[name].store.floor(store) >= floor, "the home took the floor", limit=40
        )
        await asyncio.sleep(3.0)  # three more repair passes
        assert not _below(ring.live(), store, floor)
    finally:
        await ring.close()


R72 = {
    "replicas": 3,
    "write_quorum": 2,
    "thin_snapshots": 0,
    "snapshot_every": 2,
    "compact_interval": 0.2,
    "repair_interval": 1.0,
}


def _leader(ring: list[Node], store: StoreId) -> int:
    return next(i for i, n in enumerate(ring) if n.view().store_replicas(store)[0] == n.address)


async def test_a_floor_another_owner_took_does_not_reach_a_stale_leader_by_sync_have(
    tmp_path: Path,
) -> None:
    """Hostile review 72: a stale leader's floor that one owner refused and another took
    (one holding no writer's retain: a replaced disk refilled by repair) reached the leader
    in that owner's sync/have answer, and the leader dropped its copies of versions the
    writer keeps (left on one replica). A node holding the store's manifests now takes a
    peer's floor only once every other live home took it."""
    store = StoreId("ret", 0, 1, "byp")
    async with nodes(tmp_path, 3, **R72, retain_versions=100) as ring:
        via = ring[0].address
        for v in range(1, 21):
            assert await asyncio.to_thread(commit_row, via, store, v, "&retain=20") == 201
            await asyncio.sleep(0.3)  # a compaction pass: a snapshot every 2 versions
        await eventually(
            lambda: all((h := n.store.head(store)) is not None and h.version == 20 for n in ring),
            "head 20 everywhere",
        )
        lead = _leader(ring, store)
        b, c = (i for i in range(3) if i != lead)

        def target() -> int:
            held = [set(n.store.snapshot_versions(store)) for n in ring]
            return max((v for v in set.intersection(*held) if 2 <= v <= 18), default=0)

        await eventually(target, "snapshots within 2..18 on all three")
        floor = target()
        # b: no writer retain held (a replaced disk refilled by repair); the leader: the
        # stale 3 it held before a raise it missed; c: the writer's 20
        await ring[b].write(ring[b].store.backend.write, {}, [_skey(Prefix.RETAIN, store)])
        assert ring[b].store.retain(store) is None
        await ring[lead].write(ring[lead].store.set_retain, store, 3)
        await eventually(lambda: ring[b].store.floor(store) >= floor, "b took the stale floor")
        # what the leader's repair pass asks b (a full pass comes every 30 s, at a phase of
        # its own): b's answer carries the floor b took
        held = [it.name() for it in ring[lead].store.manifest_items() if it.store == store]
        await ask_have(ring[lead], {ring[b].address: held})
        assert ring[lead].stats["have_asked"] >= len(held)  # b answered
        assert ring[c].store.floor(store) <= 1
        assert ring[lead].store.floor(store) <= 1, (
            f"the leader dropped its copies below {ring[lead].store.floor(store)}: "
            "versions the writer keeps are on one replica"
        )


async def test_a_writers_lowered_retain_is_not_undone_by_a_replica_that_missed_it(
    tmp_path: Path,
) -> None:
    """Hostile review 72 (of a rule tried and dropped: a peer's retain taken above the value
    held): a writer lowers retain 100 -> 10 while one replica is down; that replica comes
    back holding 100, and its sync/have must not give the 100 back to the two that took
    the writer's 10 (the ring would keep 100 versions against the writer; an idle store
    for good)."""
    store = StoreId("ret", 0, 2, "low")
    ring = Restartable(tmp_path, **{**R72, "retain_versions": 100})
    try:
        await ring.start_all()
        lead = ring.leader(store)
        down = next(k for k in "abc" if k != lead)
        up = [k for k in "abc" if k != down]
        via = ring[lead].address
        for v in range(1, 5):
            assert await asyncio.to_thread(commit_row, via, store, v, "&retain=100") == 201
        await eventually(lambda: all(n.store.retain(store) == 100 for n in ring.live()), "100")
        await ring.stop(down)
        await eventually(lambda: all(sees(ring[k], 2) for k in up), "the two alone")
        for v in range(5, 9):
            assert await asyncio.to_thread(commit_row, via, store, v, "&retain=10") == 201
        assert all(ring[k].store.retain(store) == 10 for k in up)
        await ring.start(down, via)
        await eventually(lambda: all(sees(n, 3) for n in ring.live()), "3 nodes again")
        await eventually(
            lambda: (h := ring[down].store.head(store)) is not None and h.version == 8,
            "the returned replica repaired",
        )
        await asyncio.sleep(3.0)  # a few repair passes
        assert [ring[k].store.retain(store) for k in up] == [10, 10]
    finally:
        await ring.close()
