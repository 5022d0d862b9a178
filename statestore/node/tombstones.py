"""Dropping a finished query's state everywhere, and keeping it dropped.

``POST /v1/queries/{query}/drop`` (admin) makes the node it reaches the drop's coordinator:

1. **purge**: every member of the ring (down ones too, in case they answer) is sent
   ``POST /v1/queries/{query}/purge {"id", "at", "phase": "purge"}``. Each records a tombstone
   for the query, starts refusing writes to it (chunks, manifests, commits: ``QueryDropping``, 409,
   "being dropped"), and deletes its chunks, manifests, heads and floors in one atomic write
   on the writer thread (so a write queued before it is deleted too).
2. **seal**: once every reachable member purged, each is sent ``"phase": "seal"`` and accepts
   writes to the query again: a dropped query can be written anew from version 1.

Refusing writes between the two phases is what keeps the repair loop from bringing the data
back: a node that has not purged yet may be pushing a copy to one that has, and that push is
refused. A pull (a join's or token move's rounds, repair's reconciliation) is written only
under the tombstone it read before its fetch (:func:`copy_mark`): one a peer that had not
purged yet served, or one fetched before this node's purge and written after, is dropped.

**Copies pushed across a drop.** A push (repair's copies, a hand-over's manifests, a hint's
copy to its owners) is read on the sender and written on the receiver: one read before the
sender's purge and delivered after the receiver's seal would bring the dropped data back.
The sender reads each query's drop id (its tombstone's, none when it holds none) before the
query's data and sends them with the copy (``X-Statestore-Drops``, :class:`DropMarks`); the
receiver takes a copy of a query only while its own drop id for it is none or the sender's
(:func:`check_pushed`), so data read under an older drop, or by a sender that never heard of
the drop, is refused.

A member that could not be reached (down) still holds the query's data; it learns the
tombstone from its peers (``GET /v1/tombstones``, :func:`tombstone_loop`) on its first
exchange after it starts, and purges before its repair loop's first pass (which waits
``--down-after``). A tombstone learned later than that (a member that was up but missed the
purge) is only recorded and logged: the data it holds may already be a new incarnation of
the query, so the operator runs the drop again (the drop command reports such members).

A compactor's snapshot is such a push too: it reads the query's drop id before its restore
and sends it with the snapshot's chunks and manifest (``?compaction=1``), so a snapshot
folded before a drop and written after its seal is refused. Drop finished queries: a writer
still running writes the query anew after the seal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from statestore.core.errors import (
    InvalidRequest,
    QueryDropping,
    StateStoreError,
    Unauthenticated,
)
from statestore.core.ids import StoreId
from statestore.node.auth import allow, is_node, principal
from statestore.node.daemon import NODE, Node
from statestore.node.quotas import quota_json
from statestore.node.request import read_body
from statestore.wire.bodies import PurgeRequest, decode_json
from statestore.wire.headers import DROPS_HEADER

__all__ = [
    "DROPPING",
    "DropMarks",
    "Dropping",
    "check_pushed",
    "copy_mark",
    "pushed_marks",
    "register",
    "tombstone_loop",
]

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WRITE_AREAS = frozenset({"chunks", "manifests", "stores", "hints"})


class Dropping:
    """The queries this node refuses writes to (a drop between purge and seal)."""

    def __init__(self, node: Node) -> None:
        self.queries: set[str] = set()
        for raw in node.store.tombstones():
            t = _decode(raw)
            if t is not None and t.get("state") == "purging":
                self.queries.add(str(t["query"]))  # a drop that never sealed: still refused

    def check(self, query: str) -> None:
        """QueryDropping while ``query`` is between a drop's purge and its seal: the check
        every write a request brings takes (the routes' middleware, the batched copies of
        node/moves/copies.py), run right before the write is queued, so that a purge (a
        barrier) deletes whatever passed it; a pull's writes are held to :func:`copy_mark`."""
        if query in self.queries:
            raise QueryDropping(
                f"query {query} is being dropped; nothing of it is written until the drop "
                "finishes: retry after `statestore drop` returned"
            )


DROPPING = web.AppKey("dropping", Dropping)


