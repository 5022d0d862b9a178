"""The node's HTTP API under ``/v1/`` (docs/api.md is its written form).

Handlers validate names first, hand the decision to the core and storage, and map every
error of the tree onto ``{"error": {"code", "message"}}`` with its status: no stack trace ever
reaches a caller. Every response carries the ring epoch in ``X-Statestore-Epoch``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from itertools import accumulate
from typing import Any, TypeVar

import msgpack
from aiohttp import web

from statestore.core.cache import ROW_COST
from statestore.core.errors import (
    DelayBoundExceeded,
    InvalidRequest,
    MalformedData,
    NodeUnavailable,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SlowRequest,
    StateStoreError,
    StoreNotFound,
    VersionNotFound,
)
from statestore.core.identity import ANSWER_HEADER, NODE_HEADER
from statestore.core.ids import (
    MAX_EPOCH,
    MAX_VERSION,
    StoreId,
    check_version,
    chunk_key,
    parse_chunk_key,
    parse_uint,
)
from statestore.core.manifest import Manifest, local_chain
from statestore.core.quorum import check_consistency
from statestore.core.repair import content_digest
from statestore.core.retention import MAX_RETAIN, Thinning
from statestore.net.restorer import HOLD
from statestore.node.auth import PRINCIPAL, allow, enforce, principal
from statestore.node.budget import COMMIT_FACTOR, LEASE, FoldLease, budget_middleware
from statestore.node.coordinator import (
    POSITIONS_HEADER,
    STATS_HEADER,
    TENTATIVE_HEADER,
    VERSION_HEADER,
    WRITER_EPOCH_HEADER,
    check_tentative,
    coordinate_commit,
    coordinate_restore,
    coordinate_restore_within,
)
from statestore.node.daemon import NODE, Node
from statestore.node.operations import install as install_operations
from statestore.node.policy import policy_of
from statestore.node.quotas import charged_limit
from statestore.node.relay import relay_handler
from statestore.node.repair import check_floor, check_thinning, raise_floor
from statestore.node.request import (
    MIN_RATE,
    PacedAnswer,
    addressed_to,
    prove_answer,
    read_body,
    read_signed_body,
    store_of,
)
from statestore.node.tombstones import DROPPING, check_pushed, pushed_marks
from statestore.wire.bodies import (
    ChainsRequest,
    GcRequest,
    GossipDigest,
    HaveRequest,
    KeysRequest,
    StoresRequest,
    decode_json,
    decode_positions,
)
from statestore.wire.frames import encode_frame
from statestore.wire.head import to_json as head_json
from statestore.wire.headers import EPOCH_HEADER, FRAMES_CONTENT_TYPE
from statestore.wire.manifest import decode_manifest, encode_manifest, join_chain
from statestore.wire.rows import decode_rows, encode_puts

__all__ = ["NODE", "build_app"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    node = request.app[NODE]
    try:
        resp = await handler(request)
    except StateStoreError as exc:
        resp = _error(exc.status, exc.code, str(exc))
        if isinstance(exc, RateLimited):
            resp.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    except web.HTTPRequestEntityTooLarge as exc:
        resp = _error(
            413,
            PayloadTooLarge.code,
            f"request body is larger than this node's limit ({exc.text}); "
            "send smaller chunks or start the node with a larger --max-body",
        )
    except (UnicodeError, RecursionError) as exc:  # undecodable input is the caller's fault
        resp = _error(400, MalformedData.code, f"request does not decode ({exc})")
    except web.HTTPException as exc:
        if exc.status >= 400:
            resp = _error(
                exc.status, "http_error", f"{exc.reason}: {request.method} {request.path}"
            )
        else:
            raise
    except Exception as exc:  # the boundary: log it, answer in our words
        log.exception("unhandled error on %s %s", request.method, request.path)
        resp = _error(500, "internal", f"node error: {type(exc).__name__}: {exc}")
    resp.headers[EPOCH_HEADER] = str(node.epoch)
    if resp.status >= 400 and ANSWER_HEADER not in resp.headers:
        # a refusal is proven too (a peer believes "not found" or "stale epoch" only so)
        resp = prove_answer(request, principal(request), resp)
    return resp


# the paths of clients' reads and writes (a copy between nodes says ``?copy=1``)
FOREGROUND_PATHS = ("/v1/chunks", "/v1/manifests/", "/v1/stores/", "/v1/heads", "/v1/relay")


@web.middleware
async def foreground_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count clients' reads and writes in flight (node/foreground.py): copies yield to them."""
    if not request.path.startswith(FOREGROUND_PATHS) or request.query.get("copy") == "1":
        return await handler(request)
    gate = request.app[NODE].foreground
    gate.begin()
    try:
        return await handler(request)
    finally:
        gate.end()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate every request but the open routes, and check what its route needs (the
    one table: node/policy.py); handlers authorize the queries a body names. A node that
    another process replaced (``--replace``) serves nothing but health and metrics."""
    policy = policy_of(request)
    if policy is None or policy.kind != "open":
        node = request.app[NODE]
        replaced = node.membership.superseded if node.membership is not None else None
        if replaced is not None and request.path != "/metrics":
            raise NodeUnavailable(
                f"node {node.id} was replaced by the node at {replaced[0]} (statestore node "
                "--replace): this process serves nothing; stop it"
            )
        removed = node.removed_reason()  # statestore removenode wrote it off: the same
        if removed is not None and request.path != "/metrics":
            raise NodeUnavailable(removed)
        # credentials from the headers alone: no body is read for a caller without them
        who = request[PRINCIPAL] = node.access.authenticate(request, addressed_to(node))
        await read_signed_body(request, who)  # a node's: the body its signature declared
        enforce(request, policy)
        declared = request.content_length or 0
        node.access.admit(who, declared)  # RateLimited over its rates or in flight
        try:
            resp = await handler(request)
            # the answer, and what a body without a Content-Length (chunked) turned out to hold
            extra = max(0, request.content.total_bytes - declared)
            node.access.charge(who, (resp.content_length or resp.body_length) + extra)
        finally:
            node.access.done(who)
        return prove_answer(request, who, resp)  # signed for a node that asked (identity)
    return await handler(request)


def _version(text: str | None) -> int:
    return check_version(parse_uint(text, "version", MAX_VERSION))


# -- node and ring ----------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE].health())


async def live(request: web.Request) -> web.Response:
    """``GET /v1/health/live``: 200 whenever the process answers (its event loop runs: a
    blocked loop or a dead process does not answer at all, and the probe times out)."""
    node = request.app[NODE]
    return web.json_response({"status": "live", "id": node.id})


async def ready(request: web.Request) -> web.Response:
    """``GET /v1/health/ready``: 200 when the node is a normal member of the ring, serving
    and not degraded; 503 with the reasons otherwise (docs/operations.md, Probes)."""
    node = request.app[NODE]
    reasons = node.unready()
    body = {
        "status": "not_ready" if reasons else "ready",
        "reasons": reasons,
        "id": node.id,
        "state": node.membership.state.value if node.membership is not None else "starting",
    }
    return web.json_response(body, status=503 if reasons else 200)


async def ring(request: web.Request) -> web.Response:
    node = request.app[NODE]
    view = node.view()
    shares = view.ring.shares()
    body = view.to_json()
    for m in body["members"]:
        m["share"] = round(shares.get(m["id"], 0.0), 4)
    body["self"] = node.id
    if node.move is not None:
        body["move"] = node.move.to_json(node.clock())
    if node.membership is not None and node.membership.removals():
        # dead members written off (statestore removenode): removed ones are no members
        body["removals"] = {
            m.id: {"mark": m.removal, "by": m.removed_by, "address": m.address}
            for m in node.membership.removals()
        }
    return web.json_response(body)


async def gossip(request: web.Request) -> web.Response:
    """Merge a peer's table; entries that fail the sanity checks (core/membership) are
    skipped and named in a 400, the others merged."""
    node = request.app[NODE]
    allow(request, "admin")
    assert node.membership is not None
    digest = decode_json(await read_body(request), GossipDigest, "gossip")
    node.membership.merge(digest.to_dict(), node.clock())
    if node.membership.refused:
        raise InvalidRequest("gossip entries refused: " + "; ".join(node.membership.refused[:10]))
    return web.json_response(node.membership.digest())


# -- chunks -----------------------------------------------------------------------------
async def put_chunk(request: web.Request) -> web.Response:
    node = request.app[NODE]
    key = request.match_info["key"]
    query = parse_chunk_key(key)[0].query
    allow(request, "write", query)
    node.check_writable()
    # a replica's or a hand-over's copy (?copy=1) waits for client writes (node/writer.py)
    copy = request.query.get("copy") == "1"
    marks = pushed_marks(request)  # a node's push: the drops it was read under
    check_pushed(node, marks, query)  # before the body too: a refused push is not read
    data = await read_body(request)
    if len(data) > node.config.max_chunk:
        raise PayloadTooLarge(f"chunk {key} is {len(data)} bytes, over --max-chunk")
    limit = charged_limit(request, query)
    # not while its query is being dropped: checked again here, with no await before the
    # write is queued (the middleware's check ran before the body was read: a client's slow
    # body started before a drop's purge was written after it)
    request.app[DROPPING].check(query)
    if copy or marks is not None or request.query.get("compaction") == "1":
        # a node's copy, snapshot or hint: nor one read before its drop (node/tombstones.py)
        check_pushed(node, marks, query)
    # a copy below the store's floor here is answered as landed and not kept
    await node.write(
        node.store.put_chunk, key, data, limit, copy, order="copy" if copy else "foreground"
    )
    return web.json_response({"stored": key}, status=201)


async def get_chunk(request: web.Request) -> web.Response:
    node = request.app[NODE]
    key = request.match_info["key"]
    allow(request, "read", parse_chunk_key(key)[0].query)
    if request.query.get("copy") == "1":  # a hand-over's fetch yields to clients' requests
        node.check_copies_served()
        await node.foreground.wait()
    if node.config.inject_delay:
        await asyncio.sleep(node.config.inject_delay)
    span = _byte_range(request)  # checked before any byte is read
    if span is not None:
        offset, length = span
        part = node.store.get_chunk_part(key, offset, length)
        if part is None:
            raise NotFound(f"chunk {key} is not on this node; try another replica")
        if offset + length > part[1]:
            raise InvalidRequest(
                f"chunk {key} is {part[1]} bytes: bytes {offset}..{offset + length - 1} "
                "are past its end"
            )
        return web.Response(body=part[0], content_type="application/octet-stream")
    data = node.store.get_chunk(key)
    if data is None:
        raise NotFound(f"chunk {key} is not on this node; try another replica")
    return web.Response(body=data, content_type="application/octet-stream")


def _byte_range(request: web.Request) -> tuple[int, int] | None:
    """``?offset=N&length=M``: the part of a chunk a reader of one block wants (a blocked
    chunk's index or one block, core/chunk.py), or None for the whole chunk. Only the part is
    read from storage; its reader verifies it (NodeStore.get_chunk_part)."""
    offset, length = request.query.get("offset"), request.query.get("length")
    if offset is None and length is None:
        return None
    numbers = []
    for name, text in (("offset", offset), ("length", length)):
        if text is None or not (text.isascii() and text.isdigit() and len(text) <= 12):
            raise InvalidRequest(
                f"a part of a chunk is ?offset=N&length=M (both, decimal): {name} is {text!r:.40}"
            )
        numbers.append(int(text))
    if numbers[1] < 1:
        raise InvalidRequest("a part of a chunk is at least 1 byte long")
    return numbers[0], numbers[1]


STATE_WRITE_BYTES = 1 << 20  # bytes of rows per write of a streamed state


async def read_chunks(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chunks``: many chunks in one stream of ``C`` frames (frames.py), for a
    restorer that wants everything one source holds for it (restore_many). A chunk that is
    missing here or fails its checksum is left out; the caller fetches it elsewhere."""
    node = request.app[NODE]
    raw = await read_body(request)
    keys = decode_json(raw, KeysRequest, "chunk batch", '{"keys": [chunk key, ...]}').keys
    keys = list(dict.fromkeys(keys))  # each once: a key named many times is not read as often
    for query in {parse_chunk_key(key)[0].query for key in keys}:  # names a malformed key
        allow(request, "read", query)
    if node.config.inject_delay:
        await asyncio.sleep(node.config.inject_delay)
    resp = web.StreamResponse(headers={"Content-Type": FRAMES_CONTENT_TYPE})
    await resp.prepare(request)
    for key in keys:
        try:
            data = node.store.get_chunk(key)
        except StateStoreError as exc:
            log.warning("chunk batch: %s unusable: %s", key, exc)
            continue
        if data is not None:
            await resp.write(encode_frame(b"C", {"k": key}, data))
    await resp.write_eof()
    return resp


async def have(request: web.Request) -> web.Response:
    """Anti-entropy: which of these items this node holds. A node asking itself (through an
    alias of its own address) is refused, so that repair never counts itself as a replica."""
    node = request.app[NODE]
    allow(request, "admin")
    if request.headers.get(NODE_HEADER) == node.id:
        raise InvalidRequest(
            f"node {node.id} asked itself (at {request.host}) whether it holds its own items: "
            "an alias of this node's address is in the ring view"
        )
    body = decode_json(await read_body(request), HaveRequest, "have")
    # a batch is up to MAX_HAVE_ITEMS lookups: read in a worker thread, clients go on
    answer, adopt = await asyncio.to_thread(_have, node, body)
    dropping = request.app[DROPPING]
    adopt = {s: n for s, n in adopt.items() if s.query not in dropping.queries}
    if adopt:  # seldom: a replica that missed its writer's commits
        try:
            await node.write(
                node.store.adopt_retains, adopt, node.config.retain_versions, order="copy"
            )
        except StateStoreError as exc:  # the answer stands; the next question offers it
            log.warning("sync/have: the asker's retains not taken: %s", exc)
    return web.json_response(answer)


def _have(node: Node, body: HaveRequest) -> tuple[dict[str, Any], dict[StoreId, int]]:
    """The answer, and the asker's writer-set retains this node would take (of the stores
    the batch names: NodeStore.retains_to_adopt)."""
    chunks, manifests = body.chunks, body.manifests
    out_m = []
    floors: dict[str, int] = {}
    for path, version, kind in manifests:
        store = StoreId.parse(path)
        floors[store.path] = node.store.floor(store)
        v = _version(version) if isinstance(version, str) else version
        out_m.append(node.store.raw_manifest(store, v, kind) is not None)
    out_e = []
    differ = []  # held at that epoch with other content than the asker's (core/repair.py)
    for i, (path, v, kind, epoch) in enumerate(body.epochs):
        store = StoreId.parse(path)
        floors[store.path] = node.store.floor(store)
        raw = node.store.raw_manifest(store, v, kind, epoch)
        out_e.append(raw is not None)
        theirs = body.digests[i] if i < len(body.digests) else 0
        if raw is None or not theirs:
            differ.append(False)
            continue
        held = decode_manifest(raw)
        differ.append(content_digest(held.kind, [c.checksum for c in held.chunks]) != theirs)
    for key in chunks:
        store, _, _ = parse_chunk_key(key)
        if store.path not in floors:
            floors[store.path] = node.store.floor(store)
    thins = {p: node.store.thinning(StoreId.parse(p)) for p in floors}
    return {
        "id": node.id,
        "chunks": node.store.has_chunks(chunks),
        "manifests": out_m,
        "epochs": out_e,
        "differ": differ,
        "floors": {k: v for k, v in floors.items() if v},
        "thinning": {p: [t.below, t.every, t.chunks, t.floor] for p, t in thins.items() if t.every},
        "retains": {p: n for p in floors if (n := node.store.retain(StoreId.parse(p), None))},
    }, node.store.retains_to_adopt(
        {StoreId.parse(p): n for p, n in body.retains.items() if p in floors},
        node.config.retain_versions,
    )


# -- manifests and stores ---------------------------------------------------------------
async def put_manifest(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "write", store.query)
    node.check_writable()
    version = _version(request.match_info["version"])
    kind = request.match_info["kind"]
    m = decode_manifest(await read_body(request))
    if (m.store, m.version, m.kind) != (store, version, kind):
        raise InvalidRequest(
            f"manifest is for {m.store} v{m.version} {m.kind}, but was sent to "
            f"{store} v{version} {kind}"
        )
    if version < node.store.floor(store):
        raise InvalidRequest(f"{store} version {version} is below retention; commit a newer one")
    for ref in m.chunks:
        chunk_key(store, version, ref.name)  # validates chunk names
    retain = _retain(request)
    if request.query.get("copy") == "1":
        # repair's copy of a manifest another replica holds, at whatever epoch: not a
        # writer's commit, so not fenced (node/replica.py copy_manifest); ring nodes only;
        # charged to the quota only as a hand-off (?handoff=1, node/quotas.py)
        limit = charged_limit(request, store.query)
        # a query being dropped takes no copy: checked again here, with no await before the
        # write is queued (the middleware's check ran before the body was read)
        request.app[DROPPING].check(store.query)
        check_pushed(node, pushed_marks(request), store.query)  # not read before a drop
        # after client writes, as a chunk's copy (node/writer.py)
        created = await node.write(node.store.copy_manifest, m, limit, order="copy")
        return web.json_response({"stored": created}, status=201 if created else 200)
    # a compactor's snapshot (node-only: node/policy.py) is fenced by the head's lineage
    folded = request.query.get("compaction") == "1"
    marks = pushed_marks(request)  # a node's snapshot or hint: the drops it was read under
    request.app[DROPPING].check(store.query)  # as a chunk's: again, after the body
    if folded or marks is not None:  # as a copy: nor read before a drop
        check_pushed(node, marks, store.query)
    created = await node.write(
        node.store.put_manifest, m, charged_limit(request, store.query), folded
    )
    if retain is not None:
        request.app[DROPPING].check(store.query)  # again: the manifest's write was awaited
        await node.write(node.store.set_retain, store, retain)
    return web.json_response({"stored": created}, status=201 if created else 200)


def _retain(request: web.Request) -> int | None:
    """The optional ``retain`` query parameter: versions of the store to keep (1..10^6)."""
    text = request.query.get("retain")
    if text is None:
        return None
    retain = parse_uint(text, "retain", MAX_RETAIN)
    if retain < 1:
        raise InvalidRequest("retain must be at least 1 (versions of the store to keep)")
    return retain


async def get_manifest(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "read", store.query)
    if request.query.get("copy") == "1":  # a hand-over's pull
        node.check_copies_served()
    version = _version(request.match_info["version"])
    text = request.query.get("epoch")
    epoch = parse_uint(text, "epoch", MAX_EPOCH) if text is not None else None
    raw = node.store.raw_manifest(store, version, request.match_info["kind"], epoch)
    if raw is None:
        raise VersionNotFound(f"{store} version {version} has no manifest on this node")
    return web.Response(body=raw, content_type="application/msgpack")


async def head(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "read", store.query)
    h = node.store.head(store)
    if h is None:
        raise StoreNotFound(f"store {store} has no version on this node")
    return web.json_response(head_json(h))


async def versions(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "read", store.query)
    if node.store.head(store) is None:
        raise StoreNotFound(f"store {store} has no version on this node")
    floor = node.store.floor(store)
    vs = [v for v in node.store.versions(store) if v >= floor]
    out: dict[str, object] = {"versions": vs, "floor": floor}
    retain = node.store.retain(store, if_rotted=None)
    if retain is not None:  # its writer's retain=N (a backup carries it; not a rotted one)
        out["retain"] = retain
    return web.json_response(out)


async def chain(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "read", store.query)
    version = _version(request.query.get("version"))
    if node.store.head(store) is None:
        raise StoreNotFound(f"store {store} has no version on this node")
    # a scan of the store's manifests: in a worker thread (a store keeping many versions)
    parts = (await asyncio.to_thread(_chains_of, node, store, [version]))[version]
    if parts is None:  # dropped since the check above
        raise StoreNotFound(f"store {store} has no version on this node")
    await request[LEASE].take(2 * sum(map(len, parts)), "a chain's answer")
    return web.Response(body=join_chain(parts), content_type="application/msgpack")


def _chains_of(
    node: Node, store: StoreId, versions: Sequence[int]
) -> dict[int, list[bytes] | None]:
    """The chains of ``versions`` of ``store``, each as its manifests encoded (each manifest
    once, whatever the chains naming it: what an answer takes is known before it is built,
    wire/manifest.join_chain), from one scan of its manifests (None for each where this
    node holds no version of it)."""
    if node.store.head(store) is None:
        return dict.fromkeys(versions)
    deltas, snaps = node.store.manifests(store)
    encoded: dict[int, bytes] = {}

    def parts(chain: list[Manifest]) -> list[bytes]:
        for m in chain:
            if id(m) not in encoded:
                encoded[id(m)] = encode_manifest(m)
        return [encoded[id(m)] for m in chain]

    return {v: parts(local_chain(deltas, snaps, v)) for v in versions}


HEADS_SHAPE = '{"stores": ["QUERY/OPERATOR/PARTITION/NAME", ...]}'
CHAINS_SHAPE = (
    '{"stores": [[QUERY/OPERATOR/PARTITION/NAME, version], ...]}, a version being a '
    "positive integer"
)


async def _store_list(request: web.Request, what: str, type_: type[Any], shape: str) -> Any:
    return decode_json(await read_body(request), type_, what, shape)


async def heads(request: web.Request) -> web.Response:
    """``POST /v1/heads``: the heads of many stores in one answer (null where this node
    holds no version of the store)."""
    node = request.app[NODE]
    out: list[dict[str, int] | None] = []
    stores = [
        StoreId.parse(p)
        for p in (await _store_list(request, "heads", StoresRequest, HEADS_SHAPE)).stores
    ]
    for query in {s.query for s in stores}:
        allow(request, "read", query)
    for store in stores:
        h = node.store.head(store)
        out.append(None if h is None else head_json(h))
    return web.json_response({"heads": out})


async def chains(request: web.Request) -> web.Response:
    """``POST /v1/chains``: the chains of many (store, version) pairs in one msgpack answer,
    each as ``GET .../chain`` encodes it (nil where this node holds no version of the store)."""
    node = request.app[NODE]
    out: list[bytes | None] = []
    items = [
        (StoreId.parse(p), v)
        for p, v in (await _store_list(request, "chains", ChainsRequest, CHAINS_SHAPE)).stores
    ]
    for query in {s.query for s, _ in items}:
        allow(request, "read", query)
    named = Counter(items)
    wanted: dict[StoreId, set[int]] = {}
    for store, version in named:
        wanted.setdefault(store, set()).add(version)
    got: dict[tuple[StoreId, int], list[bytes] | None] = {}
    for store, versions in wanted.items():
        # each store's manifests scanned once however often it is named, in a worker thread;
        # the answer (a chain as often as it is named) held to the node's --memory-budget
        # before it is built
        chains = await asyncio.to_thread(_chains_of, node, store, sorted(versions))
        size = sum(sum(map(len, p or ())) * named[store, v] for v, p in chains.items())
        await request[LEASE].take(2 * size, "a chains answer")  # the chains, then packed
        got.update(((store, v), p) for v, p in chains.items())
    built = {item: None if p is None else join_chain(p) for item, p in got.items()}
    out = [built[item] for item in items]
    body: bytes = msgpack.packb(out, use_bin_type=True)
    return web.Response(body=body, content_type="application/msgpack")


async def gc(request: web.Request) -> web.Response:
    """A retention floor and/or a thinning line (from the store's compactor). A floor is a
    version, never above the store's head, and where this node holds the store's manifests
    a version it holds a snapshot of (so that every version at or above it stays
    restorable). A thinning line is taken, where this node owns the store's manifests, up
    to the newest snapshot held here (node/repair.check_thinning). Both are checked
    before either is applied."""
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "admin", store.query)
    body = decode_json(await read_body(request), GcRequest, "gc")
    if (body.thin_below is None) != (body.thin_every is None):
        raise InvalidRequest("gc: thin_below and thin_every go together")
    if body.thin_below is None and (body.thin_chunks or body.thin_floor):
        raise InvalidRequest("gc: thin_chunks and thin_floor come with a line (thin_below)")
    if body.thin_below is not None and body.thin_chunks > body.thin_below:
        raise InvalidRequest("gc: thin_chunks is at most thin_below")
    if body.floor is None and body.thin_below is None:
        raise InvalidRequest("gc: give a floor, a thinning line (thin_below, thin_every), or both")
    if body.floor is not None:
        await check_floor(node, store, body.floor)  # the checks a floor from sync/have takes
    thin = None
    if body.thin_below is not None and body.thin_every is not None:
        thin = await check_thinning(
            node,
            store,
            Thinning(body.thin_below, body.thin_every, body.thin_chunks, body.thin_floor),
        )
    dropped = 0
    if body.floor is not None:
        dropped += await raise_floor(node, store, body.floor)  # checked again there
    if thin is not None:
        dropped += await node.write(node.store.apply_thinning, store, thin)
    node.stats["gc"] += dropped
    t = node.store.thinning(store)
    return web.json_response(
        {
            "dropped": dropped,
            "floor": node.store.floor(store),
            "thinning": {
                "below": t.below,
                "every": t.every,
                "chunks": t.chunks,
                "floor": t.floor,
            },
        }
    )


