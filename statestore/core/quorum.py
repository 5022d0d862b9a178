"""Quorum rules (pure): how many acknowledgements make a write, how many answers make a read.

A write of R copies is acknowledged at W durable copies; a read that asks every replica and
hears from at least ``R - W + 1`` of them is sure to meet one of the W that acknowledged the
latest commit (R=3, W=2: two answers). Heads merge by maximum ``(epoch, version)``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from statestore.core.errors import InvalidRequest, QuorumNotReached, StateStoreError
from statestore.core.manifest import Head

__all__ = [
    "CONSISTENCY",
    "check_consistency",
    "check_write",
    "check_write_sets",
    "held_at_w",
    "home_need",
    "merge_heads",
    "read_answers",
    "read_quorum",
    "validate_rw",
    "write_acks",
]

# Per-request consistency: how many replicas a commit waits for, a read hears from.
CONSISTENCY = ("one", "quorum", "all")


def validate_rw(replicas: int, write_quorum: int) -> None:
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if not 1 <= write_quorum <= replicas:
        raise ValueError(f"write quorum must be in 1..{replicas}, got {write_quorum}")


def read_quorum(replicas: int, write_quorum: int) -> int:
    return max(1, replicas - write_quorum + 1)


def check_consistency(consistency: object) -> str:
    if consistency not in CONSISTENCY:
        raise InvalidRequest(
            f"consistency must be one of {', '.join(CONSISTENCY)}, got {consistency!r}"
        )
    assert isinstance(consistency, str)
    return consistency


def write_acks(consistency: str, replicas: int, write_quorum: int) -> int:
    """Durable copies a commit waits for: ``one`` 1, ``quorum`` W, ``all`` R. A commit is
    sent to every replica whatever the level; the level only says how many must have
    acknowledged before it succeeds."""
    check_consistency(consistency)
    return {"one": 1, "quorum": write_quorum, "all": replicas}[consistency]


def read_answers(consistency: str, replicas: int, write_quorum: int) -> int:
    """Replica answers a head or chain read needs: ``one`` 1, ``quorum`` R - W + 1 (meets
    every W-acknowledged commit), ``all`` R."""
    check_consistency(consistency)
    return {"one": 1, "quorum": read_quorum(replicas, write_quorum), "all": replicas}[consistency]


def check_write(
    what: str,
    acks: int,
    write_quorum: int,
    placed: int,
    errors: Sequence[BaseException],
) -> None:
    """Raise QuorumNotReached unless ``acks >= write_quorum``."""
    if acks >= write_quorum:
        return
    why = "; ".join(sorted({str(e) for e in errors})) or "no replica answered"
    if placed < write_quorum:
        why = f"the ring has only {placed} live node(s) for it; {why}"
    raise QuorumNotReached(
        f"{what} reached {acks} of the {write_quorum} replicas it needs (W): {why}. "
        "Nothing was acknowledged; retry when the ring has enough live nodes"
    )


def check_write_sets(
    what: str,
    acked: Collection[str],
    current: Sequence[str],
    future: Sequence[str],
    write_quorum: int,
    errors: Sequence[BaseException],
    homes: Sequence[str] = (),
) -> None:
    """Raise QuorumNotReached unless W of the current owners *and* W of the future owners
    acknowledged (``acked``: the addresses that did). While a node joins or leaves, a write
    goes to both sets (core/handover.py): W among the current owners keeps it readable by
    the quorum reads of today's ring, W among the future ones keeps it readable after the
    switch. With nobody moving the two sets are one and this is :func:`check_write`.

    ``homes``: the item's home replicas (core/view ``write_homes``: its owners on the ring
    counting down members), of which a manifest needs W too, down ones included: a stand-in's
    acknowledgement is a hint that the down home replica gets later, and does not count
    toward what a read quorum of the home replicas must meet (:func:`home_need`)."""
    check_write(what, sum(1 for a in current if a in acked), write_quorum, len(current), errors)
    if list(future) != list(current):
        check_write(
            f"{what} (on its owners after the move)",
            sum(1 for a in future if a in acked),
            write_quorum,
            len(future),
            errors,
        )
    if homes and not set(current) <= set(homes):
        need = home_need(homes, write_quorum)
        got = sum(1 for a in homes if a in acked)
        if got < need:
            check_write(f"{what} (on its home replicas)", got, need, len(homes), errors)


def home_need(homes: Sequence[str], write_quorum: int) -> int:
    """Acknowledgements a manifest needs from its home replicas ``homes`` (down ones
    included): W, or all of them on a ring of fewer members. With R=3 and W=2, a store two of
    whose home replicas are down takes no commit until one is back or is removed for good
    (`statestore removenode`), as a quorum write in Cassandra counts no hint."""
    return min(write_quorum, len(homes))


def held_at_w(
    held: Collection[str], owners: Sequence[str], homes: Sequence[str], write_quorum: int
) -> bool:
    """Whether the replicas ``held`` that hold a manifest make it as acknowledged as a write
    would (:func:`check_write_sets`): W of its ``owners``, and W of its ``homes``
    (core/view ``write_homes``) among them when the owners are not all home replicas."""
    if sum(1 for a in owners if a in held) < write_quorum:
        return False
    if not homes or set(owners) <= set(homes):
        return True
    return sum(1 for a in homes if a in held) >= home_need(homes, write_quorum)


def merge_heads(heads: Iterable[Head | None]) -> Head | None:
    best: Head | None = None
    for h in heads:
        if h is not None and (best is None or h.key() > best.key()):
            best = h
    return best


def first_semantic(errors: Iterable[BaseException]) -> StateStoreError | None:
    """The first error that is about the request rather than about availability."""
    from statestore.core.errors import Unavailable

    for e in errors:
        if isinstance(e, StateStoreError) and not isinstance(e, Unavailable):
            return e
    return None
