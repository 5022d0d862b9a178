"""Client tokens (pure): who may do what to which queries.

The tokens file (``--auth-file``) is a JSON object of bearer tokens, each scoped to query
names (exact, or a prefix ending in ``*``; ``*`` alone is every query) and rights::

    {"TOKEN": {"queries": ["q1", "etl-*"], "rights": ["read", "write"]}}

A token may also carry rates, enforced per node (core/ratelimit): ``"requests_per_second"``
and ``"bytes_per_second"`` (bodies in and answers out), positive numbers; absent: unlimited; and
``"max_in_flight"``, a limited token's requests at once on a node (default 16).

``read``: heads, versions, manifests, chunks, restores; ``write``: chunks, manifests,
commits; ``admin``: retention floors (gc), drop and membership commands. Rights do not imply
each other. :func:`parse_tokens` checks a file's content; :meth:`Grants.authorize` decides a
request (Unauthenticated: no or unknown token, 401; Forbidden: outside the token's scope, 403).
Tokens are kept by their SHA-256 only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from statestore.core.errors import Forbidden, Unauthenticated
from statestore.core.ratelimit import MAX_IN_FLIGHT, Limits

__all__ = ["RIGHTS", "Grant", "Grants", "parse_tokens"]

RIGHTS = ("read", "write", "admin")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class Grant:
    """One token's scope."""

    name: str  # the token's first characters, for messages and logs
    queries: tuple[str, ...]
    rights: frozenset[str]
    limits: Limits = field(default=Limits())
    # the token's digest: its rate buckets are kept under it
    key: bytes = field(default=b"", repr=False)

    def covers(self, query: str) -> bool:
        for p in self.queries:
            if p == "*" or p == query or (p.endswith("*") and query.startswith(p[:-1])):
                return True
        return False


@dataclass(frozen=True)
class Grants:
    by_digest: Mapping[bytes, Grant]

    def authenticate(self, token: str | None) -> Grant:
        if not token:
            raise Unauthenticated(
                "this node requires a bearer token: send `Authorization: Bearer <token>` "
                "(SDK token=..., or set STATESTORE_TOKEN)"
            )
        grant = self.by_digest.get(_digest(token))
        if grant is None:
            raise Unauthenticated(
                "the bearer token is not in this node's --auth-file: check STATESTORE_TOKEN"
            )
        return grant

    @staticmethod
    def authorize(grant: Grant, right: str, query: str | None) -> None:
        """Raise Forbidden unless ``grant`` has ``right`` on ``query`` (None: any query)."""
        if right not in grant.rights:
            raise Forbidden(
                f"token {grant.name}… lacks the {right!r} right"
                + (f" (for query {query!r})" if query else "")
                + f"; it has {sorted(grant.rights)}: ask for a token with {right!r}"
            )
        if query is not None and not grant.covers(query):
            raise Forbidden(
                f"token {grant.name}… does not cover query {query!r} (its queries: "
                f"{list(grant.queries)}): use a token scoped to it"
            )


def parse_tokens(raw: bytes) -> Grants:
    """The grants in a tokens file; ValueError naming the first problem."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"tokens file is not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError('tokens file must be an object {"TOKEN": {"queries", "rights"}}')
    out: dict[bytes, Grant] = {}
    for token, spec in obj.items():
        if not token:
            raise ValueError("a token is empty")
        if not isinstance(spec, dict):
            raise ValueError(f"token {token[:4]}…: its value must be an object")
        queries, rights = spec.get("queries"), spec.get("rights")
        if not (isinstance(queries, list) and all(isinstance(q, str) and q for q in queries)):
            raise ValueError(f"token {token[:4]}…: queries must be a list of names or prefix*")
        if not (isinstance(rights, list) and all(r in RIGHTS for r in rights)):
            raise ValueError(f"token {token[:4]}…: rights must be a list of {list(RIGHTS)}")
        rates = {}
        for name in ("requests_per_second", "bytes_per_second"):
            rate = spec.get(name)
            if rate is None:
                continue
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
                raise ValueError(f"token {token[:4]}…: {name} must be a positive number")
            rates[name] = float(rate)
        cap = spec.get("max_in_flight", MAX_IN_FLIGHT)
        if isinstance(cap, bool) or not isinstance(cap, int) or not 0 < cap <= 10_000:
            raise ValueError(f"token {token[:4]}…: max_in_flight must be an integer 1-10000")
        limits = Limits(
            rates.get("requests_per_second"), rates.get("bytes_per_second"), max_in_flight=cap
        )
        key = _digest(token)
        out[key] = Grant(token[:4], tuple(queries), frozenset(rights), limits, key)
    return Grants(out)
