"""Per-query storage quotas (pure): what a query holds on a node, and whether a write fits.

The quotas file (``statestore node --quota-file F``, reloaded when it changes) maps query
names to the most bytes each query may hold *on this node*::

    {"q1": {"max_bytes": 1073741824}, "etl-*": {"max_bytes": 10737418240}, "*": {"max_bytes": 0}}

Names follow the token scopes of core/access: an exact query name, a prefix ending in ``*``,
or ``*`` alone (every query). A query takes the most specific rule: its exact name, else the
longest matching prefix. A prefix rule gives *each* query it matches that many bytes (not one
pool shared by all of them); ``"max_bytes": 0`` forbids new data. A query no rule names has no
quota.

What is counted: the bytes of the values this node stores for the query's chunks (``c:``)
and manifests (``m:`` and the replaced epochs kept beside them, ``o:``): every retained
version, old ones included, since they occupy the disk. Heads, floors and retention settings
(a few bytes per store) are not counted. A quota is per node: for a ring-wide budget B over N
nodes with R replicas, set ``max_bytes`` to about B x R / N, with some headroom for uneven
placement (docs/security.md).

:func:`charges` turns one storage write (the old sizes of the keys it touches, the new sizes
of what it puts, what it deletes) into per-query byte deltas; :func:`check` decides whether a
write's delta fits; :class:`Usage` keeps the counters. No I/O here: the node's store
(node/replica.py) looks sizes up and applies the decisions under its writer lock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from statestore.core.errors import QuotaExceeded
from statestore.core.ids import MAX_NAME_LEN
from statestore.core.items import Prefix

__all__ = [
    "COUNTED_PREFIXES",
    "MAX_QUOTA_BYTES",
    "RECORD_SEAL",
    "Quotas",
    "Rule",
    "Usage",
    "charges",
    "check",
    "parse_quotas",
    "query_of_key",
]

MAX_QUOTA_BYTES = 2**62
# storage keys whose values count against their query (node/replica.py's key layout):
# chunks, manifests, the replaced epochs kept beside them, tentative commits' hints
COUNTED_PREFIXES = (Prefix.CHUNK, Prefix.MANIFEST, Prefix.REPLACED, Prefix.HINT)
# bytes a stored manifest or hint record adds to its encoding: its seal (node/replica.py), so
# a writer's room check (net/writes.check_room) asks for what the replica will charge
RECORD_SEAL = 9
_NAME = re.compile(r"[A-Za-z0-9._-]*")  # fullmatch: "$" passes a trailing newline


@dataclass(frozen=True)
class Rule:
    pattern: str  # an exact query name, a prefix ending in ``*``, or ``*``
    max_bytes: int

    def matches(self, query: str) -> bool:
        p = self.pattern
        return p == query or (p.endswith("*") and query.startswith(p[:-1]))

    @property
    def specificity(self) -> tuple[int, int]:
        """Exact names beat prefixes; a longer prefix beats a shorter one."""
        exact = not self.pattern.endswith("*")
        return (1 if exact else 0, len(self.pattern))


@dataclass(frozen=True)
class Quotas:
    rules: tuple[Rule, ...] = ()

    def rule(self, query: str) -> Rule | None:
        """The most specific rule for ``query`` (None: it has no quota)."""
        best: Rule | None = None
        for r in self.rules:
            if r.matches(query) and (best is None or r.specificity > best.specificity):
                best = r
        return best

    def limit(self, query: str) -> int | None:
        r = self.rule(query)
        return None if r is None else r.max_bytes

    def __bool__(self) -> bool:
        return bool(self.rules)


def parse_quotas(raw: bytes) -> Quotas:
    """The rules of a quotas file; ValueError naming the first problem."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"quotas file is not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError('quotas file must be an object {"QUERY or PREFIX*": {"max_bytes": N}}')
    rules = []
    for pattern, spec in obj.items():
        stem = pattern[:-1] if pattern.endswith("*") else pattern
        if (
            not pattern
            or len(pattern) > MAX_NAME_LEN
            or not _NAME.fullmatch(stem)
            or (not pattern.endswith("*") and pattern in (".", ".."))
        ):
            raise ValueError(
                f"quota for {pattern[:40]!r}: a query name (letters, digits, ._-, at most "
                f"{MAX_NAME_LEN}), a prefix ending in *, or * alone"
            )
        if not isinstance(spec, dict):
            raise ValueError(f'quota for {pattern!r}: its value must be {{"max_bytes": N}}')
        unknown = set(spec) - {"max_bytes"}
        if unknown:
            raise ValueError(f"quota for {pattern!r}: unknown field(s) {sorted(unknown)}")
        limit = spec.get("max_bytes")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit:
            raise ValueError(
                f"quota for {pattern!r}: max_bytes must be a whole number of bytes >= 0, "
                f"got {limit!r}"
            )
        if limit > MAX_QUOTA_BYTES:
            raise ValueError(f"quota for {pattern!r}: max_bytes is above 2^62")
        rules.append(Rule(pattern, limit))
    return Quotas(tuple(rules))


def query_of_key(key: bytes) -> str | None:
    """The query a counted storage key belongs to (None: a key that is not counted). Every
    prefix is two bytes (core/items.Prefix), the rest starts with a store path."""
    if key[:2] not in COUNTED_PREFIXES:
        return None
    query, sep, _ = key[2:].partition(b"/")
    return query.decode() if sep and query else None


def charges(
    old: Mapping[bytes, int | None], puts: Mapping[bytes, int], deletes: Iterable[bytes]
) -> dict[str, int]:
    """Per-query byte deltas of one atomic write: ``old`` holds the current value size of
    every counted key the write touches (None: absent), ``puts`` the new sizes. Deletes
    apply before puts (node/backends.py), so a key both deleted and put ends up put. Queries
    whose delta is 0 are left out."""
    out: dict[str, int] = {}
    for key in {*deletes, *puts}:
        query = query_of_key(key)
        if query is None:
            continue
        delta = puts.get(key, 0) - (old.get(key) or 0)
        if delta:
            out[query] = out.get(query, 0) + delta
    return out


def check(query: str, usage: int, delta: int, limit: int | None) -> None:
    """Raise QuotaExceeded when a write adding ``delta`` bytes to ``query`` (holding
    ``usage``) would take it over ``limit``. A write that frees bytes, or adds none (the same
    chunk again), always passes, even over the limit."""
    if limit is None or delta <= 0 or usage + delta <= limit:
        return
    raise QuotaExceeded(
        f"query {query!r} holds {usage} bytes on this node and its quota is {limit} bytes: "
        f"a write of {delta} more is refused (nothing was stored). Let retention collect old "
        "versions, drop the query, or raise its max_bytes in the node's --quota-file"
    )


class Usage:
    """Bytes held per query, kept up to date write by write (rebuilt from a scan at start)."""

    def __init__(self, by_query: Mapping[str, int] | None = None) -> None:
        self._bytes: dict[str, int] = dict(by_query or {})

    def of(self, query: str) -> int:
        return self._bytes.get(query, 0)

    def apply(self, deltas: Mapping[str, int]) -> None:
        for query, delta in deltas.items():
            left = self._bytes.get(query, 0) + delta
            if left > 0:
                self._bytes[query] = left
            else:
                self._bytes.pop(query, None)

    def snapshot(self) -> dict[str, int]:
        return dict(self._bytes)

    @classmethod
    def from_sizes(cls, sizes: Iterable[tuple[bytes, int]]) -> Usage:
        u: dict[str, int] = {}
        for key, size in sizes:
            query = query_of_key(key)
            if query is not None:
                u[query] = u.get(query, 0) + size
        return cls(u)
