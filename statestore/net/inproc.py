"""One HTTP exchange with an aiohttp ``Application`` in this process, without a socket.

The request is built as aiohttp's own server would build it (method, path, headers, a payload
stream) and handed to the application's router and middlewares; the answer's status line,
headers and body bytes arrive through an :class:`Answer`, which the caller reads as a stream.
So the node's real handlers run, streaming ones included (relay hops, chunk batches, state),
and a simulated link can cut an answer after any number of bytes.

The one private call is ``Application._handle`` (router, then middlewares, then the handler:
what aiohttp's ``RequestHandler`` calls for each request).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from statestore.core.errors import NodeUnavailable

__all__ = ["Answer", "exchange"]


class Answer:
    """The answer's bytes as they are written, read with ``readexactly`` (a ``Stream``).

    ``cut_after`` bytes into the body the link breaks: the reader gets what came before, then
    NodeUnavailable, and the writer (the node's handler) sees a reset connection.
    """

    def __init__(self, peer: str, cut_after: int | None = None) -> None:
        self.peer = peer
        self.status: asyncio.Future[tuple[int, CIMultiDict[str]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._buf = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._cut_after = cut_after
        self._fed = 0
        self._closed = False

    # -- the writing side ------------------------------------------------------------
    def headers(self, status: int, headers: CIMultiDict[str]) -> None:
        if not self.status.done():
            self.status.set_result((status, headers))

    def feed(self, data: bytes) -> None:
        if self._closed or self._error is not None:
            raise ConnectionResetError(f"the reader of {self.peer}'s answer went away")
        if self._cut_after is not None and self._fed + len(data) > self._cut_after:
            self._buf += data[: self._cut_after - self._fed]
            self._fed = self._cut_after
            self.fail(NodeUnavailable(f"stream from {self.peer} broke (link cut)"))
            raise ConnectionResetError(f"the link from {self.peer} was cut")
        self._fed += len(data)
        self._buf += data
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if self._error is None and not self._eof:
            self._error = exc
        if not self.status.done():
            self.status.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- the reading side ------------------------------------------------------------
    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if self._error is not None:
                raise self._error
            if self._eof:
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_all(self) -> bytes:
        while not self._eof:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def close(self) -> None:
        self._closed = True


class _Writer(AbstractStreamWriter):
    """Where aiohttp's response writes its status line, headers and body."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self.length = None

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        self._answer.headers(int(status_line.split(" ", 2)[1]), CIMultiDict(headers))

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        self.output_size += len(chunk)
        self._answer.feed(bytes(chunk))
        await asyncio.sleep(0)  # as a socket write would, let the reader run

    async def write_eof(self, chunk: bytes = b"") -> None:
        if chunk:
            await self.write(chunk)
        self._answer.feed_eof()

    async def drain(self) -> None:
        pass

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        pass

    def enable_chunking(self) -> None:
        pass


class _Connection:
    """What a request asks of aiohttp's connection handler: peer names and read pausing
    (the whole body is already in memory, so pausing is a no-op)."""

    transport = None
    ssl_context = None
    max_field_size = 8190
    max_headers = 128
    max_line_length = 8190
    connected = True
    _reading_paused = False

    def __init__(self, peer: str, local: str) -> None:
        self.peername = _host_port(peer)
        self.sockname = _host_port(local)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host or address, int(port) if port.isdigit() else 0)


async def exchange(
    app: web.Application,
    answer: Answer,
    *,
    method: str,
    address: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    peer: str,
    client_max_size: int,
) -> None:
    """Serve one request to ``app`` (frozen) and write its answer into ``answer``.

    Runs until the handler is done; an error that escapes the application (the middlewares
    answer every error of ours) or a reset link fails the answer with NodeUnavailable.
    """
    loop = asyncio.get_running_loop()
    hdrs: CIMultiDict[str] = CIMultiDict(headers)
    hdrs.setdefault("Host", address)
    hdrs["Content-Length"] = str(len(body))
    message = RawRequestMessage(
        method,
        path,
        HttpVersion11,
        CIMultiDictProxy(hdrs),
        tuple((k.encode(), v.encode()) for k, v in hdrs.items()),
        False,
        None,
        False,
        False,
        URL(path),
    )
    conn: Any = _Connection(peer, address)
    payload = StreamReader(conn, 1 << 16, loop=loop)
    if body:
        payload.feed_data(body)
    payload.feed_eof()
    task: Any = asyncio.current_task()
    request = web.Request(
        message, payload, conn, _Writer(answer), task, loop, client_max_size=client_max_size
    )
    try:
        resp = await app._handle(request)
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the link was cut or the reader left: the handler's work stands, unanswered
    except Exception as exc:
        answer.fail(NodeUnavailable(f"node {address} failed mid-answer ({type(exc).__name__})"))
