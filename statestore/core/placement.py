"""Consistent-hashing placement (pure): 64-bit xxhash tokens, virtual nodes, zone-aware replicas.

Every physical node owns ``vnodes`` tokens ``xxh64("<node id>#<i>")``, ``i`` from 0: the ring's
default count, or the member's own (:attr:`Member.vnodes`, which ``statestore rebalance`` moves:
a member given more tokens keeps the ones it had and takes the next ones, so a change of count
moves only the ranges of the tokens added or removed). An item's token is
``xxh3_64(key)``; its replicas are the first ``R`` distinct physical nodes met walking the ring
clockwise from that token. When nodes declare zones, the walk first takes nodes of zones not
yet used and fills up from the rest only when there are fewer zones than ``R`` (docs/design.md,
Placement). ``preference`` continues the same walk over every node, which is the order in
which a reader tries holders.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import xxhash

__all__ = ["DEFAULT_VNODES", "Member", "Ring", "item_token", "node_tokens"]

DEFAULT_VNODES = 256
RING_SIZE = 2**64


@dataclass(frozen=True, order=True)
class Member:
    """A physical node as placement sees it; ``vnodes`` 0 means the ring's default count."""

    id: str
    zone: str = ""
    vnodes: int = 0


def node_tokens(node_id: str, vnodes: int) -> list[int]:
    return list(_node_tokens(node_id, vnodes))


@functools.lru_cache(maxsize=4096)
def _node_tokens(node_id: str, vnodes: int) -> tuple[int, ...]:
    # the balancer builds many rings of the same members (core/balance.py)
    return tuple(xxhash.xxh64_intdigest(f"{node_id}#{i}".encode()) for i in range(vnodes))


def item_token(key: str | bytes) -> int:
    return xxhash.xxh3_64_intdigest(key.encode() if isinstance(key, str) else key)


class Ring:
    """An immutable ring over a set of members."""

    def __init__(self, members: Iterable[Member], vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be at least 1, got {vnodes}")
        self.members: tuple[Member, ...] = tuple(sorted(set(members)))
        if any(m.vnodes < 0 for m in self.members):
            raise ValueError("a member's vnodes is 0 (the ring's count) or more")
        self.vnodes = vnodes
        self._weights = {m.id: m.vnodes or vnodes for m in self.members}
        pairs = sorted(
            (tok, m.id) for m in self.members for tok in _node_tokens(m.id, self._weights[m.id])
        )
        self._tokens = [t for t, _ in pairs]
        self._owners = [o for _, o in pairs]
        self._zone = {m.id: m.zone for m in self.members}
        self._zoned = len({m.zone for m in self.members}) > 1

    def __len__(self) -> int:
        return len(self.members)

    @property
    def tokens(self) -> list[int]:
        """Every virtual node's token, sorted (the ends of the ring's ranges)."""
        return list(self._tokens)

    def weight(self, node_id: str) -> int:
        """How many tokens ``node_id`` owns on this ring."""
        return self._weights[node_id]

    def preference(self, key: str | bytes) -> list[str]:
        """Every node, in the order the clockwise walk from ``key``'s token meets them."""
        if not self._tokens:
            return []
        return self._walk(bisect.bisect_left(self._tokens, item_token(key)))

    def token_replicas(self, token: int, r: int) -> list[str]:
        """The ``r`` nodes that hold an item whose token is ``token`` (cached per range: the
        balancer asks for thousands of points of one ring)."""
        if not self._tokens:
            return []
        i = bisect.bisect_left(self._tokens, token) % len(self._tokens)
        cache = self.__dict__.setdefault("_ranges", {})
        got: list[str] | None = cache.get((i, r))
        if got is None:
            got = cache[(i, r)] = self._choose(self._walk(i), r)
        return got

    def _walk(self, start: int) -> list[str]:
        seen: list[str] = []
        seen_set: set[str] = set()
        n = len(self._tokens)
        total = len(self.members)
        for i in range(n):
            owner = self._owners[(start + i) % n]
            if owner not in seen_set:
                seen_set.add(owner)
                seen.append(owner)
                if len(seen) == total:
                    break
        return seen

    def replicas(self, key: str | bytes, r: int) -> list[str]:
        """The ``r`` nodes that hold ``key`` (fewer if the ring is smaller). Through the
        per-range cache: a listing or a repair scan asks for every key a node holds, and the
        walk to the range's ``r`` owners was most of that (docs/benchmarks.md)."""
        return list(self.token_replicas(item_token(key), r))

    def _choose(self, walk: list[str], r: int) -> list[str]:
        if not self._zoned:
            return walk[:r]
        chosen: list[str] = []
        zones: set[str] = set()
        for node in walk:
            if len(chosen) == r:
                break
            if self._zone[node] not in zones:
                chosen.append(node)
                zones.add(self._zone[node])
        for node in walk:
            if len(chosen) == r:
                break
            if node not in chosen:
                chosen.append(node)
        return chosen

    def shares(self) -> dict[str, float]:
        """Each node's fraction of the token space it is primary for."""
        out = {m.id: 0.0 for m in self.members}
        n = len(self._tokens)
        for i in range(n):
            prev = self._tokens[i - 1] if i else self._tokens[-1] - RING_SIZE
            out[self._owners[i]] += (self._tokens[i] - prev) / RING_SIZE
        return out

    def coverage(self, r: int) -> dict[str, float]:
        """Each node's fraction of the token space it holds a replica of (they add up to
        ``min(r, len(self))``): the share of uniformly spread data each node holds."""
        out = {m.id: 0.0 for m in self.members}
        n = len(self._tokens)
        for i in range(n):
            prev = self._tokens[i - 1] if i else self._tokens[-1] - RING_SIZE
            width = (self._tokens[i] - prev) / RING_SIZE
            for node in self._choose(self._walk(i), r):
                out[node] += width
        return out

    def primary_counts(self, keys: Sequence[str]) -> dict[str, int]:
        out = {m.id: 0 for m in self.members}
        for k in keys:
            out[self.preference(k)[0]] += 1
        return out