async def list_stores(request: web.Request) -> web.Response:
    """The stores this node holds manifests of (a token sees those of its queries)."""
    node = request.app[NODE]
    grant = principal(request).grant
    stores = [s for s in node.store.stores() if grant is None or grant.covers(s.query)]
    return web.json_response({"stores": [s.path for s in stores]})


# -- coordinator endpoints (the node writes and reads the ring for the caller) -----------
async def commit(request: web.Request) -> web.Response:
    """Commit framed rows as a version: the node chunks them and writes at W for the caller."""
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "write", store.query)
    version = _version(request.query.get("version"))
    epoch = parse_uint(request.query.get("epoch", "0"), "epoch", MAX_EPOCH)
    text = request.query.get("base_epoch")  # the restored version - 1's (core/manifest.py)
    base_epoch = parse_uint(text, "base_epoch", MAX_EPOCH) if text is not None else None
    snapshot = request.query.get("snapshot", "0") in ("1", "true")
    retain = _retain(request)
    positions = decode_positions(request.headers.get(POSITIONS_HEADER, "{}"), POSITIONS_HEADER)
    consistency, delay_bound = _consistency(request)
    allow_tentative = request.query.get("allow_tentative", "0") in ("1", "true")
    check_tentative(allow_tentative, delay_bound)
    body = bytearray()
    limit, most = node.config.body_timeout, node.config.max_commit
    declared, lease = request.content_length, request[LEASE]
    if declared is not None and declared > most:
        raise PayloadTooLarge(
            f"commit body is {declared} bytes, over {most}: commit smaller deltas or raise "
            "the node's --max-commit"
        )
    if declared:  # the whole commit's memory at once (node/budget.py), before any read
        await lease.take(COMMIT_FACTOR * declared, "a commit")
    # a piece at least every body timeout, and the whole body at MIN_RATE: a body
    # trickled in just inside the timeout would hold its share of the budget for ever
    loop = asyncio.get_running_loop()
    whole = limit + (declared or most) / MIN_RATE
    deadline = loop.time() + whole
    while True:
        try:
            async with asyncio.timeout_at(min(deadline, loop.time() + limit)):
                piece = await request.content.read(1 << 20)
        except TimeoutError as exc:
            if loop.time() >= deadline:
                raise SlowRequest(
                    f"commit body did not arrive within {whole:.0f}s (the body timeout and "
                    f"{MIN_RATE >> 10} KiB/s): send it faster"
                ) from exc
            raise SlowRequest(f"commit body stalled for {limit:.0f}s: send it faster") from exc
        if not piece:
            break
        body += piece
        if len(body) > most:
            raise PayloadTooLarge(
                f"commit body is over {most} bytes: commit smaller deltas or raise the "
                "node's --max-commit"
            )
        if declared is None:  # chunked: its memory as it arrives
            await lease.take(COMMIT_FACTOR * len(piece), "a commit")
    puts, deletes = await asyncio.to_thread(decode_rows, bytes(body))  # the loop stays free
    size = len(body)
    body.clear()  # the rows hold the bytes now
    # rows held as Python objects cost ~100 bytes each beyond their bytes: the 3x of the
    # body covers that for rows of ~100 bytes and more (the body, the rows, the chunks), not
    # for smaller ones (a body of 11-byte records decodes to 8x its size): what the rows
    # hold past twice the body is taken now, for the chunking and the writes, or refused
    extra = ROW_COST * (len(puts) + len(deletes)) - size
    if extra > 0:
        await lease.take(extra, "a commit's small rows", patient=False)
    result = await coordinate_commit(
        node,
        store,
        version,
        epoch,
        puts,
        deletes,
        positions,
        snapshot,
        retain,
        base_epoch,
        consistency,
        delay_bound,
        allow_tentative,
    )
    return web.json_response(result, status=201)


