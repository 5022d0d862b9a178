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
counts); the ``read`` right on the message's query; the token's rates; the message's bytes,
then its reads and answer, from the node's ``--memory-budget``; the foreground gate. Ring
nodes do not use channels (a node's signed request cannot be judged again: its signature is
spent), so the upgrade refuses them. A message is at most ``--max-body`` bytes (a larger one
closes the channel); at most :data:`IN_FLIGHT` of a channel run at once, the next read when
one ends; a channel idle for :data:`IDLE` seconds is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import msgpack
from aiohttp import WSMsgType, web

from statestore.core.access import Grants
from statestore.core.errors import InvalidRequest, NodeUnavailable, RateLimited, StateStoreError
from statestore.core.ids import StoreId
from statestore.node.auth import Principal, principal
from statestore.node.budget import Lease
from statestore.node.daemon import NODE, Node
from statestore.node.lookup import answer_lookup
from statestore.node.metrics import METRICS
from statestore.node.request import addressed_to

__all__ = ["IDLE", "IN_FLIGHT", "register"]

log = logging.getLogger(__name__)
IN_FLIGHT = 16  # a channel's messages answered at once
IDLE = 300.0  # seconds a channel may carry nothing before it is closed
MAX_ID = (1 << 63) - 1


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
    return msg[0], StoreId.parse(msg[1]), msg[2]


async def _answer(
    request: web.Request, who: Principal, store: StoreId, body: bytes
) -> tuple[int, bytes]:
    """One message's lookup, through the route's checks (module docstring)."""
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
    lease = Lease(node.budget)
    gate = node.foreground
    gate.begin()
    try:
        await lease.take(len(body), "a lookup channel's message")
        answer = await answer_lookup(app, store, body, lease)
        node.access.charge(who, len(answer))
        return 200, answer
    finally:
        gate.end()
        await lease.close()
        node.access.done(who)


async def lookups(request: web.Request) -> web.WebSocketResponse:
    """``GET /v1/lookups``: a lookup channel (module docstring)."""
    node = request.app[NODE]
    who = principal(request)
    if who.kind == "node":
        raise InvalidRequest("ring nodes send their lookups as POST .../lookup")
    ws = web.WebSocketResponse(max_msg_size=node.config.max_body, receive_timeout=IDLE)
    await ws.prepare(request)
    channels = request.app[CHANNELS]
    channels.add(ws)
    metrics = request.app[METRICS]
    room = asyncio.Semaphore(IN_FLIGHT)
    running: set[asyncio.Task[None]] = set()

    async def serve(mid: int, store: StoreId, body: bytes) -> None:
        try:
            status, answer = await _answer(request, who, store, body)
        except StateStoreError as exc:
            status, answer = exc.status, _error(exc)
            if isinstance(exc, NodeUnavailable) and _closed_reason(node) is not None:
                await ws.close()
        except Exception as exc:  # the boundary, as errors_middleware's
            log.exception("unhandled error on a lookup channel's message of %s", store)
            err = StateStoreError(f"node error: {type(exc).__name__}: {exc}")
            status, answer = 500, _error(err)
        finally:
            room.release()
        metrics.bytes_in.inc(len(body))
        metrics.bytes_out.inc(len(answer))
        node.served.add(len(answer), node.clock())
        if status >= 400:
            metrics.refused(status, json.loads(answer)["error"]["code"])
        if not ws.closed:
            try:
                await ws.send_bytes(msgpack.packb([mid, status, answer, node.epoch]))
            except (ConnectionError, RuntimeError):
                pass  # the reader went away: nothing to answer

    try:
        while True:
            await room.acquire()
            try:
                msg = await ws.receive()
            except TimeoutError:
                room.release()
                break  # idle for too long
            if msg.type != WSMsgType.BINARY:
                room.release()
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    break
                if msg.type == WSMsgType.ERROR:  # too large, or not a WebSocket frame
                    break
                await ws.close(message=b"lookup channel: messages are binary msgpack")
                break
            try:
                mid, store, body = _message(msg.data)
            except StateStoreError as exc:
                room.release()
                await ws.close(message=str(exc).encode()[:120])
                break
            task = asyncio.ensure_future(serve(mid, store, body))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        channels.discard(ws)
        await ws.close()
    return ws


Channels = set[web.WebSocketResponse]
CHANNELS: web.AppKey[Channels] = web.AppKey("lookup_channels")


async def _close_all(app: web.Application) -> None:
    """On shutdown: every channel closed, so that none holds the node's stop."""
    held: Channels = app[CHANNELS]
    for ws in list(held):
        await ws.close(code=1001, message=b"node stopping")


def register(app: web.Application) -> None:
    open_channels: Channels = set()
    app[CHANNELS] = open_channels
    app.on_shutdown.append(_close_all)
    app.router.add_get("/v1/lookups", lookups)
