"""A client's lookups over one WebSocket: ``GET /v1/lookups`` (a lookup channel).

A point read of an opened store with no cache of its own is one lookup (node/lookup.py); over
HTTP each costs both processes a request's handling, which is most of its time. A channel
carries lookups as messages on one kept connection. A message is msgpack
``[id, "QUERY/OPERATOR/PARTITION/NAME", body]`` (``body``: the JSON a ``POST .../lookup``
sends); its answer ``[id, status, body, epoch]``: the lookup's msgpack values (200), or the
error JSON the route would answer (``{"error": {"code", "message"}}``). Answers may come
out of order (``id`` pairs them).

Every message passes the checks a ``POST .../lookup`` passes, in the same order: a node
replaced or written off answers nothing (the channel is closed); the caller's token, taken
from the upgrade's headers, is judged again per message (a tokens file reloaded since
counts; a token no longer valid is answered 401 and its channel closed); the ``read`` right
on the message's query; the token's rates; the message's bytes, then its reads and answer,
from the node's ``--memory-budget`` (held until the answer is sent); the foreground gate. Ring
nodes do not use channels (a node's signed request cannot be judged again: its signature is
spent), so the upgrade refuses them.

What a channel holds: the upgrade takes :data:`MESSAGE_BYTES` from the budget for the
channel's life (the message being read: a valid lookup's body is well under it; a larger
message closes the channel, 1009), and refuses the channel (429: the SDK sends requests)
when there is no room; at most :data:`IN_FLIGHT` messages are answered or being sent at
once, the next read when one's answer is sent; an answer not sent within
:data:`SEND_TIMEOUT` (a reader that stopped reading) drops the connection; a channel that
carried no message for :data:`IDLE` seconds (pings do not count) is closed, and a close
that does not finish within :data:`CLOSE_TIMEOUT` (a peer that reads nothing) drops the
connection, at the node's stop too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import msgpack
from aiohttp import WSCloseCode, WSMsgType, web

from statestore.core.access import Grants
from statestore.core.errors import (
    InvalidRequest,
    NodeUnavailable,
    RateLimited,
    StateStoreError,
    Unauthenticated,
)
from statestore.core.ids import StoreId, parsed_store
from statestore.node.auth import Principal, principal
from statestore.node.budget import LEASE, Lease
from statestore.node.daemon import NODE, Node
from statestore.node.lookup import answer_lookup
from statestore.node.metrics import METRICS
from statestore.node.request import addressed_to

__all__ = ["IDLE", "IN_FLIGHT", "MESSAGE_BYTES", "register"]

log = logging.getLogger(__name__)
IN_FLIGHT = 16  # a channel's messages answered or being sent at once
IDLE = 300.0  # seconds a channel may carry no message before it is closed
SEND_TIMEOUT = 30.0  # seconds an answer may take to be sent
CLOSE_TIMEOUT = 2.0  # seconds a close may take before the connection is dropped
MESSAGE_BYTES = 1 << 20  # a message at most (a lookup's keys and parts: ~600 KiB at most)
CHANNELS_SHARE = 4  # the channels' messages hold at most 1/4 of the budget (256 at 1 GiB)
MAX_STORE_TEXT = 512  # a store's name in a message, at most (checked before it is parsed)
MAX_ID = (1 << 63) - 1
SMALL = 16 << 10  # an answer this small sent into an empty buffer is written, never waited on


def _error(exc: StateStoreError) -> bytes:
    err: dict[str, Any] = {"code": exc.code, "message": str(exc)}
    if isinstance(exc, RateLimited):
        err["retry_after"] = exc.retry_after
    return json.dumps({"error": err}).encode()


def _closed_reason(node: Node) -> str | None:
    """Why this node serves nothing (auth_middleware's first checks), or None."""
    replaced = node.membership.superseded if node.membership is not None else None
    if replaced is not None:
        return f"node {node.id} was replaced by the node at {replaced[0]}: it serves nothing"
    return node.removed_reason()


def _message(data: bytes) -> tuple[int, StoreId, bytes]:
    """A message's id, store and lookup body; InvalidRequest naming what is wrong."""
    try:
        msg = msgpack.unpackb(data, raw=False, max_array_len=3, max_map_len=0)
    except Exception as exc:
        raise InvalidRequest(f"lookup channel: a message does not decode ({exc})") from exc
    if (
        not isinstance(msg, list)
        or len(msg) != 3
        or type(msg[0]) is not int
        or not 0 <= msg[0] <= MAX_ID
        or not isinstance(msg[1], str)
        or not isinstance(msg[2], bytes)
    ):
        raise InvalidRequest("lookup channel: a message is [id, store, body]")
    if len(msg[1]) > MAX_STORE_TEXT:
        raise InvalidRequest(f"lookup channel: a store's name is at most {MAX_STORE_TEXT} long")
    return msg[0], parsed_store(msg[1]), msg[2]


async def _answer(
    request: web.Request, who: Principal, store: StoreId, body: bytes, lease: Lease
) -> bytes:
    """One message's lookup, through the route's checks (module docstring); its bytes, then
    its reads and answer, taken from ``lease``."""
    app = request.app
    node = app[NODE]
    reason = _closed_reason(node)
    if reason is not None:
        raise NodeUnavailable(reason)
    if who.kind == "token":  # judged again: a token file reloaded since counts
        who = node.access.authenticate(request, addressed_to(node))
    if who.grant is not None:
        Grants.authorize(who.grant, "read", store.query)
    node.access.admit(who, len(body))
    try:
        await lease.take(len(body), "a lookup channel's message")
        gate = node.foreground
        gate.begin()
        try:
            answer = await answer_lookup(app, store, body, lease)
        finally:
            gate.end()
        node.access.charge(who, len(answer))
        return answer
    finally:
        node.access.done(who)


async def lookups(request: web.Request) -> web.WebSocketResponse:
    """``GET /v1/lookups``: a lookup channel (module docstring)."""
    node = request.app[NODE]
    who = principal(request)
    if who.kind == "node":
        raise InvalidRequest("ring nodes send their lookups as POST .../lookup")
    # the channels together hold at most a quarter of the budget: idle ones, kept open by a
    # message every few minutes, could otherwise hold all of it (a caller refused sends its
    # lookups as requests)
    if (len(request.app[CHANNELS]) + 1) * MESSAGE_BYTES > node.budget.limit // CHANNELS_SHARE:
        raise RateLimited(
            f"this node serves {len(request.app[CHANNELS])} lookup channels, what a "
            f"1/{CHANNELS_SHARE} of its --memory-budget holds: send lookups as POST "
            ".../lookup",
            retry_after=60.0,  # the SDK asks again after net/http.PLAIN_FOR (60 s)
        )
    # the message being read, for the channel's life: no room, no channel (its caller sends
    # requests); given back with the request's lease when the channel ends
    await request[LEASE].take(MESSAGE_BYTES, "a lookup channel", patient=False)
    ws = web.WebSocketResponse(max_msg_size=MESSAGE_BYTES)
    await ws.prepare(request)
    channels = request.app[CHANNELS]
    channels[ws] = request.transport
    metrics = request.app[METRICS]
    room = asyncio.Semaphore(IN_FLIGHT)
    running: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    async def serve(mid: int, store: StoreId, body: bytes) -> None:
        lease = Lease(node.budget)  # held until the answer is sent
        close: WSCloseCode | None = None
        try:
            try:
                status, answer = 200, await _answer(request, who, store, body, lease)
            except StateStoreError as exc:
                status, answer = exc.status, _error(exc)
                if isinstance(exc, Unauthenticated):
                    close = WSCloseCode.POLICY_VIOLATION  # a token no longer valid
                elif isinstance(exc, NodeUnavailable) and _closed_reason(node) is not None:
                    close = WSCloseCode.GOING_AWAY
            except Exception as exc:  # the boundary, as errors_middleware's
                log.exception("unhandled error on a lookup channel's message of %s", store)
                err = StateStoreError(f"node error: {type(exc).__name__}: {exc}")
                status, answer = 500, _error(err)
            metrics.bytes_in.inc(len(body))
            if status >= 400:
                metrics.refused(status, json.loads(answer)["error"]["code"])
            if not ws.closed:
                frame = msgpack.packb([mid, status, answer, node.epoch])
                try:
                    if len(frame) < SMALL and not _pending(request.transport):
                        await ws.send_bytes(frame)  # into an empty buffer: it does not wait
                    else:
                        async with asyncio.timeout(SEND_TIMEOUT):
                            await ws.send_bytes(frame)
                except TimeoutError:
                    _drop(request.transport)  # a reader that stopped reading
                except (ConnectionError, RuntimeError):
                    pass  # the reader went away: nothing to answer
                else:
                    metrics.bytes_out.inc(len(frame))
                    node.served.add(len(frame), node.clock())
            if close is not None:
                await _close(ws, request.transport, close, b"lookup channel: closed")
        finally:
            await lease.close()
            room.release()

    last = [loop.time()]  # of the last message: pings do not keep a channel open
    idle = asyncio.ensure_future(_close_when_idle(ws, request.transport, last))
    try:
        while True:
            await room.acquire()
            msg = await ws.receive()
            last[0] = loop.time()
            if msg.type != WSMsgType.BINARY:
                room.release()
                if msg.type == WSMsgType.TEXT:
                    metrics.refused(400, InvalidRequest.code)
                    code, why = WSCloseCode.UNSUPPORTED_DATA, b"messages are binary msgpack"
                    await _close(ws, request.transport, code, why)
                break  # closed, or not a WebSocket frame, or too large (closed with 1009)
            try:
                mid, store, body = _message(msg.data)
            except StateStoreError as exc:
                room.release()
                metrics.refused(exc.status, exc.code)
                why = str(exc).encode()[:120]
                await _close(ws, request.transport, WSCloseCode.POLICY_VIOLATION, why)
                break
            task = asyncio.ensure_future(serve(mid, store, body))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        idle.cancel()
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        channels.pop(ws, None)
        await _close(ws, request.transport, WSCloseCode.OK, b"")
    return ws


async def _close_when_idle(
    ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None, last: list[float]
) -> None:
    """Close ``ws`` once it carried no message for :data:`IDLE` seconds (``last[0]``: when
    its last one came): one timer a channel, not one a message."""
    loop = asyncio.get_running_loop()
    while not ws.closed:
        wait = last[0] + IDLE - loop.time()
        if wait <= 0:
            await _close(ws, transport, WSCloseCode.GOING_AWAY, b"lookup channel: idle")
            return
        await asyncio.sleep(wait)


def _pending(transport: asyncio.BaseTransport | None) -> int:
    """Bytes ``transport`` has not sent yet (0 when there is none)."""
    size = getattr(transport, "get_write_buffer_size", None)
    return int(size()) if size is not None else 0


async def _close(
    ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None, code: int, why: bytes
) -> None:
    """Close ``ws``, or drop its connection when the close does not finish in time (a peer
    that reads nothing holds a close's send for ever)."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await ws.close(code=code, message=why)
    except TimeoutError:
        _drop(transport)


def _drop(transport: asyncio.BaseTransport | None) -> None:
    if transport is not None and not transport.is_closing():
        transport.abort()  # type: ignore[attr-defined]


Channels = dict[web.WebSocketResponse, asyncio.BaseTransport | None]
CHANNELS: web.AppKey[Channels] = web.AppKey("lookup_channels")


async def _close_all(app: web.Application) -> None:
    """On shutdown: every channel closed at once, so that none holds the node's stop."""
    held: Channels = app[CHANNELS]
    code = WSCloseCode.GOING_AWAY
    await asyncio.gather(*(_close(ws, t, code, b"node stopping") for ws, t in list(held.items())))


def register(app: web.Application) -> None:
    open_channels: Channels = {}
    app[CHANNELS] = open_channels
    app.on_shutdown.append(_close_all)
    app.router.add_get("/v1/lookups", lookups)
