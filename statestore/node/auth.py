"""Who is asking: node signatures and client tokens at the HTTP boundary (docs/security.md).

:func:`auth_middleware` authenticates every request but the open routes (health, the
dashboard's files): a valid node signature (core/identity) makes the caller a *node*;
otherwise, when the node has a tokens file, a valid bearer token makes it a *token* holder;
otherwise it is *open* (no tokens file). What each route needs is one table
(node/policy.py): with a cluster secret, its node-only routes and requests (gossip,
anti-entropy, copies, hand-over listings, purges, ``?copy=1``) refuse anything but a valid
signature, whatever the tokens file; :func:`enforce` checks a token's right on the query the
path names, and handlers then call :func:`allow` for the queries a body names: a node and an
open caller pass, a token must cover them (core/access). A tokens file needs a cluster
secret (node/config.py), so tokens only ever go to processes that proved they are nodes.

The tokens file is re-read when its modification time or size changes; a file that no longer
parses keeps the previous tokens and is reported in ``/v1/health``.
"""

from __future__ import annotations

import logging
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from statestore.core.access import Grant, Grants, parse_tokens
from statestore.core.errors import Forbidden, Unauthenticated
from statestore.core.identity import (
    PROVE_HEADER,
    SIGNATURE_HEADER,
    ReplayGuard,
    answer_headers,
    check_body,
    parse_secret,
    signed_headers,
    verify,
    verify_answer,
)
from statestore.core.ids import parse_chunk_key
from statestore.core.ratelimit import Limiter
from statestore.net.http import HttpTransport
from statestore.node.policy import Policy, node_only
from statestore.node.watched import WatchedFile

__all__ = ["Access", "Principal", "allow", "enforce", "principal"]

