"""A hand-over round's manifests go at its chunks' pace (node/moves/pace.py, ``copy_round``).

The copies here are stand-ins for the network (the rounds' real fetches and pushes run in
tests/ring/test_elastic.py against node processes); what is checked is the order in which a
round starts them, never a duration."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import cast

import pytest

from statestore.core.handover import Handover, copy_order
from statestore.node.daemon import MoveStatus, Node
from statestore.node.foreground import ForegroundGate
from statestore.node.moves.pace import Pace
from statestore.node.moves.rounds import (
    BATCHES_IN_FLIGHT,
    IN_FLIGHT,
    MANIFEST_BATCH,
    MANIFESTS_IN_FLIGHT,
    copy_round,
)


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


async def test_a_batched_round_copies_each_manifest_once_in_paced_batches_of_one_target() -> None:
    """With batches (node/moves/copies.py), manifests go MANIFEST_BATCH at a time to one target,
    BATCHES_IN_FLIGHT at once, each once its last manifest's share of the chunks started;
    a manifest a batch did not land counts as failed, the chunks go one at a time."""
    chunks, manifests = 200, 1000
    items = [f"c:{i:04d}" for i in range(chunks)] + [f"m:s/{i}/d/1" for i in range(manifests)]
    keys = [f"t{i % 3}" for i in range(len(items))]
    started: list[str] = []
    sent: list[tuple[list[int], int]] = []  # each batch and the chunks started before it
    running = most = 0

    async def copy(i: int) -> int | None:
        assert items[i][0] == "c"
        started.append(items[i])
        await asyncio.sleep(0.0005)
        return 100

    async def copy_many(batch: list[int]) -> list[int | None]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        sent.append((batch, sum(1 for s in started if s[0] == "c")))
        started.extend(items[i] for i in batch)
        await asyncio.sleep(0)
        running -= 1
        return [None if items[i] == "m:s/7/d/1" else 1 for i in batch]

    move = MoveStatus(Handover("leave"), 0.0)
    moved, failed = await copy_round(_node(), move, items, copy, (keys, copy_many))
    assert (moved, failed) == (100 * chunks + manifests - 1, 1)
    assert sorted(started) == sorted(items)  # every item once
    # at most BATCHES_IN_FLIGHT at once (how many overlap depends on the scheduler's timing)
    assert 1 <= most <= BATCHES_IN_FLIGHT
    assert all(len(b) <= MANIFEST_BATCH and len({keys[i] for i in b}) == 1 for b, _ in sent)
    assert sum(len(b) == MANIFEST_BATCH for b, _ in sent) >= manifests // MANIFEST_BATCH - 3
    # paced: a batch starts once the chunks its latest manifest waits for have
    pace = Pace(chunks, manifests)
    ordinal = {i: k for k, i in enumerate(i for i in copy_order(items) if items[i][0] == "m")}
    for batch, before in sent:
        assert before >= pace.need(max(ordinal[i] for i in batch)), batch
    assert max(before for _, before in sent) >= chunks * 0.9  # spread to the round's end
