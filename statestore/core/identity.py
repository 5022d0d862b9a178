"""Node identity (pure): requests between nodes signed with the ring's shared secret.

Every node of a ring reads the same ``--cluster-secret-file``. An internal request (gossip,
anti-entropy, repair pushes, relay hops, retention floors, a coordinator's replica writes)
carries::

    X-Statestore-Node: <sender's node id>
    X-Statestore-Timestamp: <unix seconds>
    X-Statestore-Nonce: <32 random hex digits, new for every request>
    X-Statestore-Signature: hex HMAC-SHA256(secret, METHOD \\n PATH?QUERY \\n TIMESTAMP \\n
                                             NODE ID \\n NONCE \\n hex SHA-256(body))

The receiver recomputes it and compares in constant time; a timestamp more than
``MAX_SKEW`` seconds from its own clock is stale, and a nonce it has already seen within that
window is a replay (:class:`ReplayGuard`). The clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _random
from collections.abc import Mapping, Sequence

from statestore.core.errors import Unauthenticated

__all__ = [
    "MAX_SKEW",
    "NODE_HEADER",
    "NONCE_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "ReplayGuard",
    "parse_secret",
    "sign",
    "signed_headers",
    "verify",
]

NODE_HEADER = "X-Statestore-Node"
TIMESTAMP_HEADER = "X-Statestore-Timestamp"
SIGNATURE_HEADER = "X-Statestore-Signature"
NONCE_HEADER = "X-Statestore-Nonce"
MAX_SKEW = 60.0
MIN_SECRET = 16


def parse_secret(raw: bytes, what: str = "cluster secret") -> bytes:
    """The secret in a secret file (surrounding whitespace dropped); ValueError if it is
    shorter than 16 bytes, which is too easy to guess."""
    secret = raw.strip()
    if len(secret) < MIN_SECRET:
        raise ValueError(
            f"{what} is {len(secret)} bytes: use at least {MIN_SECRET} random bytes, e.g. "
            "`head -c 32 /dev/urandom | base64 > cluster.secret`"
        )
    return secret


def sign(
    secret: bytes, method: str, path: str, timestamp: int, node: str, nonce: str, body: bytes
) -> str:
    digest = hashlib.sha256(body).hexdigest()
    text = "\n".join((method.upper(), path, str(timestamp), node, nonce, digest))
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    secret: bytes,
    method: str,
    path: str,
    body: bytes,
    node: str,
    now: float,
    nonce: str | None = None,
) -> dict[str, str]:
    ts = int(now)
    nonce = nonce or _random.token_hex(16)
    return {
        NODE_HEADER: node,
        TIMESTAMP_HEADER: str(ts),
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: sign(secret, method, path, ts, node, nonce, body),
    }


class ReplayGuard:
    """The nonces of the signed requests seen within the last ``2 * MAX_SKEW`` seconds: a
    nonce seen again is a replay. Memory is bounded by the signed request rate times the
    window (two generations of sets, the older dropped as the window moves on)."""

    def __init__(self, window: float = 2 * MAX_SKEW) -> None:
        self.window = window
        self._current: set[str] = set()
        self._previous: set[str] = set()
        self._since: float | None = None

    def check(self, nonce: str, now: float) -> None:
        if self._since is None:
            self._since = now
        elif now - self._since >= self.window:  # a generation is one window long
            self._previous, self._current, self._since = self._current, set(), now
        if nonce in self._current or nonce in self._previous:
            raise Unauthenticated(
                f"signed request replayed: nonce {nonce[:12]}… was already used; every "
                "request of a node carries a new nonce"
            )
        self._current.add(nonce)


def verify(
    secrets: Sequence[bytes],
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    replays: ReplayGuard | None = None,
) -> str:
    """The sender's node id if the request is signed with one of ``secrets`` (and, given
    ``replays``, its nonce is new); raises Unauthenticated naming what is wrong (missing,
    stale, replayed or bad signature)."""
    sig = headers.get(SIGNATURE_HEADER)
    ts_text = headers.get(TIMESTAMP_HEADER, "")
    node = headers.get(NODE_HEADER, "")
    nonce = headers.get(NONCE_HEADER, "")
    if not sig:
        raise Unauthenticated(
            f"{method} {path.split('?')[0]} is for ring nodes only: the request carries no "
            f"{SIGNATURE_HEADER}; start every node with the same --cluster-secret-file"
        )
    if not (ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 12):
        raise Unauthenticated(f"{TIMESTAMP_HEADER} {ts_text!r:.30} is not unix seconds")
    ts = int(ts_text)
    if abs(now - ts) > MAX_SKEW:
        raise Unauthenticated(
            f"node signature is stale: timestamp {ts} is {abs(now - ts):.0f}s from this "
            f"node's clock (limit {MAX_SKEW:.0f}s); synchronise the clocks (NTP)"
        )
    if not (16 <= len(nonce) <= 64 and nonce.isascii() and nonce.isalnum()):
        raise Unauthenticated(
            f"{NONCE_HEADER} {nonce!r:.30} is missing or malformed (16-64 letters or digits): "
            "run the same statestore version on every node"
        )
    for secret in secrets:
        if hmac.compare_digest(sign(secret, method, path, ts, node, nonce, body), sig):
            if replays is not None:
                replays.check(f"{node}:{nonce}", now)
            return node
    raise Unauthenticated(
        "node signature does not match: the sender does not hold this ring's cluster "
        "secret (give every node the same --cluster-secret-file)"
    )
