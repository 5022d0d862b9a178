"""Repair decisions (pure): who copies what after the ring changed.

When a node is lost, each lost copy is made by exactly one surviving holder, chosen by
rendezvous hashing over the item's previous replicas that are still alive, so that the work
spreads evenly and nobody needs to coordinate (DESIGN.md, Repair).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import xxhash

from statestore.core.errors import NodeUnavailable
from statestore.core.view import RingView

__all__ = ["mine_to_push", "pick_source"]


def pick_source(key: str, holders: Sequence[str]) -> str:
    """The one holder that re-replicates ``key`` (rendezvous hashing): every holder computes
    the same answer without talking, and the work spreads evenly over the holders."""
    if not holders:
        raise NodeUnavailable(f"item {key} has no live holder to copy it from")
    return max(holders, key=lambda h: (xxhash.xxh64_intdigest(f"{key}|{h}".encode()), h))


def mine_to_push(view: RingView, live: Collection[str], key: str, me: str) -> bool:
    """Whether node ``me`` is the one to push ``key`` to its owners: the holder
    :func:`pick_source` names among the item's previous replicas still alive, or any node
    that holds it for another reason (a hand-off)."""
    holders = [a for a in view.previous_replicas(key) if a in live]
    if me not in holders:
        return True
    return pick_source(key, holders) == me
