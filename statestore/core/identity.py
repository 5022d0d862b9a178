"""Node identity (pure): requests between nodes, and their answers, signed with the ring's
shared secret.

Every node of a ring reads the same ``--cluster-secret-file``. An internal request (gossip,
anti-entropy, repair pushes, relay hops, retention floors, a coordinator's replica writes)
carries::

    X-Statestore-Node: <sender's node id>
    X-Statestore-Timestamp: <unix seconds>
    X-Statestore-Nonce: <32 random hex digits, new for every request>
    X-Statestore-Destination: <HOST:PORT the sender addressed the request to>
    X-Statestore-Body-SHA256: <hex SHA-256 of the body>
    X-Statestore-Signature: hex HMAC-SHA256(secret, METHOD \\n PATH?QUERY \\n TIMESTAMP \\n
        NODE ID \\n NONCE \\n DESTINATION \\n CONTENT-LENGTH \\n BODY-SHA256)

The receiver checks all of it from the headers alone (:func:`verify`), *before* it reads the
body: the signature (constant time), a timestamp within ``MAX_SKEW`` seconds of its clock, a
destination that names this receiver (so a captured request cannot be replayed to another
node), a nonce not seen within the window (:class:`ReplayGuard`) and the declared
``Content-Length``. Only then is the body read and compared with its signed digest
(:func:`check_body`).

A caller that must believe an answer (``X-Statestore-Prove: 1`` in its signed request) gets
it signed by the responder over the request's nonce (:func:`answer_headers`)::

    X-Statestore-Answer-Signature: hex HMAC-SHA256(secret, "answer" \\n NONCE \\n NODE ID
                                                   \\n STATUS \\n hex SHA-256(answer body))

and checks it with :func:`verify_answer`: only a holder of the secret can produce it, and only
for this request. The clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _random
from collections.abc import Callable, Mapping, Sequence

from statestore.core.errors import Unauthenticated

__all__ = [
    "ANSWER_HEADER",
    "BODY_HEADER",
    "DESTINATION_HEADER",
    "MAX_SKEW",
    "NODE_HEADER",
    "NONCE_HEADER",
    "PROVE_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "ReplayGuard",
    "answer_headers",
    "check_body",
    "parse_secret",
    "sign",
    "signed_headers",
    "verify",
    "verify_answer",
]

NODE_HEADER = "X-Statestore-Node"
TIMESTAMP_HEADER = "X-Statestore-Timestamp"
SIGNATURE_HEADER = "X-Statestore-Signature"
NONCE_HEADER = "X-Statestore-Nonce"
DESTINATION_HEADER = "X-Statestore-Destination"
BODY_HEADER = "X-Statestore-Body-SHA256"
PROVE_HEADER = "X-Statestore-Prove"
ANSWER_HEADER = "X-Statestore-Answer-Signature"
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


def sign(secret: bytes, fields: Sequence[str]) -> str:
    """The hex HMAC-SHA256 under ``secret`` of ``fields`` joined by newlines."""
    return hmac.new(secret, "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def _request_fields(method: str, path: str, headers: Mapping[str, str], length: int) -> list[str]:
    """What a request's signature covers, in order (the module docstring's text)."""
    names = (TIMESTAMP_HEADER, NODE_HEADER, NONCE_HEADER, DESTINATION_HEADER)
    return [
        method.upper(),
        path,
        *(headers.get(n, "") for n in names),
        str(length),
        headers.get(BODY_HEADER, ""),
    ]


def signed_headers(
    secret: bytes,
    method: str,
    path: str,
    body: bytes,
    node: str,
    now: float,
    *,
    destination: str,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers that sign one request of ``node`` to ``destination`` (``HOST:PORT`` as
    the sender addresses it), its body ``body`` sent with ``Content-Length: len(body)``."""
    headers = {
        NODE_HEADER: node,
        TIMESTAMP_HEADER: str(int(now)),
        NONCE_HEADER: nonce or _random.token_hex(16),
        DESTINATION_HEADER: destination,
        BODY_HEADER: hashlib.sha256(body).hexdigest(),
    }
    headers[SIGNATURE_HEADER] = sign(secret, _request_fields(method, path, headers, len(body)))
    return headers


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


