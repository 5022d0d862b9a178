"""When a repair pass is due and how it runs (core/repair_clock.py), from tables.

Each scenario is a list of ticks ``(now, epoch, placement, expected, pending)``: the clock is
asked at ``now``; ``expected`` is None (no pass) or ``(allow_handoff, planned)``; a pass that
runs leaves ``pending`` items (None: it failed). full_every 30, grace 9, phase 0 unless said.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statestore.core.repair_clock import MOVE_HOLD, PassPlan, RepairClock, phase_of

Tick = tuple[float, int, str, "tuple[bool, bool] | None", "int | None"]

SCENARIOS: dict[str, tuple[float, list[Tick]]] = {
    "first tick passes, planned, no drops": (
        0.0,
        [(5.0, 3, "A", (False, True), 0), (7.0, 3, "A", None, 0)],
    ),
    # a member that starts joining or leaving moves the epoch but not the placement
    "an epoch change alone is not a pass": (
        0.0,
        [(5.0, 3, "A", (False, True), 0), (7.0, 4, "A", None, 0), (9.0, 5, "A", None, 0)],
    ),
    "it holds back the drops of the next pass": (
        0.0,
        [
            (5.0, 3, "A", (False, True), 0),
            (15.0, 3, "A", None, 0),
            (17.0, 4, "A", None, 0),
            (19.0, 5, "B", (False, True), 0),
            (21.0, 5, "B", None, 2),  # nothing changed and nothing pending: no pass
        ],
    ),
    "a placement change passes at once": (
        0.0,
        [(5.0, 3, "A", (False, True), 0), (20.0, 4, "B", (False, True), 0)],
    ),
    "pending items pass every tick, drops allowed once the epoch holds": (
        0.0,
        [
            (5.0, 3, "A", (False, True), 3),
            (7.0, 3, "A", (True, True), 1),
            (9.0, 3, "A", (True, True), 0),
            (11.0, 3, "A", None, 0),
        ],
    ),
    "a failed pass keeps the last count": (
        0.0,
        [
            (5.0, 3, "A", (False, True), 2),
            (7.0, 3, "A", (True, True), None),
            (9.0, 3, "A", (True, True), 0),
            (11.0, 3, "A", None, 0),
        ],
    ),
    "the planned window closes after grace, and a move inside it does not extend it": (
        0.0,
        [
            (5.0, 3, "A", (False, True), 0),
            (8.0, 4, "B", (False, True), 0),  # inside the window opened at 5
            (13.0, 5, "C", (False, True), 0),  # 13 - 5 < 9: still planned
            (15.0, 6, "D", (False, True), 0),  # 15 - 5 >= 9: a new window opens at 15
            (22.0, 6, "D", None, 1),
            (23.0, 7, "E", (False, True), 1),  # inside the window of 15
            (25.0, 7, "E", (True, False), 0),  # 25 - 15 >= 9, the epoch held: closed
        ],
    ),
    "the safety net passes once per slot": (
        0.0,
        [
            (5.0, 3, "A", (False, True), 0),
            (29.0, 3, "A", None, 0),
            (31.0, 3, "A", (True, False), 0),
            (33.0, 3, "A", None, 0),
            (59.0, 3, "A", None, 0),
            (61.0, 3, "A", (True, False), 0),
        ],
    ),
    "on its own grid: phase 14": (
        14.0,
        [
            (5.0, 3, "A", (False, True), 0),
            (13.0, 3, "A", None, 0),  # the slots of 5 and 13 both start at -16
            (15.0, 3, "A", (True, False), 0),
            (43.0, 3, "A", None, 0),
            (45.0, 3, "A", (True, False), 0),
        ],
    ),
    "a pass for a change counts for its slot": (
        0.0,
        [
            (5.0, 3, "A", (False, True), 0),
            (31.0, 4, "B", (False, True), 0),
            (33.0, 4, "B", None, 0),
            (59.0, 4, "B", None, 0),
        ],
    ),
}


# while a member moves (``moving``): the safety net waits up to MOVE_HOLD slots; a change
# of ownership or pending items still pass at once
MOVING: dict[str, list[Tick]] = {
    "the safety net waits while a member moves": [
        (5.0, 3, "A", (False, True), 0),
        (31.0, 4, "A", None, 0),
        (61.0, 4, "A", None, 0),
        (299.0, 4, "A", None, 0),
        (331.0, 4, "A", (False, True), 0),  # MOVE_HOLD slots: it passes after all
        (333.0, 4, "A", None, 0),
    ],
    "a change of ownership still passes": [
        (5.0, 3, "A", (False, True), 0),
        (31.0, 4, "A", None, 0),
        (33.0, 5, "B", (False, True), 0),
    ],
    "pending items still pass": [
        (5.0, 3, "A", (False, True), 2),
        (7.0, 3, "A", (True, True), 0),
        (31.0, 3, "A", None, 0),
    ],
}


@pytest.mark.parametrize("name", sorted(MOVING))
def test_schedule_while_moving(name: str) -> None:
    assert MOVE_HOLD == 10
    clock = RepairClock(full_every=30.0, grace=9.0)
    for now, epoch, placement, expected, pending in MOVING[name]:
        plan = clock.due(epoch, placement, now, moving=True)
        assert plan == (None if expected is None else PassPlan(*expected)), (name, now)
        if plan is not None:
            clock.ran(epoch, placement, now, pending)


# ticks with the move flags: (now, epoch, placement, moving, left_only, expected, pending)
Flagged = tuple[float, int, str, bool, bool, "tuple[bool, bool] | None", "int | None"]
AFTER: dict[str, list[Flagged]] = {
    # the safety net held over a 100 s move is overdue when it ends; it waits for the
    # node's next grid point (120), not the end's second
    "after a move the overdue safety net waits for the next grid point": [
        (5.0, 3, "A", False, False, (False, True), 0),
        (40.0, 4, "A", True, False, None, 0),
        (99.0, 4, "A", True, False, None, 0),
        (101.0, 5, "A", False, False, None, 0),
        (119.0, 5, "A", False, False, None, 0),
        (121.0, 5, "A", False, False, (False, True), 0),
        (123.0, 5, "A", False, False, None, 0),
    ],
    "a decommission's end (members that left) waits for the grid point too": [
        (5.0, 3, "A", False, False, (False, True), 0),
        (40.0, 4, "A", True, False, None, 0),
        (99.0, 4, "A", True, False, None, 0),
        (101.0, 5, "B", False, True, None, 0),
        (121.0, 5, "B", False, True, (False, True), 0),
        (123.0, 5, "B", False, False, None, 0),  # the pass took B as its placement
    ],
    "a join's end (a member added) still passes at once": [
        (5.0, 3, "A", False, False, (False, True), 0),
        (40.0, 4, "A", True, False, None, 0),
        (101.0, 5, "B", False, False, (False, True), 0),
    ],
    "after the grid point the safety net keeps its slots": [
        (5.0, 3, "A", False, False, (False, True), 0),
        (40.0, 4, "A", True, False, None, 0),
        (121.0, 4, "A", False, False, (False, True), 0),  # the epoch moved at 40
        (149.0, 4, "A", False, False, None, 0),
        (151.0, 4, "A", False, False, (True, False), 0),
    ],
}


@pytest.mark.parametrize("name", sorted(AFTER))
def test_schedule_after_a_move(name: str) -> None:
    clock = RepairClock(full_every=30.0, grace=9.0)
    for now, epoch, placement, moving, left_only, expected, pending in AFTER[name]:
        plan = clock.due(epoch, placement, now, moving=moving, left_only=left_only)
        assert plan == (None if expected is None else PassPlan(*expected)), (name, now)
        if plan is not None:
            clock.ran(epoch, placement, now, pending)


def test_nodes_pass_apart_after_a_move() -> None:
    """Eight nodes whose safety net a long move held: after it, each passes at its own grid
    point, not all in the tick the move ends."""
    clocks = [RepairClock(30.0, 9.0, phase=phase_of(f"node-{i}", 30.0)) for i in range(8)]
    for clock in clocks:
        assert clock.due(1, "A", 1.0) is not None
        clock.ran(1, "A", 1.0, 0)
    for step in range(3, 201, 2):
        for clock in clocks:
            assert clock.due(2, "A", float(step), moving=True) is None  # held (< MOVE_HOLD)
    first: dict[int, float] = {}
    for step in range(201, 233, 2):  # the move ended at 200: one period after it
        for i, clock in enumerate(clocks):
            if clock.due(3, "A", float(step)) is not None:
                clock.ran(3, "A", float(step), 0)
                first.setdefault(i, float(step))
    assert len(first) == len(clocks) and len(set(first.values())) >= 5, first


def test_a_joining_node_does_not_pass_until_its_join_ends() -> None:
    clock = RepairClock(full_every=30.0, grace=9.0)
    for now in (5.0, 7.0, 61.0, 400.0):  # first tick, ticks, slots, long past MOVE_HOLD
        assert clock.due(3, "A", now, moving=True, joining=True) is None
    assert clock.due(4, "B", 402.0, moving=False) == PassPlan(False, True)  # it owns now


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_schedule(name: str) -> None:
    phase, ticks = SCENARIOS[name]
    clock = RepairClock(full_every=30.0, grace=9.0, phase=phase)
    for now, epoch, placement, expected, pending in ticks:
        plan = clock.due(epoch, placement, now)
        want = None if expected is None else PassPlan(*expected)
        assert plan == want, (name, now)
        if plan is not None:
            clock.ran(epoch, placement, now, pending)


@given(st.text(min_size=1, max_size=20), st.floats(1.0, 600.0))
def test_phase_within_period_and_stable(name: str, full_every: float) -> None:
    p = phase_of(name, full_every)
    assert 0.0 <= p < full_every
    assert phase_of(name, full_every) == p


def test_phases_spread_nodes_started_together() -> None:
    """Eight nodes started together and left alone pass their safety net in different
    seconds, not all in one."""
    clocks = [RepairClock(30.0, 9.0, phase=phase_of(f"node-{i}", 30.0)) for i in range(8)]
    starts: list[list[float]] = [[] for _ in clocks]
    for step in range(5, 200, 2):  # a 2 s repair tick
        now = float(step)
        for clock, seen in zip(clocks, starts, strict=True):
            if clock.due(1, "A", now) is not None:
                clock.ran(1, "A", now, 0)
                seen.append(now)
    later = {s for seen in starts for s in seen if s > 5.0}
    assert all(len(seen) >= 6 for seen in starts)  # each passes once per 30 s slot
    assert len(later) > 8  # not one second for all


def test_a_pass_asked_for_runs_at_the_next_tick_within_a_slot() -> None:
    """``want`` (a floor refused while the node lagged, now within its head): a pass at the
    next tick, where the grid would wait for its next slot; once run, the grid rules again."""
    clock = RepairClock(30.0, 9.0)
    assert clock.due(3, "A", 5.0) == PassPlan(allow_handoff=False, planned=True)
    clock.ran(3, "A", 5.0, 0)
    assert clock.due(3, "A", 20.0) is None
    clock.want()
    assert clock.due(3, "A", 21.0) == PassPlan(allow_handoff=True, planned=False)
    clock.ran(3, "A", 21.0, 0)
    assert clock.due(3, "A", 23.0) is None
    # a pass that failed settles it too (no pass every tick after one failure)
    clock.want()
    assert clock.due(3, "A", 25.0) is not None
    clock.ran(3, "A", 25.0, None)
    assert clock.due(3, "A", 27.0) is None
    # held while a member moves, as the safety net is; run once the move is over
    clock.want()
    assert clock.due(3, "A", 28.0, moving=True) is None
    assert clock.due(3, "A", 29.0) is not None
