"""When a node's repair pass is due, and how it runs (pure).

A pass walks everything the node holds, so it runs only when it can find work:

- when who owns what changes (``RingView.placement``): a member declared down or back, a
  finished move. Not for a member that only starts joining or leaving: its owners are
  unchanged, and the hand-over moves its copies (node/moves/);
- while the last pass left items waiting (hand-offs, copies left to a designated source),
  or when the shell asks for one (:meth:`RepairClock.want`);
- once in every ``full_every`` seconds of this node's own grid, as a safety net. The grid is
  offset by a per-node ``phase``, so nodes started together do not all walk what they hold in
  the same second (at 1 GiB that cluster of passes showed in clients' p99,
  docs/benchmarks.md). A pass that ran for another reason counts for its grid slot. While a
  member joins, leaves or moves tokens the safety net waits (up to ``MOVE_HOLD`` slots): the
  hand-over is copying, and the move's end changes ownership, which sets off a pass anyway.

When a move ends the safety net, held while it ran, is overdue on every node at once: it
waits for this node's next grid point after the move (so the nodes' passes after a move are
spread over a period, not run together in the second the move ends). A placement change
that only removes members that have left (a finished decommission: its hand-over verified
every copy before it switched, ``RingView.only_left_since``) is not a reason to pass at
once either; the safety net covers it at that grid point.

A node that is itself joining passes not at all: all it holds are copies its owners hold too
(streamed from them, or written to it as a pending owner alongside them), and its first pass
made every owner digest everything it holds in a join's first seconds. Once its join ends
ownership changes, and it passes then.

How it runs (:class:`PassPlan`): any epoch change since the last pass, ownership or not,
holds back that pass's drops; a pass within ``grace`` of the first epoch change of a window
leaves each lacking copy to its designated source (core/repair.py). node/repair.py keeps one
clock per node and does the passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import xxhash

__all__ = ["MOVE_HOLD", "PassPlan", "RepairClock", "phase_of"]

MOVE_HOLD = 10  # safety-net slots a move may hold back


def phase_of(name: str, full_every: float) -> float:
    """A node's offset within ``full_every``, the same on every start (hash of its name)."""
    return (xxhash.xxh64_intdigest(name.encode()) % 10_000) / 10_000 * full_every


@dataclass(frozen=True)
class PassPlan:
    """How the pass that is due runs: ``allow_handoff`` (drops may go: the epoch has not
    moved since the last pass) and ``planned`` (copies are left to their designated source)."""

    allow_handoff: bool
    planned: bool


@dataclass
class RepairClock:
    """One node's repair schedule. Call :meth:`due` each tick; if it returns a plan, run the
    pass and then call :meth:`ran` (also when the pass failed, with ``pending=None``)."""

    full_every: float
    grace: float
    phase: float = 0.0
    epoch: int | None = None
    placement: object = None
    last_pass: float | None = None
    moved_at: float | None = None
    pending: int = 0
    moving_seen: float | None = None  # the last tick at which a member moved
    wanted: bool = False  # the shell asked for a pass (:meth:`want`), not run yet

    def _slot(self, now: float) -> float:
        """The start of the grid slot ``now`` is in."""
        return math.floor((now - self.phase) / self.full_every) * self.full_every + self.phase

    def due(
        self,
        epoch: int,
        placement: object,
        now: float,
        *,
        moving: bool = False,
        joining: bool = False,
        left_only: bool = False,
    ) -> PassPlan | None:
        """The pass to run now, or None; ``moving``: a member joins, leaves or moves tokens;
        ``joining``: this node is one that joins; ``left_only``: the placement changed since
        the last pass only by members that have left. Opens a planned window if the epoch
        moved outside one (a move inside a window does not extend it)."""
        if moving:
            self.moving_seen = now
        if joining:
            return None
        if self.last_pass is not None:
            hold = MOVE_HOLD * self.full_every if moving else 0.0
            slot = self._slot(now - hold)
            safety = self.last_pass < slot
            if not moving and self.moving_seen is not None:
                safety = safety and slot > self.moving_seen  # a grid point after the move
            changed = placement != self.placement and not left_only
            wanted = self.wanted and not moving  # held, as the safety net, while one moves
            if not (changed or self.pending or safety or wanted):
                return None
        moved = epoch != self.epoch
        if moved and (self.moved_at is None or now - self.moved_at >= self.grace):
            self.moved_at = now
        planned = self.moved_at is not None and now - self.moved_at < self.grace
        return PassPlan(allow_handoff=not moved, planned=planned)

    def want(self) -> None:
        """One pass at the next tick, whatever the grid says (held while a member moves):
        something arrived that only a pass acts on (a floor this node refused while it
        lagged, now within its head). A pass that ran, or failed, settles it."""
        self.wanted = True

    def ran(self, epoch: int, placement: object, now: float, pending: int | None) -> None:
        """Record a pass that started at ``now`` over ``epoch`` and ``placement``;
        ``pending``: the items it left waiting, or None if it failed (the count stands)."""
        self.epoch, self.placement, self.last_pass = epoch, placement, now
        self.wanted = False
        if pending is not None:
            self.pending = pending
