"""A hand-over round's manifests go at its chunks' pace (node/pace.py, ``copy_round``).

The copies here are stand-ins for the network (the rounds' real fetches and pushes run in
tests/test_elastic.py against node processes); what is checked is the order in which a
round starts them, never a duration."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import cast

import pytest

from statestore.core.handover import Handover
from statestore.node.daemon import MoveStatus, Node
from statestore.node.foreground import ForegroundGate
from statestore.node.handover import IN_FLIGHT, MANIFESTS_IN_FLIGHT, copy_round
from statestore.node.pace import Pace


@pytest.mark.parametrize(
    ("chunks", "manifests", "needs"),
    [
        (4, 8, [0, 0, 1, 1, 2, 2, 3, 3]),  # two manifests per chunk
        (8, 4, [0, 2, 4, 6]),  # a manifest every other chunk
        (3, 3, [0, 1, 2]),
        (0, 3, [0, 0, 0]),  # no chunk: manifests go at once
        (5, 1, [0]),
    ],
)
def test_manifest_i_waits_for_its_share_of_the_chunks(
    chunks: int, manifests: int, needs: list[int]
) -> None:
    pace = Pace(chunks, manifests)
    assert [pace.need(i) for i in range(manifests)] == needs
    assert all(n < max(chunks, 1) for n in needs)  # the last manifest never waits for all


async def test_a_waiting_manifest_starts_when_its_chunk_does() -> None:
    pace = Pace(2, 2)
    first = asyncio.create_task(pace.manifest(0))
    second = asyncio.create_task(pace.manifest(1))
    await asyncio.sleep(0)
    assert first.done() and not second.done()
    pace.chunk_started()
    await asyncio.sleep(0)
    assert second.done()


def _node(mbps: float = 1e6) -> Node:
    return cast(
        Node,
        SimpleNamespace(
            foreground=ForegroundGate(),
            clock=time.monotonic,
            config=SimpleNamespace(stream_mbps=mbps),
        ),
    )


async def test_a_round_spreads_its_manifests_over_its_chunks() -> None:
    """Many small manifests and chunks that take a while: before the pace, every manifest
    went at once, ahead of all but the first IN_FLIGHT chunks."""
    chunks, manifests = 4 * IN_FLIGHT, 8 * IN_FLIGHT
    items = [f"c:{i:04d}" for i in range(chunks)] + [f"m:s/{i}/d/1" for i in range(manifests)]
    started: list[str] = []
    move = MoveStatus(Handover("join"), 0.0)

    async def copy(i: int) -> int | None:
        started.append(items[i])
        await asyncio.sleep(0.002 if items[i][0] == "c" else 0)
        return None if items[i] == "c:0003" else 10  # one copy fails: counted, not fatal

    moved, failed = await copy_round(_node(), move, items, copy)
    assert sorted(started) == sorted(items)
    assert (moved, failed) == (10 * (len(items) - 1), 1)
    assert (move.bytes, move.round_done) == (moved, len(items) - 1)
    pace = Pace(chunks, manifests)
    k = 0  # the manifests in the order they started (the round mixes them: copy_order)
    for n, item in enumerate(started):
        if item[0] == "m":
            before = sum(1 for s in started[:n] if s[0] == "c")
            assert before >= pace.need(k), (item, k, before)
            k += 1
    # the manifests did not all go first: the last one waited for all but the last chunk
    last = max(n for n, s in enumerate(started) if s[0] == "m")
    assert sum(1 for s in started[:last] if s[0] == "c") >= chunks - 1


async def test_a_round_mixes_its_stores_instead_of_copying_one_after_another() -> None:
    """Names sort by store: a store of tiny deltas ("fg/...") came wholly before one of large
    snapshots ("load/..."), and its run of copies, thousands a second that the bytes budget
    hardly slowed, took a move's first half second. Now every quarter of the round copies
    about a quarter of each store, and every item once."""
    tiny = [f"c:fg/1/{v}/0/d-{v}" for v in range(400)]
    large = [f"c:load/0/{v}/0/s-{v}" for v in range(400)]
    items = sorted(tiny + large)
    started: list[str] = []

    async def copy(i: int) -> int | None:
        started.append(items[i])
        await asyncio.sleep(0)
        return 1

    move = MoveStatus(Handover("leave"), 0.0)
    assert await copy_round(_node(), move, items, copy) == (len(items), 0)
    assert sorted(started) == items  # each item copied once
    for q in range(4):
        quarter = started[q * 200 : (q + 1) * 200]
        assert 70 <= sum(1 for s in quarter if s.startswith("c:fg/")) <= 130, q


async def test_a_round_of_manifests_alone_is_not_held_back() -> None:
    items = [f"m:s/{i}/d/1" for i in range(10)]
    done: list[int] = []

    async def copy(i: int) -> int | None:
        done.append(i)
        return 1

    assert await copy_round(_node(), MoveStatus(Handover("leave"), 0.0), items, copy) == (10, 0)
    assert sorted(done) == list(range(10))


async def test_a_round_runs_a_fixed_number_of_copies_whatever_its_size() -> None:
    """At most IN_FLIGHT chunks and MANIFESTS_IN_FLIGHT manifests at once, and as many tasks
    on the loop whatever the round's size (a task per item was tens of thousands at once)."""
    chunks, manifests = 300, 3000  # ten manifests a chunk: the pace lets 32 run at once
    items = [f"c:{i:04d}" for i in range(chunks)] + [f"m:s/{i}/d/1" for i in range(manifests)]
    running = {"c": 0, "m": 0}
    most = {"c": 0, "m": 0, "tasks": 0}
    done: list[int] = []

    async def copy(i: int) -> int | None:
        kind = items[i][0]
        running[kind] += 1
        most[kind] = max(most[kind], running[kind])
        most["tasks"] = max(most["tasks"], len(asyncio.all_tasks()))
        await asyncio.sleep(0)
        running[kind] -= 1
        done.append(i)
        return 1

    move = MoveStatus(Handover("join"), 0.0)
    assert await copy_round(_node(), move, items, copy) == (len(items), 0)
    assert sorted(done) == list(range(len(items)))  # each item copied once
    assert most["c"] == IN_FLIGHT and most["m"] == MANIFESTS_IN_FLIGHT
    assert most["tasks"] <= IN_FLIGHT + MANIFESTS_IN_FLIGHT + 1  # the workers and the test
