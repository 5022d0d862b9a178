"""A client's lookup channel to one node: lookups as messages on one kept WebSocket
(``GET /v1/lookups``, node/channel.py), where each as an HTTP request costs both processes a
request's handling. :class:`LookupChannel` pairs answers with questions by id; a channel
that breaks fails the questions it carries with NodeUnavailable (the caller asks the next
holder, as for a request) and is replaced on the next question.

Nothing of an answer is believed past its shape: a message that is not
``[id, status, body, epoch]`` closes the channel; a value's bytes are checked by the
lookup's caller as an HTTP answer's are (net/reads.lookup_keys).
"""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import msgpack

from statestore.core.errors import NodeUnavailable, RequestTimeout
from statestore.net.transport import Response, error_from_answer

__all__ = ["MAX_MESSAGE", "LookupChannel"]

# the largest answer a channel takes: a lookup's values (node/lookup.LOOKUP_ANSWER_BYTES,
# 32 MiB) packed, and room besides
MAX_MESSAGE = 40 << 20


class LookupChannel:
    """One open channel (``ws``, to ``address``); :meth:`ask` a lookup of a store."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, address: str) -> None:
        self.address = address
        self.epoch = 0  # the highest ring epoch an answer carried
        self._ws = ws
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._answered = 0.0  # when an answer last came (the loop's clock)
        self.broken: str | None = None  # why it serves no more questions
        self._reader = asyncio.ensure_future(self._read())

    async def ask(self, store: str, body: bytes, timeout: float) -> Response:
        """The answer to a lookup of ``store`` (``POST .../lookup``'s ``body``); raises from
        the error tree as a request does."""
        if self.broken is not None:
            raise NodeUnavailable(self.broken)
        mid = next(self._ids)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self._waiting[mid] = answer
        asked = loop.time()
        try:
            async with asyncio.timeout(timeout):
                try:
                    await self._ws.send_bytes(msgpack.packb([mid, store, body]))
                except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                    self._break(f"the lookup channel to {self.address} broke ({exc})")
                    raise NodeUnavailable(self.broken or "") from exc
                status, data = await answer
        except TimeoutError as exc:
            if self._answered < asked:  # nothing came back since: a wedged channel, replaced
                self._break(f"the lookup channel to {self.address} answered nothing in time")
                self._reader.cancel()
            raise RequestTimeout(
                f"a lookup at {self.address} took longer than {timeout:.1f}s: the node is slow "
                "or stuck"
            ) from exc
        finally:
            self._waiting.pop(mid, None)
        if status != 200:
            raise error_from_answer(status, data, self.address)
        return Response(status, data, self.epoch)

    async def _read(self) -> None:
        why = f"the lookup channel to {self.address} was closed"
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    why = f"the lookup channel to {self.address} broke ({msg.type.name})"
                    break
                got = _answer(msg.data)
                if got is None:
                    why = f"{self.address} sent a lookup channel message of another shape"
                    break
                mid, status, data, epoch = got
                self._answered = asyncio.get_running_loop().time()
                self.epoch = max(self.epoch, epoch)
                waiting = self._waiting.pop(mid, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result((status, data))
        except (aiohttp.ClientError, ConnectionError) as exc:
            why = f"the lookup channel to {self.address} broke ({exc})"
        finally:
            self._break(why)
            await self._ws.close()

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(NodeUnavailable(self.broken))
        self._waiting.clear()

    async def close(self) -> None:
        self._break(f"the lookup channel to {self.address} was closed by its client")
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._ws.close()


def _answer(data: bytes) -> tuple[int, int, bytes, int] | None:
    """An answer's ``(id, status, body, epoch)``, or None for another shape."""
    try:
        msg = msgpack.unpackb(data, raw=False, max_array_len=4, max_map_len=0)
    except Exception:
        return None
    if (
        isinstance(msg, list)
        and len(msg) == 4
        and all(type(v) is int and v >= 0 for v in (msg[0], msg[1], msg[3]))
        and 100 <= msg[1] <= 599
        and isinstance(msg[2], bytes)
    ):
        return msg[0], msg[1], msg[2], msg[3]
    return None