log = logging.getLogger(__name__)
UNPROVEN_PATH = "/v1/health"  # open routes, only hints (a seed's DHT port): never proven
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
            try:
                with open(secret_file, "rb") as f:
                    raw = f.read()
            except OSError as exc:  # named here: the node's catch-all blames --data-dir
                raise ValueError(
                    f"--cluster-secret-file {secret_file}: cannot read it ({exc.strerror or exc})"
                ) from exc
            self.secret = parse_secret(raw, f"--cluster-secret-file {secret_file}")
        self._key = self.secret or secrets.token_bytes(32)
        self.tokens = TokenFile(auth_file) if auth_file else None
        self.limiter = Limiter()
        self.replays = ReplayGuard()

    @property
    def identity_on(self) -> bool:
        return self.secret is not None

    def outbound(self, method: str, address: str, path: str, body: bytes) -> dict[str, str]:
        """Headers that sign one outbound request of this node to ``address`` (``HOST:PORT``
        as this node addresses it: the signature is valid at that node only). With the
        secret on, every request but ``/v1/health...`` (open routes, only hints) also asks
        for a proven answer, which :meth:`check_answer` checks (net/http.py: answers that
        are streamed cannot be proven, and are not asked to be)."""
        headers = signed_headers(
            self._key, method, path, body, self.node_id, time.time(), destination=address
        )
        if not path.startswith(UNPROVEN_PATH):
            headers.update(self.prove_headers())
        return headers

    def transport(self, timeout: float, tls: ssl.SSLContext | None) -> HttpTransport:
        """An HTTP transport that signs this node's requests and believes only the answers
        proven for them (with the secret on)."""
        return HttpTransport(timeout, auth=self.outbound, prove=self.check_answer, tls=tls)

    def prove_headers(self) -> dict[str, str]:
        """Headers asking a peer to sign its answer (with a cluster secret; without one no
        peer's answer can be proven, and none is asked for)."""
        return {PROVE_HEADER: "1"} if self.identity_on else {}

    def check_answer(
        self, sent: Mapping[str, str], status: int, headers: Mapping[str, str], body: bytes
    ) -> None:
        """Raise Unauthenticated when the request sent with ``sent`` asked for a proven
        answer and this answer is not signed with the ring's secret for that request."""
        if PROVE_HEADER in sent:
            verify_answer([self._key], sent, status, headers, body)

    def answer_proof(
        self, p: Principal, request: web.Request, status: int, body: bytes
    ) -> dict[str, str]:
        """Headers proving this node's answer to ``request``, when a signed node asked."""
        if p.kind != "node" or PROVE_HEADER not in request.headers:
            return {}
        return answer_headers(self._key, self.node_id, request.headers, status, body)

    def authenticate(
        self, request: web.Request, addressed_to_me: Callable[[str], bool]
    ) -> Principal:
        """Who sent ``request``, judged from its headers alone: its body is not read, so a
        caller without valid credentials costs no more than its headers. A node's body is
        then compared with its signed digest (:meth:`check_body`). ``addressed_to_me``
        tells whether a signed destination (``HOST:PORT``) names this node."""
        # a coordinator commit's body is streamed and is a client's: judged by its token
        if SIGNATURE_HEADER in request.headers and not request.path.endswith("/commit"):
            try:
                return Principal("node", node=self._verify(request, addressed_to_me))
            except Unauthenticated:
                if self.identity_on:
                    raise
                # no ring secret: another node's call, signed with its own key; judged as
                # an unsigned request below

        # node-only routes, and requests, per the one table (node/policy.py)
        internal = node_only(request, tokens=self.tokens is not None)
        if self.identity_on and internal:
            now = time.time()
            verify([], request.method, request.raw_path, request.headers, 0, addressed_to_me, now)
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

    def _verify(self, request: web.Request, addressed_to_me: Callable[[str], bool]) -> str:
        """The signing node's id (core/identity.verify over the headers and the declared
        Content-Length; a signed request without one is refused)."""
        length = request.content_length
        if length is None and request.body_exists:
            raise Unauthenticated("a signed request must declare its Content-Length")
        return verify(
            [self._key],
            request.method,
            request.raw_path,
            request.headers,
            length or 0,
            addressed_to_me,
            time.time(),
            self.replays,
        )

    @staticmethod
    def check_body(p: Principal, request: web.Request, body: bytes) -> None:
        """Raise Unauthenticated when ``p`` is a node and ``body`` is not the body its
        signature declared."""
        if p.kind == "node":
            check_body(request.headers, body)

    def admit(self, p: Principal, body_bytes: int) -> None:
        """Take a request of ``p`` from its token's rates (RateLimited when over them)."""
        if p.grant is not None and p.grant.limits.limited:
            self.limiter.admit(p.grant.key, p.grant.limits, body_bytes, time.monotonic())

    def charge(self, p: Principal, nbytes: int) -> None:
        """Charge the bytes of an answer to ``p``'s token."""
        if p.grant is not None and p.grant.limits.limited:
            self.limiter.charge(p.grant.key, p.grant.limits, nbytes, time.monotonic())

    def done(self, p: Principal) -> None:
        """A request :meth:`admit` took has ended (its token's in-flight count)."""
        if p.grant is not None and p.grant.limits.limited:
            self.limiter.done(p.grant.key)

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


def enforce(request: web.Request, policy: Policy | None) -> None:
    """Raise Forbidden unless the (authenticated) caller has what ``policy`` asks of a
    token (node/policy.py); a node and an open caller pass. A route's handler may check
    more (the queries a body names). ``None``: the request matched no route."""
    p = principal(request)
    if p.grant is None or policy is None:
        return
    if policy.kind == "ring" or node_only(request, tokens=True):
        # a token on a node-only route: only on a node without a cluster secret, which
        # node/config.py refuses with a tokens file; never less than the ring's admin
        allow_ring(request)
    elif policy.kind == "right":
        query: str | None = None
        if policy.on == "path":
            query = request.match_info["query"]
        elif policy.on == "key":
            query = parse_chunk_key(request.match_info["key"])[0].query
        allow(request, policy.right, query)


def is_node(request: web.Request) -> bool:
    return principal(request).kind == "node"