def _consistency(request: web.Request) -> tuple[str, float | None]:
    """``?consistency=one|quorum|all`` (default quorum) and ``?delay_bound=SECONDS``."""
    consistency = check_consistency(request.query.get("consistency", "quorum"))
    text = request.query.get("delay_bound")
    if text is None:
        return consistency, None
    try:
        bound = float(text)
    except ValueError:
        bound = -1.0
    if not 0 < bound <= 3600:
        raise InvalidRequest(f"delay_bound must be seconds in (0, 3600], got {text!r}")
    return consistency, bound


async def _bounded(call: Awaitable[T], bound: float | None, what: str) -> T:
    if bound is None:
        return await call
    try:
        return await asyncio.wait_for(call, bound)
    except TimeoutError:
        raise DelayBoundExceeded(
            f"{what} did not finish within its delay bound of {bound:g} s"
        ) from None


async def state(request: web.Request) -> web.StreamResponse:
    """Restore a version and stream it as framed rows (puts only)."""
    node = request.app[NODE]
    store = store_of(request)
    allow(request, "read", store.query)
    text = request.query.get("version")
    plan = request.query.get("plan", "auto")
    consistency, delay_bound = _consistency(request)
    version = _version(text) if text is not None else None
    tentative = False
    # the state folded here is held until it is sent: reserved from the memory budget
    # before a chunk is read (net/restorer.HOLD; one larger than the budget runs alone)
    held = HOLD.set(FoldLease(request[LEASE]))
    try:
        if delay_bound is None or version is not None:
            data, top, stats = await _bounded(
                coordinate_restore(node, store, version, plan, consistency),
                delay_bound,
                f"restore of {store}",
            )
        else:  # the latest within a bound: the best version reachable, tentative (client.md)
            data, top, stats, tentative = await coordinate_restore_within(
                node, store, plan, consistency, delay_bound
            )
    finally:
        HOLD.reset(held)
    resp = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            VERSION_HEADER: str(top.version),
            WRITER_EPOCH_HEADER: str(top.epoch),
            POSITIONS_HEADER: json.dumps(dict(top.positions)),
            STATS_HEADER: json.dumps(stats),
            TENTATIVE_HEADER: "true" if tentative else "false",
            EPOCH_HEADER: str(node.epoch),
        }
    )
    await resp.prepare(request)
    # the state is held until it is read: a reader that stops reading is cut (PacedAnswer)
    answer = PacedAnswer(request, resp, node.config.body_timeout)
    keys, values = list(data), list(data.values())
    # writes of about 1 MiB, cut by bytes (a few large values must not make one huge write)
    ends = list(accumulate(map(int.__add__, map(len, keys), map(len, values))))
    start = 0
    while start < len(keys):
        base = ends[start - 1] if start else 0
        stop = max(start + 1, bisect_right(ends, base + STATE_WRITE_BYTES, start))
        if not await answer.write(encode_puts(keys[start:stop], values[start:stop])):
            return resp
        start = stop
    await answer.end()
    return resp


