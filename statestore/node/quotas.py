"""Per-query storage quotas at the node's HTTP boundary (docs/security.md, Quotas).

The decision and the counting are pure (core/quota.py) and kept by the store
(node/replica.py: every write counts its bytes per query; a writer's chunk or manifest
carries its query's limit and is refused past it). This module decides *which* writes are
charged, and serves the room check writers ask before they send a commit's first chunk:

- Charged: a writer's ``PUT /v1/chunks/{key}`` and ``PUT /v1/manifests/...`` (the SDK, the
  Spark provider, a coordinator's replica writes for ``POST .../commit``).
- Never refused: copies between owners (``?copy=1``: repair's re-replication by a node that
  owns the item, a leave's pushes; a join's pulls are written locally), so a quota never
  lowers the replication of acknowledged data; and a compactor's snapshot
  (``?compaction=1``), which is what lets retention free the versions below it. Both need a
  node (or an ``admin`` token).
- Charged at the receiver: a *hand-off* (``?copy=1&handoff=1``, and ``POST
  /v1/sync/manifests?handoff=1``), repair's push of an item by a node that does not own it
  (it took a writer's write as a stand-in, or under an older view). Without this a writer
  could put data on a non-owner, within that node's quota, and have repair move it to the
  owners uncharged, again and again (docs/security.md, Per-query quotas). A refused hand-off loses
  nothing: the sender drops its copy only once every owner confirmed holding it
  (core/repair.decide), so it keeps it, charged to its own quota.
- ``POST /v1/queries/{query}/room`` (``write``, body wire/bodies.RoomRequest: the chunks it
  would send here and the manifest's bytes): ``{"query", "usage", "limit", "bytes"}`` when
  what this node does not hold yet fits, else ``507 quota_exceeded``. A writer asks each node
  it is about to write to (net/writes.check_room) when the ring view says quotas are on, so
  a commit over quota is refused before anything is stored; chunks a node already holds (a
  retried commit's) count nothing, as their writes would not. ``GET .../room?bytes=N`` asks
  the same for N bytes.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from statestore.core.errors import InvalidRequest
from statestore.core.ids import StoreId, parse_uint
from statestore.core.quota import MAX_QUOTA_BYTES, check
from statestore.node.auth import allow
from statestore.node.daemon import NODE, Node
from statestore.node.request import read_body
from statestore.wire.bodies import RoomRequest, decode_json

__all__ = ["charged_limit", "quota_json", "register"]


def charged_limit(request: web.Request, query: str) -> int | None:
    """The limit a chunk or manifest write to ``query`` is held to: None for a copy between
    owners or a compactor's snapshot (a node, or an admin token), else the query's quota (a
    writer's write, or a hand-off: ``?copy=1&handoff=1``)."""
    if request.query.get("copy") == "1" or request.query.get("compaction") == "1":
        allow(request, "admin", query)  # a ring node passes; a token needs admin
        if request.query.get("handoff") != "1":
            return None
    limit: int | None = request.app[NODE].quota_limit(query)
    return limit


def quota_json(node: Node, query: str) -> dict[str, int | None]:
    return {"usage": node.store.query_bytes(query), "limit": node.quota_limit(query)}


async def room(request: web.Request) -> web.Response:
    node = request.app[NODE]
    query = request.match_info["query"]
    StoreId(query, 0, 0, "x")  # InvalidStoreId names what is wrong with the name
    want = parse_uint(request.query.get("bytes", "0"), "bytes", MAX_QUOTA_BYTES)
    usage, limit = node.store.query_bytes(query), node.quota_limit(query)
    check(query, usage, want, limit)
    return web.json_response({"query": query, "usage": usage, "limit": limit, "bytes": want})


async def room_for(request: web.Request) -> web.Response:
    node = request.app[NODE]
    query = request.match_info["query"]
    StoreId(query, 0, 0, "x")  # InvalidStoreId names what is wrong with the name
    body = decode_json(await read_body(request), RoomRequest, "room request")
    keys = [key for key, _ in body.chunks]
    for key in keys:
        if not key.startswith(query + "/"):
            raise InvalidRequest(f"chunk {key[:200]!r} is not of query {query}")
    held = await asyncio.to_thread(node.store.has_chunks, keys)
    want = body.bytes + sum(n for (_, n), has in zip(body.chunks, held, strict=True) if not has)
    usage, limit = node.store.query_bytes(query), node.quota_limit(query)
    check(query, usage, want, limit)
    return web.json_response({"query": query, "usage": usage, "limit": limit, "bytes": want})


def register(app: web.Application) -> None:
    app.router.add_get("/v1/queries/{query}/room", room)
    app.router.add_post("/v1/queries/{query}/room", room_for)
