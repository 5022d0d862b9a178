"""The HTTP transport (net/transport.py's ``Transport`` over aiohttp and TCP).

It carries bytes and maps failures onto the error tree at this one boundary: a refused or
reset connection is NodeUnavailable, a TLS handshake that fails is TlsFailed (net/tls.py),
a deadline is RequestTimeout, and an error body
``{"error": {"code", "message"}}`` becomes the same class the node raised. Responses that depend
on placement carry the ring epoch in ``X-Statestore-Epoch``; the transport remembers the
highest it has seen so that a client can notice its view is stale.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from statestore.core.address import node_url
from statestore.core.errors import (
    NodeUnavailable,
    RequestTimeout,
    StateStoreError,
    Unauthenticated,
    Unavailable,
    UnprovenAnswer,
)
from statestore.core.identity import PROVE_HEADER
from statestore.net.channel import MAX_MESSAGE, LookupChannel
from statestore.net.tls import TLS_CA_ENV, tls_failure
from statestore.net.transport import MAX_ANSWER_BYTES, Response, error_from_answer
from statestore.wire.headers import EPOCH_HEADER

__all__ = ["HttpStream", "HttpTransport", "Response"]


Auth = Callable[[str, str, str, bytes], dict[str, str]]
PLAIN_FOR = 60.0  # seconds a node that serves no lookup channel is sent requests instead
Prove = Callable[[Mapping[str, str], int, Mapping[str, str], bytes], None]


class HttpTransport:
    """A pooled aiohttp session with the error mapping. Owned by whoever creates it.

    ``auth(method, address, path, body)`` gives the credential headers of each request: a
    client's bearer token, or a node's signature for that destination (core/identity).
    ``prove(sent headers, status, headers, body)`` checks every successful answer and raises
    (Unauthenticated) for one not to be believed: a node's check that a peer signed the
    answer its request asked to be proven (``X-Statestore-Prove``), and every refusal that
    states a fact (:meth:`_refused`); a request asking for a proof through a transport
    without ``prove`` is refused. Streamed answers (:meth:`open_stream`) are never asked to
    be proven: their body is not known when their headers are sent. With ``tls``
    (net/tls.client_context) every call is HTTPS, verified by that context; without it,
    plain HTTP.
    """

    def __init__(
        self,
        timeout: float = 10.0,
        connections: int = 64,
        rcvbuf: int | None = None,
        *,
        auth: Auth | None = None,
        prove: Prove | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout = timeout
        self._auth = auth
        self._prove = prove
        self._tls = tls
        self._connections = connections
        self._rcvbuf = rcvbuf
        self._session: aiohttp.ClientSession | None = None
        self.seen_epoch = 0
        # lookup channels by address; nodes that serve none (an older build: HTTP until then)
        self._channels: dict[str, LookupChannel] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._plain: dict[str, float] = {}

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._connections,
                    limit_per_host=32,
                    socket_factory=self._socket if self._rcvbuf else None,
                    ssl=self._tls if self._tls is not None else True,
                ),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
            )

    def _socket(self, addr_info: Any) -> socket.socket:
        # A capped restorer stands for a slow link: it must not take in more than a small
        # buffer ahead of what it consumes (Linux would otherwise autotune to tens of MB).
        family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = socket.socket(family, type_, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(self._rcvbuf or 0))
        return sock

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def lookup(
        self, address: str, store: str, body: bytes, *, timeout: float | None = None
    ) -> Response:
        """A lookup of ``store`` (``POST /v1/stores/{store}/lookup``'s ``body``) at
        ``address``: over a lookup channel (net/channel.py) where the node serves them,
        else as that request. A transport that checks answers' proofs (a node's) sends
        requests: a channel's answers are not proven."""
        limit = self.timeout if timeout is None else timeout
        channel = self._channels.get(address)  # open: the usual case, with no timer
        if (channel is None or channel.broken is not None) and self._prove is None:
            try:  # another reader opening it meanwhile is waited for within the deadline
                async with asyncio.timeout(limit):
                    channel = await self._channel(address)
            except TimeoutError as exc:
                raise RequestTimeout(f"a lookup channel to {address}: no answer") from exc
        if channel is None:
            path = f"/v1/stores/{store}/lookup"
            ct = {"Content-Type": "application/json"}
            return await self.request("POST", address, path, body=body, headers=ct, timeout=limit)
        resp = await channel.ask(store, body, limit)
        self.seen_epoch = max(self.seen_epoch, resp.epoch)
        return resp

    async def _channel(self, address: str) -> LookupChannel | None:
        """The open channel to ``address``, opened if need be; None where the node serves
        none (asked again after :data:`PLAIN_FOR` seconds). NodeUnavailable when it cannot
        be reached, as a request."""
        channel = self._channels.get(address)
        if channel is not None and channel.broken is None:
            return channel
        if self._plain.get(address, 0.0) > time.monotonic():
            return None
        async with self._opening.setdefault(address, asyncio.Lock()):
            channel = self._channels.get(address)
            if channel is not None and channel.broken is None:
                return channel  # another reader opened it meanwhile
            if self._session is None:
                await self.start()
            assert self._session is not None
            path = "/v1/lookups"
            hdrs = self._auth("GET", address, path, b"") if self._auth is not None else {}
            url = node_url(address, path, tls=self._tls is not None)
            try:  # (a channel that answers nothing before a deadline is replaced: LookupChannel)
                ws = await self._session.ws_connect(url, headers=hdrs, max_msg_size=MAX_MESSAGE)
            except aiohttp.WSServerHandshakeError:
                # refused: an older node has no such route; a token without the read right, a
                # rate, no room in the node's budget, a failing node: its requests' answers
                # say so in their own words
                self._plain[address] = time.monotonic() + PLAIN_FOR
                return None
            except (aiohttp.ClientError, OSError) as exc:
                raise self._unreachable(address, exc) from exc
            channel = self._channels[address] = LookupChannel(ws, address)
            return channel

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        ok: tuple[int, ...] = (200, 201),
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> Response:
        """One request to ``address`` (``host:port``); raises from the error tree. An answer
        of more than ``max_bytes`` is refused unread (declared) or as soon as it passes them
        (chunked), before anything of it is believed: NodeUnavailable."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        hdrs = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        if self._auth is not None:
            hdrs.update(self._auth(method, address, path, body or b""))
        if PROVE_HEADER in hdrs and self._prove is None:
            raise Unauthenticated(f"{method} {path} asks for a proven answer: no way to check one")
        url = node_url(address, path, tls=self._tls is not None)
        data: Any = body
        if body is not None and len(body) > 1 << 20:
            # aiohttp warns that a large bytes body "might lock the event loop"; sending one
            # that is already in memory is a plain socket write, so build the payload quietly.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                data = aiohttp.payload.BytesPayload(body)
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                async with self._session.request(method, url, data=data, headers=hdrs) as resp:
                    data = await _read_at_most(resp, max_bytes, address)
                    epoch = int(resp.headers.get(EPOCH_HEADER, "0") or 0)
                    answered = resp.headers
        except TimeoutError as exc:
            raise RequestTimeout(
                f"{method} {url} took longer than {limit:.1f}s: the node is slow or stuck"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self._unreachable(address, exc) from exc
        if epoch > self.seen_epoch:
            self.seen_epoch = epoch
        if resp.status not in ok:
            raise self._refused(hdrs, resp.status, answered, data, address)
        if self._prove is not None:
            try:
                self._prove(hdrs, resp.status, answered, data)
            except Unauthenticated as exc:
                raise UnprovenAnswer(f"{address} answered {resp.status} unproven: {exc}") from exc
        return Response(resp.status, data, epoch)

    def _refused(
        self,
        sent: Mapping[str, str],
        status: int,
        answered: Mapping[str, str],
        data: bytes,
        address: str,
    ) -> StateStoreError:
        """The error a refusal stands for. To a request asking for a proof, a refusal that
        states a fact (not found, a stale epoch, a conflict, ...) is believed only when
        proven; one that says "no answer now" (unavailable, busy, access denied) is taken
        as it is, since nothing is believed from it."""
        err = error_from_answer(status, data, address)
        if self._prove is None or isinstance(err, Unavailable):
            return err
        try:
            self._prove(sent, status, answered, data)
        except Unauthenticated as exc:
            # a refusal we cannot believe, a 401 or 403 included (a peer without this ring's
            # secret): that peer did not answer, and the read or write counts it out
            return UnprovenAnswer(f"{address} answered {status} ({err.code}) unproven: {exc}")
        return err

    async def open_stream(
        self, address: str, path: str, body: bytes, *, timeout: float | None = None
    ) -> HttpStream:
        """POST ``body`` and return the streaming response once its headers arrived.

        The caller reads ``stream.reader`` and must ``close()`` the stream.
        """
        if self._session is None:
            await self.start()
        assert self._session is not None
        url = node_url(address, path, tls=self._tls is not None)
        limit = self.timeout if timeout is None else timeout
        hdrs = self._auth("POST", address, path, body) if self._auth is not None else {}
        # a streamed answer cannot be proven (its body is not known when its headers are
        # sent): its frames' chunks are checked against the checksums in their names
        hdrs.pop(PROVE_HEADER, None)
        try:
            async with asyncio.timeout(limit):
                resp = await self._session.post(url, data=body, headers=hdrs)
        except TimeoutError as exc:
            raise RequestTimeout(f"POST {url} took longer than {limit:.1f}s to answer") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self._unreachable(address, exc) from exc
        if resp.status != 200:
            try:  # an error names itself in a few KiB: no more is read
                async with asyncio.timeout(limit):
                    data = await _read_at_most(resp, ERROR_ANSWER_BYTES, address)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise self._unreachable(address, exc) from exc
            finally:
                resp.close()
            raise error_from_answer(resp.status, data, address)
        return HttpStream(resp, address)

    def _unreachable(self, address: str, exc: BaseException) -> NodeUnavailable:
        """The error tree's name for a call that got no answer from ``address``."""
        if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
            return tls_failure(address, exc)
        hint = "check that it runs, or let the ring route around it"
        if self._tls is None and isinstance(exc, aiohttp.ServerDisconnectedError):
            # what a node serving HTTPS does to a plain HTTP request: it hangs up
            hint = (
                f"if the ring serves TLS, give its CA file as tls_ca= or {TLS_CA_ENV}; "
                "else check that the node runs"
            )
        return NodeUnavailable(
            f"node {address} is unreachable ({type(exc).__name__}: {exc}); {hint}"
        )


