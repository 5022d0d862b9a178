"""Hint rules (pure): which hint may be handed off, how many a node keeps, how much work a
hand-off pass does (node/hints.py is the shell).

**One content per (store, version, epoch).** A version and epoch names one writer's one
commit; the content acknowledged for it is the one W owners hold. A hint is the manifest of
a tentative attempt, so it may only ever *become* that content, never sit beside it:

- before a hint is handed off, the owners are asked what they hold at its version, kind and
  epoch (:func:`handoff_fate`): other content at W owners means the writer's later attempt
  (a retry with other content) superseded this one: the hint is dropped, no verdict; other
  content at fewer than W owners is a write still in flight or a partial one: the hint waits
  (repair completes or reconciles it, core/repair.acknowledged), and is never written beside
  it;
- a replica refuses a hint whose version and epoch it holds as a manifest with other content
  (VersionConflict), and a writer's retry with other content replaces that writer's earlier
  hint of the same version and epoch on the nodes it reaches (the later attempt supersedes);
- what a race still leaves (a hint and a retry written at once, each on some owners) is
  reconciled by repair to the content W owners hold.

**Bounds.** A node keeps at most ``MAX_HINTS`` hints, one query at most its fair share
(:func:`query_share`: ``MAX_HINTS_PER_QUERY``, and never more than half of the room the other
queries leave), so one tenant's flood leaves the others room. A pass tries at most
``PASS_BUDGET`` hints, taken round-robin over the queries (:func:`pass_order`); a pass that
decides nothing doubles the wait before the next (:func:`next_wait`, up to ``MAX_WAIT``).
A hint that stays undecidable (its base is held by no owner and has no verdict) for
``HINT_TTL`` seconds is dropped (:func:`expired`) and counted.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final, Literal, TypeVar

from statestore.core.errors import InsufficientStorage

__all__ = [
    "HINT_TTL",
    "MAX_HINTS",
    "MAX_HINTS_PER_QUERY",
    "MAX_WAIT",
    "PASS_BUDGET",
    "Fate",
    "admit",
    "after_conflict",
    "expired",
    "handoff_fate",
    "next_wait",
    "pass_order",
    "query_share",
]

MAX_HINTS: Final = 100_000  # per node
MAX_HINTS_PER_QUERY: Final = 10_000  # per query and node, at most (query_share)
PASS_BUDGET: Final = 64  # hints a hand-off pass tries (each asks the owners)
MAX_WAIT: Final = 30.0  # seconds between passes at most, when passes decide nothing
HINT_TTL: Final = 3600.0  # seconds a hint may stay undecidable before it is dropped

Fate = Literal["write", "stale", "wait", "confirmed"]
K = TypeVar("K", bound=Hashable)


def query_share(
    query_held: int, total_held: int, cap: int = MAX_HINTS, per_query: int = MAX_HINTS_PER_QUERY
) -> int:
    """How many hints one query may hold on a node: ``per_query``, and at most half of the
    room the other queries' hints leave (so a new query always finds room while the node is
    not full)."""
    others = total_held - query_held
    return max(0, min(per_query, (cap - others) // 2))


def admit(
    query: str,
    query_held: int,
    total_held: int,
    cap: int = MAX_HINTS,
    per_query: int = MAX_HINTS_PER_QUERY,
) -> None:
    """InsufficientStorage unless one more hint of ``query`` fits (the node's cap and the
    query's share)."""
    if total_held >= cap:
        raise InsufficientStorage(
            f"this node holds {total_held} hints, its cap (tentative commits waiting for "
            "their owners): commit when the partition heals"
        )
    share = query_share(query_held, total_held, cap, per_query)
    if query_held >= share:
        raise InsufficientStorage(
            f"query {query} holds {query_held} hints on this node, its share of {share}: "
            "wait until its tentative commits are decided (or commit when the partition heals)"
        )


def handoff_fate(same: int, other: int, write_quorum: int) -> Fate:
    """What to do with a hint before it is handed off, from the owners that answered:
    ``same`` hold its content at its version, kind and epoch, ``other`` hold other content
    there. Other content at W owners is the acknowledged one ("stale": drop the hint, no
    verdict); at fewer, a write in flight or a partial one ("wait": never written beside
    it); none: "write" (the ordinary write path)."""
    if other >= write_quorum:
        return "stale"
    if other:
        return "wait"
    return "write"


def after_conflict(same: int, other: int, write_quorum: int) -> Fate:
    """The same, after the write path answered VersionConflict (an owner held other
    content): the content at W owners wins ("stale" or "confirmed"); neither at W:
    "wait" (repair reconciles, the hint is asked about again)."""
    if other >= write_quorum:
        return "stale"
    if same >= write_quorum:
        return "confirmed"
    return "wait"


def pass_order(hints: Sequence[tuple[str, K]], budget: int = PASS_BUDGET) -> list[K]:
    """At most ``budget`` of ``hints`` (``(query, key)`` in hand-off order), taken
    round-robin over the queries (each query's in its own order), so one query's hints never
    starve another's."""
    by: dict[str, list[K]] = {}
    for query, key in hints:
        by.setdefault(query, []).append(key)
    out: list[K] = []
    depth = max((len(keys) for keys in by.values()), default=0)
    for r in range(depth):
        for keys in by.values():
            if r < len(keys):
                out.append(keys[r])
                if len(out) >= budget:
                    return out
    return out


def next_wait(progress: bool, previous: float, base: float, cap: float = MAX_WAIT) -> float:
    """Seconds before the next pass: ``base`` after a pass that decided something (or with
    nothing held), else twice the previous wait, up to ``cap``."""
    if progress:
        return base
    return min(cap, max(base, previous * 2))


def expired(first_seen: float, now: float, ttl: float = HINT_TTL) -> bool:
    """Whether a hint undecidable since ``first_seen`` has waited past ``ttl``."""
    return now - first_seen > ttl
