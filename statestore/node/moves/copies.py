"""Many manifests copied between nodes in one request, for hand-overs' rounds
(node/moves/rounds.py) and repair's hand-offs (node/repair.py).

A manifest is a few hundred bytes to a few KB; copied one request at a time, a 1 GiB move's
thousands of them cost about a quarter of its CPU on the nodes (HTTP, signatures, a writer
job and an fsync each, docs/benchmarks.md). Here up to :data:`MAX_COPIES` go at once:

- ``POST /v1/sync/manifests`` (a leave pushes): a msgpack array of manifests as stored
  (wire/manifest.encode_copies), within ``--max-body`` as a single copy is (a sender keeps a
  batch to :data:`MAX_COPIES_BYTES`; a larger manifest goes alone). Every one is validated
  as ``PUT /v1/manifests/...?copy=1`` validates one, before anything is written: one that
  does not decode, names a bad chunk, or is for a query the caller has no ``admin`` right on
  refuses the whole request. Those at or above their store's retention floor are kept in one
  writer job (after clients' writes) and one atomic write; the answer says per manifest
  stored, already held, or refused (below the floor, or a delta at it whose base is gone).
- ``POST /v1/sync/manifests/read`` (a join fetches): JSON ``{"manifests": [[store,
  version, kind, epoch], ...]}``; the answer is the same array, nil for one not held, after
  this node's clients' requests (node/foreground.py). It stops before :data:`MAX_COPIES_BYTES`:
  a shorter answer than asked leaves the rest to be asked again.

Both are for ring nodes (or an admin token on the queries named): not a client's reads or
writes. A node that predates them answers 404: the caller copies one at a time as before.
node/moves/routes.py registers both with the package's other routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

from aiohttp import web

from statestore.core.errors import (
    InvalidRequest,
    QueryDropping,
    StateStoreError,
    Unsupported,  # the peer predates these routes (404): copy one manifest at a time
)
from statestore.core.ids import StoreId, chunk_key
from statestore.core.items import ManifestItem, parse_manifest
from statestore.core.manifest import Manifest
from statestore.node.auth import allow
from statestore.node.daemon import NODE, Node
from statestore.node.request import read_body
from statestore.node.tombstones import (
    DROPPING,
    MAX_DROP_MARKS,
    DropMarks,
    check_pushed,
    copy_mark,
    pushed_marks,
)
from statestore.wire.bodies import (
    MAX_COPIES,
    MAX_COPIES_BYTES,
    ManifestCopiesAck,
    ManifestsRequest,
    decode_json,
)
from statestore.wire.manifest import decode_copies, decode_manifest, encode_copies

__all__ = ["Unsupported", "fetch_manifests", "push_manifests", "put_copies", "read_copies"]

log = logging.getLogger(__name__)
MSGPACK = {"Content-Type": "application/msgpack"}
# the manifests copied are named as repair names them (core/items.py)


# -- the receiving side ------------------------------------------------------------------


def _decoded(raws: Sequence[bytes | None]) -> list[Manifest]:
    out = []
    for i, raw in enumerate(raws):
        if raw is None:
            raise InvalidRequest(f"manifest copies: entry {i} is nil; send manifests only")
        m = decode_manifest(raw)
        for ref in m.chunks:
            chunk_key(m.store, m.version, ref.name)  # validates chunk names
        out.append(m)
    return out


async def put_copies(request: web.Request) -> web.Response:
    """``POST /v1/sync/manifests``: keep copies of the manifests in the body."""
    node = request.app[NODE]
    allow(request, "admin")
    raw = await read_body(request)  # within --max-body, as a single copy
    # decoding and checking up to MAX_COPIES manifests: off the loop, clients go on
    ms = await asyncio.to_thread(lambda: _decoded(decode_copies(raw, MAX_COPIES)))
    for query in sorted({m.store.query for m in ms}):
        allow(request, "write", query)
        allow(request, "admin", query)
    node.check_writable()
    # a hand-off (``?handoff=1``: from a node that does not own these, node/quotas.py) is
    # charged to the queries' quotas here; a copy between owners never is
    handoff = request.query.get("handoff") == "1"
    limits = {q: node.quota_limit(q) for q in {m.store.query for m in ms}} if handoff else {}
    # a query being dropped takes no copy (as PUT ...?copy=1 takes none): checked here, with
    # no await before the write is queued, so a purge queued later deletes what passed
    marks = pushed_marks(request)  # the sender's drops: a copy read before one is refused
    keep = [not node.store.below_floor(m) and _taken(request, m, marks) for m in ms]
    kept = [m for m, k in zip(ms, keep, strict=True) if k]
    # after clients' writes, as a single copy (node/writer.py); one atomic write for all, or
    # for a hand-off (charged) one per manifest, each refused alone past its query's quota
    if not kept:
        created: Iterator[bool | None] = iter([])
    elif any(limit is not None for limit in limits.values()):
        job = node.store.copy_manifests_charged
        created = iter(await node.write(job, kept, limits, order="copy"))
    else:
        created = iter(await node.write(node.store.copy_manifests, kept, order="copy"))
    stored = [next(created) if k else None for k in keep]
    return web.json_response({"stored": stored}, status=200)


def _taken(request: web.Request, m: Manifest, marks: dict[str, str] | None) -> bool:
    try:
        request.app[DROPPING].check(m.store.query)
        check_pushed(request.app[NODE], marks, m.store.query)
    except QueryDropping:
        return False
    return True


async def read_copies(request: web.Request) -> web.Response:
    """``POST /v1/sync/manifests/read``: the manifests asked for, as stored."""
    node = request.app[NODE]
    allow(request, "admin")
    node.check_copies_served()
    body = decode_json(
        await read_body(request),
        ManifestsRequest,
        "manifest copies",
        '{"manifests": [[store, version, kind, epoch], ...]}',
    )
    stores = [StoreId.parse(path) for path, _, _, _ in body.manifests]
    for query in sorted({s.query for s in stores}):
        allow(request, "read", query)
        allow(request, "admin", query)
    await node.foreground.wait()  # a hand-over's fetch yields to clients' requests

    def read() -> bytes:
        out: list[bytes | None] = []
        size = 0
        for store, (_, version, kind, epoch) in zip(stores, body.manifests, strict=True):
            raw = node.store.raw_manifest(store, version, kind, epoch)
            size += len(raw or b"")
            if out and size > MAX_COPIES_BYTES:
                break  # the rest is asked again
            out.append(raw)
        return encode_copies(out)

    return web.Response(body=await asyncio.to_thread(read), headers=MSGPACK)


# -- the sending side --------------------------------------------------------------------


async def push_manifests(
    node: Node, address: str, items: Sequence[str], *, handoff: bool = False
) -> list[int | None]:
    """Copy the manifests ``items`` we hold to ``address``, as many per request as the
    limits allow; per item, the bytes sent, or None when it did not land (or we lack it).
    ``handoff``: we do not own them, so ``address`` charges them to its quotas (one refused
    stays here). Raises Unsupported when ``address`` predates the route."""
    out: list[int | None] = [None] * len(items)
    batch: list[int] = []
    raws: list[bytes] = []
    size = 0
    marks = DropMarks(node)  # each query's drop, read before its first manifest is
    queries: set[str] = set()  # the batch's

    async def send() -> None:
        nonlocal batch, raws, size
        if batch:
            await _send(node, address, batch, raws, out, handoff, marks.headers(queries))
        batch, raws, size = [], [], 0
        queries.clear()

    for i, item in enumerate(items):
        it = parse_manifest(item)
        marks.read(it.store.query)
        raw = node.store.raw_manifest(it.store, it.version, it.kind, it.epoch)
        if raw is None:
            continue
        if batch and (
            len(batch) == MAX_COPIES
            or size + len(raw) > MAX_COPIES_BYTES - 1024
            or marks.dropped(queries | {it.store.query}) > MAX_DROP_MARKS
        ):
            await send()
        queries.add(it.store.query)
        batch.append(i)
        raws.append(raw)
        size += len(raw) + 8
    await send()
    return out


async def _send(
    node: Node,
    address: str,
    batch: list[int],
    raws: list[bytes],
    out: list[int | None],
    handoff: bool,
    drops: dict[str, str],
) -> None:
    try:
        resp = await node.transport.request(
            "POST",
            address,
            "/v1/sync/manifests?handoff=1" if handoff else "/v1/sync/manifests",
            body=encode_copies(raws),
            headers=MSGPACK | drops,
            ok=(200, 404),
        )
    except StateStoreError as exc:
        log.debug("push of %d manifests to %s failed: %s", len(batch), address, exc)
        return
    if resp.status == 404:
        raise Unsupported(address)
    try:
        ack = decode_json(resp.body, ManifestCopiesAck, "manifest copies answer")
    except StateStoreError as exc:
        log.warning("push of %d manifests to %s: %s", len(batch), address, exc)
        return
    if len(ack.stored) != len(batch):
        log.warning("%s answered %d manifest copies for %d", address, len(ack.stored), len(batch))
        return
    for i, raw, stored in zip(batch, raws, ack.stored, strict=True):
        if stored is not None:
            out[i] = len(raw)


async def fetch_manifests(node: Node, source: str, items: Sequence[str]) -> list[int | None]:
    """Copy the manifests ``items`` from ``source`` into our store; per item, the bytes
    copied, or None when it did not land (not held there, not answered, not written, or not a
    manifest's name); one below our retention floor counts as landed, as a single copy does.
    Raises Unsupported when ``source`` predates the route."""
    out: list[int | None] = [None] * len(items)
    named: list[tuple[int, ManifestItem]] = []
    for i, item in enumerate(items):
        try:  # names from a source's listing
            named.append((i, parse_manifest(item)))
        except StateStoreError:
            log.warning("%s listed %r, not a manifest's name", source, item[:200])
    start = 0
    while start < len(named):
        part = named[start : start + MAX_COPIES]
        marks: dict[str, bytes | None] = {}  # what a drop meanwhile would change
        for _, (s, *_) in part:
            if s.query not in marks:
                try:
                    marks[s.query] = copy_mark(node, s.query)
                except QueryDropping:
                    marks[s.query] = DROPPING_NOW
        try:
            resp = await node.transport.request(
                "POST",
                source,
                "/v1/sync/manifests/read",
                json_body={"manifests": [[s.path, v, k, e] for _, (s, v, k, e) in part]},
                ok=(200, 404),
            )
        except StateStoreError as exc:
            log.debug("fetch of %d manifests from %s failed: %s", len(part), source, exc)
            return out
        if resp.status == 404:
            raise Unsupported(source)
        asked = [items[i] for i, _ in part]
        got = await asyncio.to_thread(_landing, node, source, asked, resp.body)
        if not got:
            return out  # nothing answered: the round tries again
        kept = [m for _, m in got if m is not None]
        try:
            if kept:
                await node.write(node.store.copy_pulled, kept, marks, order="copy")
        except StateStoreError as exc:  # a full disk: none of these landed
            log.warning("keeping %d manifests from %s failed: %s", len(kept), source, exc)
            return out
        for (i, (s, *_)), (n, _) in zip(part, got, strict=False):
            if marks[s.query] != DROPPING_NOW:  # being dropped: not landed, asked again
                out[i] = n
        start += len(got)
    return out


# a mark no tombstone equals: the manifests of a query being dropped are not written
DROPPING_NOW = b"\0dropping"


def _landing(
    node: Node, source: str, items: Sequence[str], body: bytes
) -> list[tuple[int | None, Manifest | None]]:
    """Per answered item: (its bytes, the manifest to keep); (None, None) when the source did
    not hold it, (bytes, None) when it is below our floor (nothing to keep). Raises nothing:
    an answer that does not decode, or names another manifest, counts as not answered."""
    try:
        raws = decode_copies(body, MAX_COPIES)
        out: list[tuple[int | None, Manifest | None]] = []
        for item, raw in zip(items, raws, strict=False):
            if raw is None:
                out.append((None, None))
                continue
            m = decode_manifest(raw)
            if (got := ManifestItem.of(m).name()) != item:
                raise InvalidRequest(f"answered {item} with {got}")
            keep = not node.store.below_floor(m)
            out.append((len(raw), m if keep else None))
        return out
    except StateStoreError as exc:
        log.warning("manifest copies from %s unusable: %s", source, exc)
        return []
