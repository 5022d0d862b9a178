"""Node identity (pure): requests between nodes signed with the ring's shared secret.

Every node of a ring reads the same ``--cluster-secret-file``. An internal request (gossip,
anti-entropy, repair pushes, relay hops, retention floors, a coordinator's replica writes)
carries::

    X-Statestore-Node: <sender's node id>
    X-Statestore-Timestamp: <unix seconds>
    X-Statestore-Signature: hex HMAC-SHA256(secret, METHOD \\n PATH?QUERY \\n TIMESTAMP \\n
                                             NODE ID \\n hex SHA-256(body))

The receiver recomputes it and compares in constant time; a timestamp more than
``MAX_SKEW`` seconds from its own clock is stale. A replay within that window reaches the same
endpoint with the same body only (documented in docs/security.md). The clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from statestore.core.errors import Unauthenticated

__all__ = [
    "MAX_SKEW",
    "NODE_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "parse_secret",
    "sign",
    "signed_headers",
    "verify",
]

NODE_HEADER = "X-Statestore-Node"
TIMESTAMP_HEADER = "X-Statestore-Timestamp"
SIGNATURE_HEADER = "X-Statestore-Signature"
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


def sign(secret: bytes, method: str, path: str, timestamp: int, node: str, body: bytes) -> str:
    text = "\n".join((method.upper(), path, str(timestamp), node, hashlib.sha256(body).hexdigest()))
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    secret: bytes, method: str, path: str, body: bytes, node: str, now: float
) -> dict[str, str]:
    ts = int(now)
    return {
        NODE_HEADER: node,
        TIMESTAMP_HEADER: str(ts),
        SIGNATURE_HEADER: sign(secret, method, path, ts, node, body),
    }


def verify(
    secrets: Sequence[bytes],
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
) -> str:
    """The sender's node id if the request is signed with one of ``secrets``; raises
    Unauthenticated naming what is wrong (missing, stale or bad signature)."""
    sig = headers.get(SIGNATURE_HEADER)
    ts_text = headers.get(TIMESTAMP_HEADER, "")
    node = headers.get(NODE_HEADER, "")
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
    for secret in secrets:
        if hmac.compare_digest(sign(secret, method, path, ts, node, body), sig):
            return node
    raise Unauthenticated(
        "node signature does not match: the sender does not hold this ring's cluster "
        "secret (give every node the same --cluster-secret-file)"
    )
