"""A retention floor one node reached alone (R=3, W=1, the two others down), after a newer
writer rewound below it on the two: the floor is taken only at a snapshot of the head's line
of descent (core/retention.usable_snapshots). The builds before took it at a snapshot of any
epoch held at that version, which repair had copied from the old writer's dead branch, and
dropped the newer writer's acknowledged versions in the retention window (hostile review 3)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from client import AsyncRingClient, StoreId
from tests.ringkit import Restartable, eventually, sees


async def test_a_floor_of_a_dead_branch_drops_none_of_the_newer_writers_versions(
    tmp_path: Path,
) -> None:
    store = StoreId("flr", 0, 3, "rewind")
    kw = {
        "thin_snapshots": 0,
        "snapshot_every": 5,
        "retain_versions": 10,
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
            for v in range(1, 13):
                state[f"k{v % 7}".encode()] = f"a{v}".encode()
                await old.commit(
                    store, v, {f"k{v % 7}".encode(): f"a{v}".encode()}, [], {}, epoch=1
                )
            await asyncio.sleep(1.5)
            for k in others:
                await ring.stop(k)
            await eventually(lambda: sees(lead, 1), "the others down")
            for v in range(13, 41):
                await old.commit(
                    store, v, {f"k{v % 7}".encode(): f"a{v}".encode()}, [], {}, epoch=1
                )
                await asyncio.sleep(0.25)
            await eventually(
                lambda: lead.store.floor(store) >= 25, "the lead's floor past 25", limit=30
            )
            floor = lead.store.floor(store)
        await ring.stop(lname)
        for k in others:
            await ring.start(k, ring.address(others[0]) if k != others[0] else None)
        missed = [ring[k] for k in others]
        await eventually(lambda: all(sees(n, 2) for n in missed), "the two see each other")
        # the newer writer restored version 12 (the head the two hold) and goes on from it
        new_state = dict(state)
        want: dict[int, dict[bytes, bytes]] = {}
        async with AsyncRingClient([n.address for n in missed], timeout=30) as new:
            assert dict(await new.restore(store, 12)) == state
            for v in range(13, floor - 4):
                new_state[f"k{v % 7}".encode()] = f"b{v}".encode()
                await new.commit(
                    store, v, {f"k{v % 7}".encode(): f"b{v}".encode()}, [], {}, epoch=2
                )
                want[v] = dict(new_state)
            await ring.start(lname, missed[0].address)
            live = ring.live()
            await eventually(lambda: all(sees(n, 3) for n in live), "3 nodes again")
            for v in range(floor - 4, floor + 6):
                new_state[f"k{v % 7}".encode()] = f"b{v}".encode()
                await new.commit(
                    store, v, {f"k{v % 7}".encode(): f"b{v}".encode()}, [], {}, epoch=2
                )
                want[v] = dict(new_state)
            # repair passes: the two hear of the floor in the third's answers (the builds
            # before took it within a few; this one refuses it, so the wait runs out)
            with contextlib.suppress(AssertionError):
                await eventually(
                    lambda: all(ring[k].store.floor(store) >= floor for k in others),
                    "the two took the floor",
                    limit=20,
                )
            lost = []
            for v in range(floor - 4, floor + 6):  # the window of head floor + 5 (retain 10)
                try:
                    got = dict(await new.restore(store, v))
                except Exception as exc:
                    lost.append((v, type(exc).__name__))
                    continue
                if got != want[v]:
                    lost.append((v, f"wrong state {sorted(got.items())}"))
            assert not lost, f"acknowledged versions of the newer writer lost: {lost}"
    finally:
        await ring.close()
