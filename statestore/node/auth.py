"""Who is asking: node signatures and client tokens at the HTTP boundary (docs/security.md).

:func:`auth_middleware` authenticates every request but ``GET /v1/health``: a valid node
signature (core/identity) makes the caller a *node*; otherwise, when the node has a tokens
file, a valid bearer token makes it a *token* holder; otherwise it is *open* (no auth
configured). Routes for ring nodes only (gossip, anti-entropy) refuse anything but a node
when a cluster secret is set, and so do retention floors (gc) unless a tokens file lets an
``admin`` token send them. Handlers then call :func:`allow` with the right and the query
they touch: a node and an open caller pass, a token must cover them (core/access).

The tokens file is re-read when its modification time or size changes; a file that no longer
parses keeps the previous tokens and is reported in ``/v1/health``.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from statestore.core.access import Grant, Grants, parse_tokens
from statestore.core.errors import Forbidden, Unauthenticated
from statestore.core.identity import (
    SIGNATURE_HEADER,
    ReplayGuard,
    parse_secret,
    signed_headers,
    verify,
)
from statestore.core.ratelimit import Limiter
from statestore.node.watched import WatchedFile

__all__ = ["Access", "Principal", "allow", "principal"]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# the dashboard's static files hold no data (its script sends the token for the JSON it reads)
DASHBOARD = (
    "/dashboard",
    "/dashboard/index.html",
    "/dashboard/dashboard.js",
    "/dashboard/dashboard.css",
)
OPEN_PATHS = frozenset({"/v1/health", *DASHBOARD})
NODE_ONLY = frozenset({"/v1/gossip", "/v1/sync/have", "/v1/sync/digest"})
# Routes whose handlers (node/operations and friends) do not authorize themselves: the right
# each needs, and the query when the path names one (group ``q``).
_POLICY: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^/v1/queries/(?P<q>[^/]+)/(drop|purge)$"), "admin"),
    (re.compile(r"^/v1/queries/(?P<q>[^/]+)$"), "read"),
    (re.compile(r"^/v1/queries/(?P<q>[^/]+)/room$"), "write"),
    (re.compile(r"^/v1/tombstones$"), "admin"),
    (re.compile(r"^/v1/inventory$"), "admin"),
    (re.compile(r"^/v1/inventory/(?P<q>[^/]+)/"), "read"),
    (re.compile(r"^/v1/stores/(?P<q>[^/]+)/[^/]+/[^/]+/[^/]+/key$"), "read"),
    (re.compile(r"^/v1/activity$"), "read"),
)


def is_open(path: str) -> bool:
    """Whether ``path`` is served without credentials (health, the dashboard's files)."""
    return path in OPEN_PATHS


def route_policy(path: str) -> tuple[str, str | None] | None:
    """The right (and query) a route outside node/api.py needs, or None: its handler
    authorizes, or any authenticated caller may use it (``/metrics``)."""
    for pattern, right in _POLICY:
        m = pattern.match(path)
        if m is not None:
            return right, m.groupdict().get("q")
    return None


@dataclass(frozen=True)
class Principal:
    kind: str  # "node" | "token" | "open"
    grant: Grant | None = None
    node: str = ""


OPEN = Principal("open")


class TokenFile(WatchedFile[Grants]):
    """A tokens file, re-read when it changes (node/watched.py)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, parse_tokens, "--auth-file", "tokens")

    @property
    def grants(self) -> Grants:
        return self.value


class Access:
    """A node's credentials and checks.

    Args:
        node_id: this node's id (sent with its signatures).
        secret_file: the ring's shared secret (``--cluster-secret-file``), or None: then
            internal routes are open, and the node signs its calls to itself with a key of
            its own (so a tokens file alone works on a one-node ring).
        auth_file: the tokens file (``--auth-file``), or None: no client tokens.
    """

    def __init__(self, node_id: str, secret_file: str | None, auth_file: str | None) -> None:
        self.node_id = node_id
        self.secret: bytes | None = None
        if secret_file:
            with open(secret_file, "rb") as f:
                self.secret = parse_secret(f.read(), f"--cluster-secret-file {secret_file}")
        self._key = self.secret or secrets.token_bytes(32)
        self.tokens = TokenFile(auth_file) if auth_file else None
        self.limiter = Limiter()
        self.replays = ReplayGuard()

    @property
    def identity_on(self) -> bool:
        return self.secret is not None

    def outbound(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """Headers that sign one outbound request of this node."""
        return signed_headers(self._key, method, path, body, self.node_id, time.time())

    def authenticate(self, request: web.Request, body: bytes | None) -> Principal:
        """Who sent ``request``; ``body`` is its body when it may carry a node signature."""
        if body is not None and SIGNATURE_HEADER in request.headers:
            try:
                node = verify(
                    [self._key],
                    request.method,
                    request.raw_path,
                    request.headers,
                    body,
                    time.time(),
                    self.replays,
                )
                return Principal("node", node=node)
            except Unauthenticated:
                if self.identity_on:
                    raise
                # no ring secret: another node's call, signed with its own key; judged as
                # an unsigned request below

        internal = request.path in NODE_ONLY or (
            request.path.endswith("/gc") and self.tokens is None  # else: an admin token
        )
        if self.identity_on and internal:
            verify([], request.method, request.raw_path, request.headers, b"", time.time())
        if self.tokens is None:
            return OPEN
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if auth and scheme.lower() != "bearer":
            raise Unauthenticated(
                f"Authorization scheme {scheme!r:.20} is not supported: send "
                "`Authorization: Bearer <token>`"
            )
        return Principal("token", grant=self.tokens.current().authenticate(token.strip()))

    def admit(self, p: Principal, body_bytes: int) -> None:
        """Take a request of ``p`` from its token's rates (RateLimited when over them)."""
        if p.grant is not None and p.grant.limits.limited:
            self.limiter.admit(p.grant.key, p.grant.limits, body_bytes, time.monotonic())

    def charge(self, p: Principal, nbytes: int) -> None:
        """Charge the bytes of an answer to ``p``'s token."""
        if p.grant is not None and p.grant.limits.limited:
            self.limiter.charge(p.grant.key, p.grant.limits, nbytes, time.monotonic())

    def problems(self) -> list[str]:
        return [self.tokens.error] if self.tokens is not None and self.tokens.error else []


PRINCIPAL = web.RequestKey("principal", Principal)


def principal(request: web.Request) -> Principal:
    p: Principal = request.get(PRINCIPAL, OPEN)
    return p


def allow(request: web.Request, right: str, query: str | None = None) -> None:
    """Raise Forbidden unless the caller may use ``right`` on ``query`` (None: any)."""
    p = principal(request)
    if p.grant is not None:
        Grants.authorize(p.grant, right, query)


def allow_ring(request: web.Request) -> None:
    """Raise Forbidden unless the caller may change the ring itself (decommission, token
    moves): a node, an open caller, or a token with ``admin`` on every query (``"*"``). A
    token scoped to some queries moves none of the ring's data."""
    p = principal(request)
    if p.grant is None:
        return
    Grants.authorize(p.grant, "admin", None)
    if "*" not in p.grant.queries:
        raise Forbidden(
            f"token {p.grant.name}… is scoped to queries {list(p.grant.queries)}: changing "
            'the ring (decommission, token moves) needs an admin token for every query ("*")'
        )


def is_node(request: web.Request) -> bool:
    return principal(request).kind == "node"
