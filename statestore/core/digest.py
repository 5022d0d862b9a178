"""Range digests for anti-entropy (pure): what two nodes hold in a token range, compared
without listing it.

Repair, hand-over and hint hand-off ask a peer which of the items they hold it lacks
(``/v1/sync/have``). Listing every item costs what a node holds, not what differs. So before
listing, the asker cuts its items for each peer into token ranges (the ring's own: within
one, every item has the same owners, so two owners in sync hold the same set) and sends one
digest per range; the peer answers the ranges where its digest differs, each with the
digests of ``LEAVES`` leaves (the items of the range split by their hash). Only the asker's
items in differing leaves are listed. Two rounds for what differs, one for what does not:
the messages grow with the ring's ranges and with what differs; each side still reads its
own item names once per exchange (a key scan, no values but the manifests' epochs).

A digest is the count and the XOR of 128-bit hashes of the item names (``c:<chunk key>``,
``m:<store>/<version>/<kind>/<epoch>``, core/items.py), seeded per exchange by the asker,
so names cannot be chosen to make two different sets collide. Equal digests mean the peer
holds every item the asker holds in that range (it may hold more: a more and a fewer never
match, and a difference only costs the listing it would have cost anyway).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import xxhash

from statestore.core.items import placement_key
from statestore.core.placement import item_token

__all__ = [
    "LEAVES",
    "MAX_DIGEST_RANGES",
    "MAX_LEAF_RANGES",
    "Digest",
    "answer",
    "group",
    "item_hash",
    "leaf_of",
    "narrow",
    "segments",
    "token_of",
]

LEAVES = 64
LEAF_SHIFT = 128 - 6  # the top 6 bits of an item's hash name its leaf
MAX_DIGEST_RANGES = 8192  # ranges in one request
MAX_LEAF_RANGES = 512  # differing ranges answered with leaves; the rest are listed whole
TOKEN_MAX = 2**64 - 1


@dataclass(frozen=True)
class Digest:
    """The count and XOR of the hashes of a set of item names."""

    count: int = 0
    xor: int = 0


def token_of(item: str) -> int:
    """An item's ring token: a chunk's key, or a manifest's store path."""
    return item_token(placement_key(item))


def item_hash(item: str, seed: int) -> int:
    return xxhash.xxh3_128_intdigest(item.encode(), seed=seed)


def leaf_of(h: int) -> int:
    return h >> LEAF_SHIFT


def segments(cuts: Sequence[int]) -> list[tuple[int, int]]:
    """The token space cut after each of the sorted ring tokens ``cuts``: inclusive
    ``(lo, hi)`` ranges covering 0..2^64-1, the range ``i`` ending at ``cuts[i]`` (an item
    with token ``t`` is in range ``bisect_left(cuts, t)``; the last range wraps to the
    first's owners on the ring, but is digested on its own)."""
    out = []
    lo = 0
    for c in sorted(set(cuts)):
        out.append((lo, c))
        lo = c + 1
    if lo <= TOKEN_MAX:
        out.append((lo, TOKEN_MAX))
    return out


def group(items: Iterable[str], ranges: Sequence[tuple[int, int]]) -> dict[int, list[str]]:
    """Items by the index of the range (sorted, disjoint, as :func:`segments` gives) holding
    their token; an item outside every range is left out."""
    los = [lo for lo, _ in ranges]
    out: dict[int, list[str]] = defaultdict(list)
    for it in items:
        t = token_of(it)
        i = bisect.bisect_right(los, t) - 1
        if i >= 0 and t <= ranges[i][1]:
            out[i].append(it)
    return dict(out)


def fold(items: Iterable[str], seed: int) -> Digest:
    count, xor = 0, 0
    for it in items:
        count += 1
        xor ^= item_hash(it, seed)
    return Digest(count, xor)


def leaves(items: Iterable[str], seed: int) -> list[Digest]:
    count = [0] * LEAVES
    xor = [0] * LEAVES
    for it in items:
        h = item_hash(it, seed)
        leaf = leaf_of(h)
        count[leaf] += 1
        xor[leaf] ^= h
    return [Digest(c, x) for c, x in zip(count, xor, strict=True)]


def answer(
    held: Iterable[str], asked: Sequence[tuple[int, int, Digest]], seed: int
) -> list[tuple[int, list[Digest] | None]]:
    """The peer's side: for each asked ``(lo, hi, digest)`` whose digest differs from that of
    the items ``held`` in ``[lo, hi]``, its index and its leaves' digests (None past
    ``MAX_LEAF_RANGES`` differing ranges: those are listed whole). ``asked`` is sorted and
    disjoint (the wire checks it)."""
    ranges = [(lo, hi) for lo, hi, _ in asked]
    mine = group(held, ranges)
    out: list[tuple[int, list[Digest] | None]] = []
    for i, (_, _, theirs) in enumerate(asked):
        items = mine.get(i, [])
        if fold(items, seed) == theirs:
            continue
        out.append((i, leaves(items, seed) if len(out) < MAX_LEAF_RANGES else None))
    return out


def narrow(
    grouped: Mapping[int, Sequence[str]],
    differ: Mapping[int, Sequence[Digest] | None],
    seed: int,
) -> tuple[list[str], list[str]]:
    """The asker's side, given what the peer answered for the ranges it sent (``grouped``: its
    items by range index, ``differ``: the peer's answer by index): the items the peer is now
    known to hold, and those still to be listed (in a differing leaf, or a differing range
    answered without leaves)."""
    held: list[str] = []
    ask: list[str] = []
    for i, items in grouped.items():
        if i not in differ:
            held.extend(items)
            continue
        theirs = differ[i]
        if theirs is None or len(theirs) != LEAVES:
            ask.extend(items)
            continue
        by_leaf: dict[int, list[str]] = defaultdict(list)
        for it in items:
            by_leaf[leaf_of(item_hash(it, seed))].append(it)
        for leaf, its in by_leaf.items():
            (held if fold(its, seed) == theirs[leaf] else ask).extend(its)
    return held, ask