def copy_mark(node: Node, query: str) -> bytes | None:
    """What a copy of ``query``'s data pulled from a peer (a join's or token move's pulls,
    repair's reconciliation) is written under: the query's tombstone here, read before the
    fetch; the write (NodeStore.put_chunk_copy, copy_pulled) is dropped if it changed by
    then, so a drop's purge that ran meanwhile (a barrier on the writer) is not undone by
    what a peer that had not purged yet served. QueryDropping while the query is being
    dropped here (purged, not sealed): nothing of it is pulled then."""
    raw = node.store.tombstone(query)
    t = _decode(raw) if raw is not None else None
    if t is not None and t.get("state") == "purging":
        raise QueryDropping(f"query {query} is being dropped: nothing of it is copied here")
    return raw


def drop_id(node: Node, query: str) -> str:
    """The id of the drop this node last recorded for ``query`` ("" for none, or a record
    that rotted)."""
    raw = node.store.tombstone(query)
    t = _decode(raw) if raw is not None else None
    tid = t.get("id") if t is not None else None
    return tid if isinstance(tid, str) else ""


class DropMarks:
    """The sender's side of a push: the drop ids of the queries it carries, each read
    (:meth:`read`) before the first of that query's data is read (an id read earlier than
    needed only refuses more), sent as :data:`DROPS_HEADER` (queries with none are left
    out: the header lists every drop the sender knows of among them)."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._ids: dict[str, str] = {}

    def read(self, query: str) -> None:
        if query not in self._ids:
            self._ids[query] = drop_id(self._node, query)

    def dropped(self, queries: Iterable[str]) -> int:
        """How many of ``queries`` (each read) have a drop id: the header's entries."""
        return sum(1 for q in queries if self._ids[q])

    def headers(self, queries: Iterable[str]) -> dict[str, str]:
        """The header for a push of ``queries`` (each read)."""
        ids = {q: self._ids[q] for q in queries if self._ids[q]}
        return {DROPS_HEADER: json.dumps(ids, sort_keys=True, separators=(",", ":"))}


MAX_DROP_MARKS = 16  # drop ids a push carries (a batch is sent before it would carry more)


def pushed_marks(request: web.Request) -> dict[str, str] | None:
    """The sender's drop ids of a pushed copy (:class:`DropMarks`); None when the header is
    absent (a node of the build before: its copies are taken as they were). Typed and
    bounded: InvalidRequest (400) for anything but a JSON object of at most
    :data:`MAX_DROP_MARKS` query names to ids."""
    text = request.headers.get(DROPS_HEADER)
    if text is None:
        return None
    try:
        ids = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        ids = None
    if (
        not isinstance(ids, dict)
        or len(ids) > MAX_DROP_MARKS
        or not all(isinstance(q, str) and isinstance(i, str) for q, i in ids.items())
    ):
        raise InvalidRequest(
            f"{DROPS_HEADER}: a JSON object of at most {MAX_DROP_MARKS} query names to drop "
            "ids (strings)"
        )
    return ids


def check_pushed(node: Node, marks: dict[str, str] | None, query: str) -> None:
    """QueryDropping when a pushed copy of ``query`` was read under another drop than the
    one this node last recorded for it (``marks``: :func:`pushed_marks`): data a drop
    deleted is not brought back by a push read before it. Called right before the write is
    queued, with no await between (a purge queued later deletes what passed)."""
    if marks is None:
        return
    mine = drop_id(node, query)
    if mine and marks.get(query, "") != mine:
        theirs = marks.get(query) or "none"
        raise QueryDropping(
            f"a copy of query {query} read before its drop {mine} (the sender's drop: "
            f"{theirs}) is not taken: dropped data does not come back"
        )


def _check_query(query: str) -> str:
    StoreId(query, 0, 0, "x")  # InvalidStoreId names what is wrong with the query name
    return query


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        t = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(t, dict) or not isinstance(t.get("query"), str):
        return None
    return t


def _encode(t: dict[str, Any]) -> bytes:
    return json.dumps(t, sort_keys=True).encode()


def _require_node(request: web.Request, query: str) -> None:
    """A purge comes from a ring node: signed when the ring has node identity; without it,
    with the admin token the drop's caller gave (forwarded by the coordinating node)."""
    if is_node(request):
        return
    if request.app[NODE].access.identity_on:
        raise Unauthenticated(
            f"purging query {query} is for ring nodes (signed requests): to drop a query, "
            f"POST /v1/queries/{query}/drop with an admin token"
        )
    allow(request, "admin", query)


async def purge_local(node: Node, dropping: Dropping, query: str, t: dict[str, Any]) -> Any:
    """Phase ``purge`` on this node: refuse writes, delete the query, keep the tombstone."""
    dropping.queries.add(query)
    t = {**t, "query": query, "state": "purging"}
    try:
        return await node.write(node.store.purge_query, query, _encode(t), order="barrier")
    finally:
        for forget in node.purge_hooks:
            forget(query)