def build_app(node: Node) -> web.Application:
    app = web.Application(
        client_max_size=node.config.max_body,
        middlewares=[
            errors_middleware,
            # authenticated first (from headers alone): a caller without credentials takes
            # nothing of the budget, so it cannot make others wait (node/budget.py)
            auth_middleware,
            budget_middleware(lambda request: request.app[NODE].budget),
            foreground_middleware,
        ],
    )
    app[NODE] = node
    s = "/v1/stores/{query}/{operator}/{partition}/{name}"
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/health/live", live)
    app.router.add_get("/v1/health/ready", ready)
    app.router.add_get("/v1/ring", ring)
    app.router.add_post("/v1/gossip", gossip)
    app.router.add_post("/v1/sync/have", have)
    app.router.add_put("/v1/chunks/{key:.+}", put_chunk)
    app.router.add_get("/v1/chunks/{key:.+}", get_chunk)
    app.router.add_post("/v1/chunks", read_chunks)
    app.router.add_put(
        "/v1/manifests/{query}/{operator}/{partition}/{name}/{version}/{kind}", put_manifest
    )
    app.router.add_get(
        "/v1/manifests/{query}/{operator}/{partition}/{name}/{version}/{kind}", get_manifest
    )
    app.router.add_get("/v1/stores", list_stores)
    app.router.add_post("/v1/heads", heads)
    app.router.add_post("/v1/chains", chains)
    app.router.add_get(s + "/head", head)
    app.router.add_get(s + "/versions", versions)
    app.router.add_get(s + "/chain", chain)
    app.router.add_post(s + "/gc", gc)
    app.router.add_post(s + "/commit", commit)
    app.router.add_get(s + "/state", state)
    app.router.add_post("/v1/relay", relay_handler)
    install_operations(app)  # /metrics, /dashboard, inventory, drop (node/operations.py)
    return app
