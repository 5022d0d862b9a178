"""The transport seam: what every outbound call of the node and the client goes through.

Two implementations carry the same calls: ``net/http.py`` (aiohttp over TCP, the real thing)
and ``net/memory.py`` (in-process nodes, with seeded drops, delays, duplicates, partitions and
stream cuts, for the simulator). Reads, writes, the restorer, the client and the node take a
:class:`Transport` and never know which one they hold (docs/design.md, Layers).

Both map failures onto the error tree the same way: an unreachable node or a broken stream is
``NodeUnavailable``, a deadline is ``RequestTimeout``, and an error body
``{"error": {"code", "message"}}`` becomes the class the node raised.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from statestore.core.errors import NodeUnavailable, StateStoreError, error_from_code

__all__ = ["Response", "Stream", "Transport", "error_from_answer"]


class Response:
    """A complete answer: status, body and the ring epoch the node reported."""

    __slots__ = ("body", "epoch", "status")

    def __init__(self, status: int, body: bytes, epoch: int) -> None:
        self.status = status
        self.body = body
        self.epoch = epoch

    def json(self) -> Any:
        return json.loads(self.body)


class Stream(Protocol):
    """An open streaming answer (a ``net.streams.ByteReader``); ``close()`` it when done.

    ``readexactly`` raises ``asyncio.IncompleteReadError`` at the end of the stream and
    ``NodeUnavailable`` when the connection breaks.
    """

    async def readexactly(self, n: int) -> bytes: ...

    def close(self) -> None: ...


# what one answer may hold (a chunk is at most a request body, --max-body, 64 MiB by default):
# a peer answering more is cut off, not read into memory
MAX_ANSWER_BYTES = 1 << 30
# what an answer whose size the reader knows may hold besides: an error's few hundred bytes
ERROR_BYTES = 64 << 10


class Transport(Protocol):
    """Requests to nodes by ``host:port`` address. Owned by whoever creates it.

    Attributes:
        timeout: the default deadline of one request, in seconds.
        seen_epoch: the highest ring epoch any answer carried (a client compares it with its
            view to notice that the view is stale).
    """

    timeout: float
    seen_epoch: int

    async def start(self) -> None: ...

    async def close(self) -> None: ...

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
        """One request; raises from the error tree (any status outside ``ok`` included, and
        NodeUnavailable for an answer of more than ``max_bytes``, not read past them)."""
        ...

    async def lookup(
        self, address: str, store: str, body: bytes, *, timeout: float | None = None
    ) -> Response:
        """A lookup of ``store`` (``POST /v1/stores/{store}/lookup``'s ``body``): the same
        answer as that request, however it is carried."""
        ...

    async def open_stream(
        self, address: str, path: str, body: bytes, *, timeout: float | None = None
    ) -> Stream:
        """POST ``body`` and return the streaming answer once its headers arrived.

        Raises from the error tree when the answer is not 200 (the body names the error).
        """
        ...


def error_from_answer(status: int, data: bytes, address: str) -> StateStoreError:
    """The error a non-OK answer stands for: the class the node named in its error body, or
    NodeUnavailable for a 5xx without one."""
    try:
        err = json.loads(data)["error"]
        return error_from_code(str(err["code"]), f"{err['message']} (from {address})")
    except (ValueError, KeyError, TypeError):
        text = data[:200].decode(errors="replace")
        if status >= 500:
            return NodeUnavailable(f"node {address} answered {status}: {text}")
        return StateStoreError(f"node {address} answered {status}: {text}")