async def seal_local(node: Node, dropping: Dropping, query: str, t: dict[str, Any]) -> None:
    """Phase ``seal``: the tombstone is final and the query may be written again."""
    raw = node.store.tombstone(query)
    old = _decode(raw) if raw is not None else None
    if old is not None and old.get("id") == t.get("id"):
        await node.write(node.store.put_tombstone, query, _encode({**old, "state": "sealed"}))
    dropping.queries.discard(query)


async def drop(request: web.Request) -> web.Response:
    """``POST /v1/queries/{query}/drop``: purge then seal on every member; the answer says,
    per member, what it deleted or why it could not be reached."""
    node, dropping = request.app[NODE], request.app[DROPPING]
    query = _check_query(request.match_info["query"])
    # after any drop of the query this node knows, whatever its clock says: members that
    # missed this one take it from their peers only when it is the newer (_learn)
    raw = node.store.tombstone(query)
    known = _decode(raw) if raw is not None else None
    before = known.get("at") if known is not None else None
    at = time.time()
    if isinstance(before, int | float) and at <= before:
        at = math.nextafter(float(before), math.inf)
    t = {"id": uuid.uuid4().hex, "at": at, "query": query}
    # without node identity, peers judge the purge by the caller's own (admin) token
    auth = request.headers.get("Authorization")
    forward = {"Authorization": auth} if auth else {}
    view = node.view()
    path = f"/v1/queries/{query}/purge"

    async def phase(address: str, name: str) -> Any:
        body = {"id": t["id"], "at": t["at"], "phase": name}
        if address == node.address:
            if name == "purge":
                return await purge_local(node, dropping, query, t)
            return await seal_local(node, dropping, query, t)
        resp = await node.transport.request(
            "POST", address, path, json_body=body, headers=forward, timeout=10.0
        )
        return resp.json().get("purged")

    members = [(m.address, m.status) for m in view.members]
    if node.address not in {a for a, _ in members}:
        members.append((node.address, "up"))
    purged = await asyncio.gather(*(phase(a, "purge") for a, _ in members), return_exceptions=True)
    reached = [
        a for (a, _), r in zip(members, purged, strict=True) if not isinstance(r, BaseException)
    ]
    sealed = await asyncio.gather(*(phase(a, "seal") for a in reached), return_exceptions=True)
    seal_errors = {
        a: r for a, r in zip(reached, sealed, strict=True) if isinstance(r, BaseException)
    }
    nodes = []
    for (address, status), r in zip(members, purged, strict=True):
        row: dict[str, Any] = {"address": address, "status": status}
        if isinstance(r, BaseException):
            row["error"] = str(r) or type(r).__name__
        else:
            row["purged"] = r
            if address in seal_errors:
                row["error"] = f"purged but not sealed: {seal_errors[address]}"
        nodes.append(row)
    complete = all("error" not in row for row in nodes)
    if not complete:
        log.warning("drop of query %s did not reach every member: %s", query, nodes)
    return web.json_response({"query": query, "id": t["id"], "complete": complete, "nodes": nodes})


async def purge(request: web.Request) -> web.Response:
    """``POST /v1/queries/{query}/purge`` (ring nodes): one phase of a drop on this node."""
    node, dropping = request.app[NODE], request.app[DROPPING]
    query = _check_query(request.match_info["query"])
    _require_node(request, query)
    body = decode_json(
        await read_body(request), PurgeRequest, "purge", '{"id", "at", "phase": "purge"|"seal"}'
    )
    t = {"id": body.id, "at": body.at, "query": query}
    if body.phase == "purge":
        return web.json_response({"purged": await purge_local(node, dropping, query, t)})
    await seal_local(node, dropping, query, t)
    return web.json_response({"sealed": True})


async def query_holdings(request: web.Request) -> web.Response:
    """``GET /v1/queries/{query}``: how many keys of the query this node holds, by kind, and
    its tombstone (the drop tests check every node with it)."""
    node = request.app[NODE]
    query = _check_query(request.match_info["query"])
    # a scan of every key of the query: in a worker thread, the event loop serving on
    keys = await asyncio.to_thread(node.store.query_keys, query)
    raw = node.store.tombstone(query)
    return web.json_response(
        {
            "query": query,
            "held": {kind: len(ks) for kind, ks in keys.items()},
            "tombstone": _decode(raw) if raw is not None else None,
            "refusing_writes": query in request.app[DROPPING].queries,
            # bytes of chunks and manifests held here, and the quota (node/quotas.py)
            "quota": quota_json(node, query),
        }
    )


