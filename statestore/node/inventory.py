"""What this node holds, for operators: ``GET /v1/inventory`` (every store with its head,
retained versions and floor) and ``GET /v1/inventory/{store}`` (one store's manifests and the
chunks held here). ``?scope=ring`` on the listing asks every live member and merges their
answers with :func:`statestore.core.inventory.merge_listings` (the dashboard's store table);
the admin CLI does the same merge itself.

Read-only; nothing here decides anything about placement or repair.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from statestore.core.errors import StateStoreError
from statestore.core.ids import StoreId
from statestore.core.inventory import manifest_to_json, merge_listings, summaries_json
from statestore.node.auth import principal
from statestore.node.daemon import NODE, Node
from statestore.wire.head import to_json as head_json

__all__ = ["local_detail", "local_listing", "register"]

log = logging.getLogger(__name__)


def local_listing(node: Node, query: str | None = None) -> dict[str, Any]:
    """Every store this node holds a head of (optionally of one query)."""
    out = []
    for store in node.store.stores():
        if query is not None and store.query != query:
            continue
        head = node.store.head(store)
        floor = node.store.floor(store)
        out.append(
            {
                "store": store.path,
                "head": None if head is None else head_json(head),
                "versions": [v for v in node.store.versions(store) if v >= floor],
                "floor": floor,
            }
        )
    return {"node": node.id, "address": node.address, "stores": out}


def local_detail(node: Node, store: StoreId) -> dict[str, Any]:
    """One store's manifests (JSON form) and the chunk keys of it held on this node."""
    head = node.store.head(store)
    deltas, snaps = node.store.manifests(store)
    manifests = [manifest_to_json(m) for t in (deltas, snaps) for ms in t.values() for m in ms]
    manifests.sort(key=lambda m: (m["version"], m["kind"], -m["epoch"]))
    chunks = node.store.store_chunk_keys(store)
    return {
        "node": node.id,
        "address": node.address,
        "store": store.path,
        "head": None if head is None else head_json(head),
        "floor": node.store.floor(store),
        "thinning": _thinning_json(node, store),
        "manifests": manifests,
        "chunks": chunks,
    }


def _thinning_json(node: Node, store: StoreId) -> dict[str, int]:
    """The store's thinning lines here (core/retention.Thinning; zeros: none drawn)."""
    t = node.store.thinning(store)
    return {"below": t.below, "every": t.every, "chunks": t.chunks, "floor": t.floor}


async def _ring_listing(node: Node, query: str | None, auth: str | None) -> dict[str, Any]:
    view = node.view()
    path = "/v1/inventory" + (f"?query={query}" if query is not None else "")

    async def ask(address: str) -> Any:
        if address == node.address:
            return local_listing(node, query)
        headers = {"Authorization": auth} if auth else {}  # peers judge the caller's token
        resp = await node.transport.request("GET", address, path, headers=headers, timeout=5.0)
        return resp.json()

    addresses = view.live_addresses()
    answers = await asyncio.gather(*(ask(a) for a in addresses), return_exceptions=True)
    listings: dict[str, Any] = {}
    unanswered: list[str] = []
    for address, answer in zip(addresses, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, StateStoreError):
                log.warning("inventory from %s failed: %r", address, answer)
            unanswered.append(address)
        else:
            listings[address] = answer
    return {
        "epoch": view.epoch,
        "stores": summaries_json(merge_listings(listings, query)),
        "unanswered": unanswered,
    }


async def inventory(request: web.Request) -> web.Response:
    node = request.app[NODE]
    query = request.query.get("query") or None
    if query is not None:
        StoreId(query, 0, 0, "x")  # validates the query name (InvalidStoreId names it)
    if request.query.get("scope", "node") == "ring":
        body = await _ring_listing(node, query, request.headers.get("Authorization"))
    else:
        body = local_listing(node, query)
    grant = principal(request).grant  # a token sees the stores of its queries only
    if grant is not None:
        body["stores"] = [
            s for s in body["stores"] if grant.covers(StoreId.parse(s["store"]).query)
        ]
    return web.json_response(body)


async def store_inventory(request: web.Request) -> web.Response:
    node = request.app[NODE]
    mi = request.match_info
    store = StoreId.parse(f"{mi['query']}/{mi['operator']}/{mi['partition']}/{mi['name']}")
    return web.json_response(local_detail(node, store))


def register(app: web.Application) -> None:
    app.router.add_get("/v1/inventory", inventory)
    app.router.add_get("/v1/inventory/{query}/{operator}/{partition}/{name}", store_inventory)
