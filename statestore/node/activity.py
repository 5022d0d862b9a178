"""What this node is doing right now: commits, restores and relay hops in flight, and the
repair loop's backlog (``GET /v1/activity``, drawn by the dashboard).

The metrics middleware (node/metrics.py) opens and closes an :class:`Activity` entry around
each request it times; nothing else writes here.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from statestore.core.access import Grant
from statestore.node.auth import principal
from statestore.node.daemon import NODE

__all__ = ["ACTIVITY", "Activity", "Operation", "local_activity", "register"]


@dataclass(frozen=True)
class Operation:
    """One request in flight: what (``commit``, ``restore``, ``relay``, ``point_read``), on
    which store (empty when only the body says), for whom, since when (node clock)."""

    kind: str
    store: str
    peer: str
    started: float


class Activity:
    """The operations in flight on one node (single event loop: no lock needed)."""

    def __init__(self) -> None:
        self._ops: dict[int, Operation] = {}
        self._ids = itertools.count(1)

    def begin(self, op: Operation) -> int:
        token = next(self._ids)
        self._ops[token] = op
        return token

    def end(self, token: int) -> None:
        self._ops.pop(token, None)

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        return [
            {
                "kind": op.kind,
                "store": op.store,
                "peer": op.peer,
                "seconds": round(max(0.0, now - op.started), 3),
            }
            for op in sorted(self._ops.values(), key=lambda o: o.started)
        ]

    def count(self, kind: str) -> int:
        return sum(1 for op in self._ops.values() if op.kind == kind)


ACTIVITY = web.AppKey("activity", Activity)


def local_activity(app: web.Application, grant: Grant | None = None) -> dict[str, Any]:
    """This node's operations in flight and its repair and compaction figures; with a
    token's ``grant``, only the operations on stores of its queries (another tenant's store
    names and clients' addresses are none of its business)."""
    node = app[NODE]
    stats = dict(node.stats)
    operations = app[ACTIVITY].snapshot(node.clock())
    if grant is not None:
        operations = [
            op for op in operations if op["store"] and grant.covers(op["store"].split("/", 1)[0])
        ]
    return {
        "id": node.id,
        "address": node.address,
        "epoch": node.epoch,
        "operations": operations,
        "repair": {
            # items this node holds that an owner still lacks (copies and hand-offs to do)
            "backlog": stats.get("repair_backlog", 0),
            "repaired": stats.get("repaired", 0),
            "handed_off": stats.get("handed_off", 0),
        },
        "compaction": {"snapshots": stats.get("snapshots", 0), "gc": stats.get("gc", 0)},
    }


async def activity(request: web.Request) -> web.Response:
    """``GET /v1/activity``: this node's; ``?scope=ring``: every live member's."""
    app = request.app
    grant = principal(request).grant
    if request.query.get("scope", "node") != "ring":
        return web.json_response(local_activity(app, grant))
    node = app[NODE]
    view = node.view()
    auth = request.headers.get("Authorization")  # peers judge the caller's token
    forward = {"Authorization": auth} if auth else {}

    async def ask(address: str) -> Any:
        if address == node.address:
            return local_activity(app, grant)
        resp = await node.transport.request(
            "GET", address, "/v1/activity", headers=forward, timeout=5.0
        )
        return resp.json()

    addresses = view.live_addresses()
    answers = await asyncio.gather(*(ask(a) for a in addresses), return_exceptions=True)
    nodes = [a for a in answers if isinstance(a, dict)]
    if grant is not None:
        # a peer asked with the secret answers a node, everything: filtered here too
        for answer in nodes:
            ops = answer.get("operations")
            answer["operations"] = [
                op
                for op in (ops if isinstance(ops, list) else [])
                if isinstance(op, dict)
                and isinstance(op.get("store"), str)
                and op["store"]
                and grant.covers(op["store"].split("/", 1)[0])
            ]
    unanswered = [
        addr for addr, a in zip(addresses, answers, strict=True) if not isinstance(a, dict)
    ]
    return web.json_response({"epoch": view.epoch, "nodes": nodes, "unanswered": unanswered})


def register(app: web.Application) -> None:
    app[ACTIVITY] = Activity()
    app.router.add_get("/v1/activity", activity)