async def list_tombstones(request: web.Request) -> web.Response:
    """``GET /v1/tombstones``: the queries dropped here (a token sees those of its queries)."""
    node = request.app[NODE]
    grant = principal(request).grant
    out = [
        t
        for t in map(_decode, node.store.tombstones())
        if t is not None and (grant is None or grant.covers(str(t.get("query"))))
    ]
    return web.json_response({"tombstones": out})


@web.middleware
async def dropping_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse writes to a query between a drop's purge and its seal."""
    dropping = request.app[DROPPING]
    if dropping.queries and request.method in ("PUT", "POST"):
        parts = request.path.split("/", 4)  # "", "v1", area, query, rest
        if len(parts) >= 4 and parts[2] in WRITE_AREAS:
            dropping.check(parts[3])
    return await handler(request)


def _learn(node: Node, t: Any, first: bool) -> tuple[str, bytes] | None:
    """What to do with a peer's tombstone: (query, record) to purge or store, or None."""
    if not isinstance(t, dict) or t.get("state") != "sealed":
        return None
    query, tid, at = t.get("query"), t.get("id"), t.get("at")
    if not (isinstance(query, str) and isinstance(tid, str) and isinstance(at, int | float)):
        return None
    try:
        _check_query(query)
    except StateStoreError:
        return None
    raw = node.store.tombstone(query)
    mine = _decode(raw) if raw is not None else None
    if mine is not None and (mine.get("id") == tid or float(mine.get("at", 0)) >= at):
        return None
    state = "sealed" if first else "missed"
    return query, _encode({"id": tid, "at": float(at), "query": query, "state": state})


FIRST_RETRY = 1.0  # seconds between tombstone exchanges until one was answered


async def tombstone_loop(node: Node) -> None:
    """Learn the tombstones of drops this node missed. On the first exchange after it starts
    the node purges every query dropped meanwhile (what it holds of them predates the drop);
    later ones are recorded as ``missed`` and logged: run the drop again."""
    first = True
    while True:
        assert node.membership is not None
        peers = {m.address for m in node.membership.members() if m.id != node.id}
        peers.update(node.config.seeds)
        peers.discard(node.address)
        asks = [
            # a purge on a peer's word: only an answer signed with the secret (identity)
            node.transport.request(
                "GET", a, "/v1/tombstones", headers=node.access.prove_headers(), timeout=5.0
            )
            for a in sorted(peers)
        ]
        heard = False
        # each answer learned as it comes: a peer that hangs does not hold back the purges
        # the others' answers call for (this node's copies wait for them all, 5 s at most)
        for asked in asyncio.as_completed(asks):
            try:
                answer = await asked
            except Exception:
                continue
            try:
                tombs = answer.json().get("tombstones", [])
            except (ValueError, AttributeError):
                continue
            heard = True
            for t in tombs if isinstance(tombs, list) else []:
                learned = _learn(node, t, first)
                if learned is None:
                    continue
                query, record = learned
                if first:
                    try:
                        purged = await node.write(
                            node.store.purge_query, query, record, order="barrier"
                        )
                    finally:
                        for forget in node.purge_hooks:
                            forget(query)
                    log.warning("query %s was dropped while this node was away: %s", query, purged)
                else:
                    await node.write(node.store.put_tombstone, query, record)
                    log.warning(
                        "query %s was dropped without this node; what it holds of the query "
                        "stays: run `statestore drop --query %s` again",
                        query,
                        query,
                    )
        if heard and not node.tombstones_heard:
            # every peer answered or timed out (5 s), each answer's drops purged as it came:
            # copies may go to peers (not at the first answer: that peer may have been away
            # during a drop another one knows)
            node.heard_drops()
        if heard or node.clock() - node.began >= node.config.down_after:
            first = False  # (no peer answered within --down-after: its copies are served too)
        # until then it asks again soon: its copies wait for it (Node.copies_served)
        await asyncio.sleep(node.config.repair_interval if not first else FIRST_RETRY)


def register(app: web.Application) -> None:
    app[DROPPING] = Dropping(app[NODE])
    app.middlewares.append(dropping_middleware)
    app.router.add_post("/v1/queries/{query}/drop", drop)
    app.router.add_post("/v1/queries/{query}/purge", purge)
    app.router.add_get("/v1/queries/{query}", query_holdings)
    app.router.add_get("/v1/tombstones", list_tombstones)
