"""The routes of moves, registered by :func:`register` (every one in node/policy.py's table):

- ``POST /v1/handover/items`` (between nodes): a page of the items this node holds that a
  joining node (or one growing its token count) will own, and how this node sees it: what a
  join's rounds list (node/moves/join.py), what :func:`~statestore.node.moves.rounds.spread`
  and the startup checks ask (node/moves/startup.py), and ``statestore removenode`` too;
- ``POST /v1/handover/leave`` (ring admin): decommission this node (node/moves/leave.py);
- ``GET /v1/handover``: this node's ring state and the progress of its move;
- ``POST /v1/handover/tokens`` (ring admin) and ``GET /v1/load``: token moves
  (node/moves/rebalance.py);
- ``POST /v1/sync/manifests`` and ``POST /v1/sync/manifests/read`` (between nodes): a round's
  manifests in batches (node/moves/copies.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from statestore.core.handover import FUTURE_STATES
from statestore.core.ids import StoreId
from statestore.core.items import ChunkItem
from statestore.core.placement import Member, Ring
from statestore.node.auth import allow, allow_ring
from statestore.node.daemon import NODE, Node
from statestore.node.moves.copies import put_copies, read_copies
from statestore.node.moves.leave import start_leave
from statestore.node.moves.rebalance import load_handler, tokens_handler
from statestore.node.request import read_body
from statestore.wire.bodies import HandoverItemsRequest, decode_json

__all__ = ["items_for", "move_json", "register"]


# -- the source's side: what a joining node will own ---------------------------------------


def items_for(node: Node, target: str, zone: str, vnodes: int = 0) -> list[str]:
    """The items this node holds that ``target`` will own: placed on the future ring (live
    ``normal`` and ``joining`` members) with ``target`` in it, owning ``vnodes`` tokens (0:
    the ring's count), even before gossip told us it joins or grows, so a listing is never
    short because our view lags."""
    view = node.view()
    members = {
        m.placed_later(view.vnodes)
        for m in view.members
        if m.status != "down" and m.state in FUTURE_STATES and m.id != target
    }
    ring = Ring(members | {Member(target, zone, vnodes)}, view.vnodes)
    r = view.replicas
    out = [ChunkItem(k).name() for k in node.store.chunk_keys() if target in ring.replicas(k, r)]
    owns: dict[StoreId, bool] = {}
    for it in node.store.manifest_items():
        if it.store not in owns:
            owns[it.store] = target in ring.replicas(it.placement_key, r)
        if owns[it.store]:
            out.append(it.name())
    out.sort()
    return out


async def handover_items(request: web.Request) -> web.Response:
    """``POST /v1/handover/items``: a page of the items this node holds that a joining node
    will own, and the ring state this node sees for it (``limit`` 0: the state only, and how
    this node sees that member: ``member`` status, state, incarnation, zone, or null)."""
    node = request.app[NODE]
    allow(request, "admin")
    body = decode_json(await read_body(request), HandoverItemsRequest, "handover items")
    if body.limit:
        node.check_copies_served()  # no item listed before the drops it missed are known
    assert node.membership is not None
    seen = node.membership.get(body.node)
    state = None if seen is None or seen.status.value == "down" else seen.state.value
    # the token counts this node routes ``body.node`` by (a rebalance waits for them)
    counts = {
        "vnodes": 0 if seen is None else seen.vnodes,
        "next_vnodes": 0 if seen is None else seen.next_vnodes,
    }
    if body.limit == 0:
        member = (
            None
            if seen is None
            else {
                "status": seen.status.value,
                "state": seen.state.value,
                "incarnation": seen.incarnation,
                "zone": seen.zone,
            }
            | (  # only when marked: the answer of a ring that never removed a node is as before
                {"removal": seen.removal, "removed_by": seen.removed_by} if seen.removal else {}
            )
        )
        return web.json_response(
            {"state": state, "member": member, "items": [], "next": None} | counts
        )
    # listing, paging and encoding (5,000 names: ~10 ms of JSON) in a worker thread, so
    # clients' requests go on meanwhile
    page = await asyncio.to_thread(_page, node, body, {"state": state} | counts)
    return web.Response(body=page, content_type="application/json")


def _page(node: Node, body: HandoverItemsRequest, answer: dict[str, Any]) -> bytes:
    items = items_for(node, body.node, body.zone, body.vnodes)
    if body.after:
        items = [i for i in items if i > body.after]
    page = items[: body.limit]
    more = len(items) > body.limit
    return json.dumps(
        answer | {"items": page, "next": page[-1] if more and page else None}
    ).encode()


# -- a move's start and progress ---------------------------------------------------------


async def leave_handler(request: web.Request) -> web.Response:
    """``POST /v1/handover/leave``: decommission this node (202; progress at
    ``GET /v1/handover``)."""
    node = request.app[NODE]
    allow_ring(request)
    move = start_leave(node)
    return web.json_response(move.to_json(node.clock()), status=202)


def move_json(node: Node) -> dict[str, Any]:
    """This node's ring state, its move (null when it never moved), and how many copies
    waited for its clients' requests so far (``yielded``, node/foreground.py)."""
    state = node.membership.state.value if node.membership is not None else "normal"
    move = None if node.move is None else node.move.to_json(node.clock())
    return {
        "id": node.id,
        "address": node.address,
        "state": state,
        "move": move,
        "yielded": node.foreground.yielded,
    }


async def progress(request: web.Request) -> web.Response:
    """``GET /v1/handover``: this node's ring state and the progress of its move."""
    node = request.app[NODE]
    allow(request, "read")
    return web.json_response(move_json(node))


def register(app: web.Application) -> None:
    """Add the routes of moves to ``app`` (which holds its node)."""
    app.router.add_post("/v1/handover/items", handover_items)
    app.router.add_post("/v1/handover/leave", leave_handler)
    app.router.add_get("/v1/handover", progress)
    app.router.add_get("/v1/load", load_handler)
    app.router.add_post("/v1/handover/tokens", tokens_handler)
    app.router.add_post("/v1/sync/manifests", put_copies)
    app.router.add_post("/v1/sync/manifests/read", read_copies)