def _check_form(method: str, path: str, headers: Mapping[str, str], now: float) -> None:
    """Raise Unauthenticated unless the signature headers are present and well formed and
    the timestamp is within ``MAX_SKEW`` of ``now``."""
    ts_text = headers.get(TIMESTAMP_HEADER, "")
    nonce = headers.get(NONCE_HEADER, "")
    if not headers.get(SIGNATURE_HEADER):
        raise Unauthenticated(
            f"{method} {path.split('?')[0]} is for ring nodes only: the request carries no "
            f"{SIGNATURE_HEADER}; start every node with the same --cluster-secret-file"
        )
    if not (ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 12):
        raise Unauthenticated(f"{TIMESTAMP_HEADER} {ts_text!r:.30} is not unix seconds")
    if abs(now - int(ts_text)) > MAX_SKEW:
        raise Unauthenticated(
            f"node signature is stale: timestamp {ts_text} is {abs(now - int(ts_text)):.0f}s "
            f"from this node's clock (limit {MAX_SKEW:.0f}s); synchronise the clocks (NTP)"
        )
    if not (16 <= len(nonce) <= 64 and nonce.isascii() and nonce.isalnum()):
        raise Unauthenticated(
            f"{NONCE_HEADER} {nonce!r:.30} is missing or malformed (16-64 letters or digits): "
            "run the same statestore version on every node"
        )
    if not headers.get(DESTINATION_HEADER) or len(headers.get(BODY_HEADER, "")) != 64:
        raise Unauthenticated(
            f"the node signature lacks {DESTINATION_HEADER} or {BODY_HEADER}: run the same "
            "statestore version on every node"
        )


def verify(
    secrets: Sequence[bytes],
    method: str,
    path: str,
    headers: Mapping[str, str],
    length: int,
    addressed_to_me: Callable[[str], bool],
    now: float,
    replays: ReplayGuard | None = None,
) -> str:
    """The sender's node id if the request's headers are signed with one of ``secrets`` for
    a body of ``length`` bytes (its ``Content-Length``), for a destination that
    ``addressed_to_me`` accepts and (given ``replays``) with a new nonce; raises
    Unauthenticated naming what is wrong (missing, stale, for another node, replayed or bad).
    The body is not needed: :func:`check_body` compares it with the signed digest later."""
    _check_form(method, path, headers, now)
    fields = _request_fields(method, path, headers, length)
    sig = headers.get(SIGNATURE_HEADER, "")
    if not any(hmac.compare_digest(sign(s, fields), sig) for s in secrets):
        raise Unauthenticated(
            "node signature does not match: the sender does not hold this ring's cluster "
            "secret (give every node the same --cluster-secret-file)"
        )
    destination = headers.get(DESTINATION_HEADER, "")
    if not addressed_to_me(destination):
        raise Unauthenticated(
            f"node signature was made for {destination!r:.80}, not for this node: a signed "
            "request is valid only at the node it was sent to"
        )
    node = headers.get(NODE_HEADER, "")
    if replays is not None:
        replays.check(f"{node}:{headers.get(NONCE_HEADER, '')}", now)
    return node


def check_body(headers: Mapping[str, str], body: bytes) -> None:
    """Raise Unauthenticated unless ``body`` is the one whose digest the (verified) signed
    ``headers`` declare."""
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), headers.get(BODY_HEADER, "")):
        raise Unauthenticated(
            f"the request body does not match its signed {BODY_HEADER}: it was altered on the way"
        )


def _answer_fields(nonce: str, node: str, status: int, body: bytes) -> list[str]:
    return ["answer", nonce, node, str(status), hashlib.sha256(body).hexdigest()]


def answer_headers(
    secret: bytes, node: str, request: Mapping[str, str], status: int, body: bytes
) -> dict[str, str]:
    """The headers that prove an answer (``status``, ``body``) of node ``node`` to the
    signed request whose headers are ``request``."""
    nonce = request.get(NONCE_HEADER, "")
    return {
        NODE_HEADER: node,
        ANSWER_HEADER: sign(secret, _answer_fields(nonce, node, status, body)),
    }


def verify_answer(
    secrets: Sequence[bytes],
    sent: Mapping[str, str],
    status: int,
    headers: Mapping[str, str],
    body: bytes,
) -> str:
    """The responder's node id if the answer (``status``, ``headers``, ``body``) to the
    request sent with headers ``sent`` is signed with one of ``secrets``; raises
    Unauthenticated otherwise (the answer is then not to be believed)."""
    node = headers.get(NODE_HEADER, "")
    fields = _answer_fields(sent.get(NONCE_HEADER, ""), node, status, body)
    sig = headers.get(ANSWER_HEADER, "")
    if sig and any(hmac.compare_digest(sign(s, fields), sig) for s in secrets):
        return node
    raise Unauthenticated(
        f"the answer carries no valid {ANSWER_HEADER}: the peer does not hold this ring's "
        "cluster secret, so its answer is not believed"
    )