class HttpStream:
    """An open streaming response (a ``net.streams.ByteReader``); ``close()`` it when done."""

    def __init__(self, resp: aiohttp.ClientResponse, address: str) -> None:
        self._resp = resp
        self._address = address

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self._resp.content.readexactly(n)
        except aiohttp.ClientError as exc:
            raise NodeUnavailable(f"stream from {self._address} broke ({exc})") from exc

    def close(self) -> None:
        self._resp.close()


# what the error answer of a stream may hold (a JSON error of a few hundred bytes)
ERROR_ANSWER_BYTES = 64 << 10


class AnswerTooLarge(aiohttp.ClientError):
    """An answer past the caller's bound (``HttpTransport.request``'s ``max_bytes``)."""


async def _read_at_most(resp: aiohttp.ClientResponse, max_bytes: int, address: str) -> bytes:
    """The whole answer, or AnswerTooLarge once it is (or says it is) over ``max_bytes``: a
    declared length is checked before a byte is read, a chunked one piece by piece."""
    declared = resp.content_length
    if declared is not None:
        if declared > max_bytes:
            raise AnswerTooLarge(
                f"{address} answered {declared} bytes, more than the {max_bytes} expected"
            )
        return await resp.read()
    pieces, total = [], 0
    async for piece in resp.content.iter_chunked(1 << 20):
        total += len(piece)
        if total > max_bytes:
            raise AnswerTooLarge(f"{address} answered more than the {max_bytes} bytes expected")
        pieces.append(piece)
    return b"".join(pieces)
