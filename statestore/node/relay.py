"""Executing a line or tree hop on a node: ``POST /v1/relay`` (docs/design.md, Recovery plans).

A hop receives its part of the plan, opens streams from its children (each gets its own
sub-plan), and answers with one stream of frames (frames.py):

- **line** (no folding): frames flow through as they arrive, interleaved with this hop's own
  chunks read from local storage; the restorer sees its first bytes while the far end of the
  line is still reading.
- **tree** (folding): the hop decodes its own chunks and its children's frames and keeps, per
  key, the row of the latest chain position; it then sends the folded rows up in frames of
  about 4 MiB, and a ``D`` frame listing every chunk folded in.

A child that fails mid-stream becomes an ``E`` frame and the hop carries on: the restorer
fetches whatever is missing from other replicas instead of starting over. A local chunk that
is missing or corrupt is skipped the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from statestore.core.chunk import MAX_CHUNK_ROWS, decode_chunk, key_group, verify
from statestore.core.errors import InvalidRequest, MalformedData, PayloadTooLarge, StateStoreError
from statestore.core.fold import TREE_ROW_HELD, Positioned, fold_held, merge_positioned
from statestore.core.ids import StoreId, parse_chunk_key
from statestore.core.plan import ChunkTask, Hop
from statestore.net.streams import read_frames
from statestore.node.auth import allow, principal
from statestore.node.budget import LEASE
from statestore.node.daemon import NODE, Node
from statestore.node.request import PacedAnswer, while_requester_stays
from statestore.wire.frames import (
    MAX_PLAN_BYTES,
    decode_folded,
    decode_hop,
    encode_folded,
    encode_frame,
    encode_hop,
    hop_store,
)
from statestore.wire.headers import FRAMES_CONTENT_TYPE

__all__ = ["relay_handler", "relay_path"]

log = logging.getLogger(__name__)
FOLD_FRAME_RAW = 4 * 1024 * 1024
MAX_RELAY_DEPTH = 16  # hops below the restorer: a line plan over 16 nodes, a deep tree
MAX_RELAY_FANOUT = 32  # children of one hop
MAX_RELAY_HOPS = 256  # hops in one plan
Frame = tuple[bytes, dict[str, Any], bytes, bytes]  # kind, meta, data, the frame's bytes


def relay_path(store_path: str) -> str:
    """``/v1/relay?store=...``: the store in the URL lets the hop authorize the plan's query
    before it reads the plan (store paths are URL-safe: letters, digits, ``._-/``)."""
    return f"/v1/relay?store={store_path}"


def _local_chunk(node: Node, t: ChunkTask) -> bytes | None:
    """One of this hop's own chunks, if it is here and sound; else the restorer fetches it."""
    try:
        return node.store.get_chunk(t.key)
    except StateStoreError as exc:
        log.warning("relay: own chunk %s unusable: %s", t.key, exc)
        return None


def _local_chunks(node: Node, hop: Hop) -> Iterator[tuple[ChunkTask, bytes]]:
    """This hop's own chunks that are here and sound; the rest the restorer fetches."""
    for t in hop.chunks:
        data = _local_chunk(node, t)
        if data is not None:
            yield t, data


async def _own_frames(
    node: Node, hop: Hop, out: asyncio.Queue[bytes | None]
) -> tuple[int, list[str]]:
    sent = 0
    covered: list[str] = []
    for t, data in _local_chunks(node, hop):
        await out.put(encode_frame(b"C", {"k": t.key, "p": t.pos}, data))
        sent += len(data)
        covered.append(t.key)
    return sent, covered


async def _child_frames(
    node: Node,
    store_path: str,
    child: Hop,
    fold: bool,
    depth: int,
    handle: Any,
    groups: int = 0,
) -> bool:
    """Stream a child's frames into ``handle(kind, meta, data, raw)``; failures become an E
    frame. True if the child's stream ended cleanly."""
    body = encode_hop(StoreId.parse(store_path), child, fold, depth, groups)
    stream = None
    try:
        stream = await node.transport.open_stream(child.address, relay_path(store_path), body)
        async for frame in read_frames(stream, node.config.max_chunk):
            await handle(*frame)
        return True
    except Exception as exc:  # a dead or broken child: report it, keep the rest
        meta = {"hop": child.address, "error": f"{type(exc).__name__}: {exc}"}
        await handle(b"E", meta, b"", encode_frame(b"E", meta))
        return False
    finally:
        if stream is not None:
            stream.close()


async def _line(
    node: Node, request: web.Request, store_path: str, hop: Hop, depth: int
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": FRAMES_CONTENT_TYPE})
    await resp.prepare(request)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=16)
    forwarded = [0]

    async def forward(kind: bytes, meta: dict[str, Any], data: bytes, raw: bytes) -> None:
        forwarded[0] += len(data)
        await queue.put(raw)

    async def produce() -> tuple[int, list[str]]:
        own_task = asyncio.ensure_future(_own_frames(node, hop, queue))
        await asyncio.gather(
            own_task,
            *(_child_frames(node, store_path, c, False, depth + 1, forward) for c in hop.children),
        )
        own, covered = own_task.result()
        done = {
            "hop": node.address,
            "depth": depth,
            "own": own,
            "in": forwarded[0],
            "out": own + forwarded[0],
        }
        await queue.put(encode_frame(b"D", done))
        await queue.put(None)
        return own, covered

    producer = asyncio.create_task(produce())
    try:
        while (frame := await queue.get()) is not None:
            await resp.write(frame)
        await producer
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await producer
    await resp.write_eof()
    return resp


async def _tree(
    node: Node, request: web.Request, store_path: str, hop: Hop, depth: int, groups: int
) -> web.StreamResponse:
    folded: dict[bytes, tuple[int, bytes | None]] = {}
    covers: list[str] = []
    passthrough: list[bytes] = []  # D and E frames of the subtree
    received = [0]
    loop = asyncio.get_running_loop()
    max_raw = node.config.max_chunk
    # the fold is held until it is sent: what it absorbs is taken from the memory budget
    # before it is merged (below); without room now the hop fails (an E frame: its parent,
    # holding its own memory, fetches the hop's chunks itself) rather than waiting, which
    # could be waiting on its own parent
    lease = request[LEASE]
    what = f"a tree fold of {store_path}"
    # headers go out now: the parent must not mistake a long fold for a dead hop
    resp = web.StreamResponse(headers={"Content-Type": FRAMES_CONTENT_TYPE})
    await resp.prepare(request)

    async def absorb(rows: list[Positioned], taken: int = 0) -> None:
        """Merge ``rows``, of which ``taken`` bytes were taken before they were decoded:
        what they hold beyond that is taken now, what was taken beyond it given back."""
        held = sum(len(k) + len(v or b"") + TREE_ROW_HELD for k, _, v in rows)
        if held > taken:
            await lease.take(held - taken, what, patient=False)
        elif held < taken:
            await lease.give(taken - held)
        merge_positioned(folded, rows)

    # a chunk's rows as the plan claims them (its manifest's raw size and rows, capped at
    # what a chunk may decode to) are taken before it is decoded, so that the decoded chunk
    # is within the budget too, and trued up once it is (the claim is the requester's word).
    # This hop's own chunks are taken all at once, before the first is read: hops folding
    # side by side each get all of theirs or fail at once, where taken a chunk at a time
    # they all got part way and all failed; a chunk this node lacks is not claimed
    claims = {
        t.key: fold_held([(min(t.raw_size, max_raw), min(t.rows, MAX_CHUNK_ROWS))], TREE_ROW_HELD)
        for t in hop.all_chunks()
    }
    named = {t.key: t for t in hop.chunks}  # a chunk named twice is folded once

    async def absorb_chunk(key: str, pos: int, data: bytes, taken: int | None = None) -> None:
        verify(data, _named_checksum(key), key)  # a child's frame, as the restorer checks one
        if taken is None:
            taken = claims.get(key, 0)
            await lease.take(taken, what, patient=False)
        rows = await loop.run_in_executor(
            None, lambda: decode_chunk(data, max_raw=max_raw, what=key)
        )
        await absorb([(k, pos, v) for k, v in rows], taken)
        covers.append(key)

    def handler(child_covers: list[str]) -> Any:
        async def handle(kind: bytes, meta: dict[str, Any], data: bytes, raw: bytes) -> None:
            received[0] += len(data)
            if kind == b"C":
                await absorb_chunk(str(meta["k"]), int(meta["p"]), data)
            elif kind == b"F":
                await absorb(await loop.run_in_executor(None, lambda: decode_folded(data, max_raw)))
            elif kind == b"D" and "covers" in meta:
                child_covers.extend(str(k) for k in meta["covers"])
            else:
                passthrough.append(raw)

        return handle

    own = 0
    child_covers: list[list[str]] = [[] for _ in hop.children]
    children = [
        asyncio.create_task(
            _child_frames(node, store_path, c, True, depth + 1, handler(cc), groups)
        )
        for c, cc in zip(hop.children, child_covers, strict=True)
    ]
    try:
        # only those held here are claimed (one read of the keys): the restorer fetches the
        # rest
        held_here = node.store.has_chunks(list(named))
        mine = {k: t for (k, t), here in zip(named.items(), held_here, strict=True) if here}
        await lease.take(sum(claims[key] for key in mine), what, patient=False)
        for t in mine.values():  # folded in while the children stream
            data = _local_chunk(node, t)
            if data is None:  # gone since, or unusable: the restorer fetches it elsewhere
                await lease.give(claims[t.key])
                continue
            own += len(data)
            await absorb_chunk(t.key, t.pos, data, claims[t.key])
        for task, cc in zip(children, child_covers, strict=True):
            if await task:  # a child cut mid-stream: its chunks are not vouched for
                covers.extend(cc)
    except StateStoreError as exc:  # no room, a chunk of its own unusable: this hop failed
        folded.clear()
        meta = {"hop": node.address, "error": f"{type(exc).__name__}: {exc}"}
        answer = PacedAnswer(request, resp, node.config.body_timeout)
        if await answer.write(encode_frame(b"E", meta)):
            await answer.end()
        return resp  # headers went out: an error answer now would garble the stream
    finally:  # its children stop folding too
        for task in children:
            task.cancel()

    # the fold is done: from now on the parent must read what it holds at a pace
    answer = PacedAnswer(request, resp, node.config.body_timeout)
    header = {"hop": node.address, "depth": depth, "covers": covers}
    if not await answer.write(encode_frame(b"D", header)):
        return resp
    # folded rows in key-group order, frames cut only at group boundaries, so that each
    # frame completes the groups it names
    items = sorted(
        ((key_group(k, groups) if groups else 0, k, pos, v) for k, (pos, v) in folded.items()),
        key=lambda r: r[0],
    )
    out = 0
    batch: list[tuple[bytes, int, bytes | None]] = []
    size = 0
    lo = 0
    for i, (g, k, pos, v) in enumerate(items):
        batch.append((k, pos, v))
        size += len(k) + (len(v) if v is not None else 0) + 12
        last = i == len(items) - 1
        if last or (size >= FOLD_FRAME_RAW and items[i + 1][0] != g):
            data = await loop.run_in_executor(None, encode_folded, batch)
            hi = (groups - 1 if groups else 0) if last else g
            frame = encode_frame(b"F", {"hop": node.address, "g": [lo, hi]}, data)
            if not await answer.write(frame):
                return resp  # not read in time: cut, and what it held given back
            out += len(data)
            batch, size, lo = [], 0, g + 1
    if not items and groups:
        data = encode_folded([])
        frame = encode_frame(b"F", {"hop": node.address, "g": [0, groups - 1]}, data)
        if not await answer.write(frame):
            return resp
    for frame in passthrough:
        if not await answer.write(frame):
            return resp
    done = {"hop": node.address, "depth": depth, "own": own, "in": received[0], "out": out}
    if await answer.write(encode_frame(b"D", done)):
        await answer.end()
    return resp


def check_plan_hops(node: Node, hop: Hop, depth: int) -> None:
    """Refuse a plan that would make this node call anything but live ring members, or fan
    out past the bounds (each hop's children, the depth, the hops in all): otherwise
    ``/v1/relay`` is a request forgery and amplification service
    (docs/security.md, Hardened endpoints)."""
    live = set(node.view().live_addresses())
    count = 0
    stack = [(hop, depth)]
    while stack:
        h, d = stack.pop()
        count += 1
        if d > MAX_RELAY_DEPTH or count > MAX_RELAY_HOPS or len(h.children) > MAX_RELAY_FANOUT:
            raise InvalidRequest(
                f"relay plan is too big: at most {MAX_RELAY_FANOUT} children per hop, depth "
                f"{MAX_RELAY_DEPTH}, {MAX_RELAY_HOPS} hops"
            )
        for c in h.children:
            if c.address not in live or c.address == node.address:
                raise InvalidRequest(
                    f"relay child {c.address!r:.80} is not a live ring member other than this "
                    "node: a plan only names members of the ring view (GET /v1/ring)"
                )
            stack.append((c, d + 1))


async def _read_plan(request: web.Request, limit: float) -> bytes:
    """The plan's bytes, at most MAX_PLAN_BYTES (413 past it, without reading the rest)."""
    declared = request.content_length
    if declared is not None and declared > MAX_PLAN_BYTES:
        raise PayloadTooLarge(
            f"relay plan is {declared} bytes: the limit is {MAX_PLAN_BYTES}; split the restore"
        )
    if principal(request).kind == "node":
        # a node's signed request: the auth middleware read its body already, to check it
        # against its signed digest (node/request.read_signed_body), and keeps the bytes;
        # read from the stream again, the plan came empty and every relay between nodes of
        # a ring with the cluster secret failed (the restores fell back to star)
        body = await request.read()
        if len(body) > MAX_PLAN_BYTES:
            raise PayloadTooLarge(f"relay plan is over {MAX_PLAN_BYTES} bytes: split the restore")
        return body
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limit):
            while part := await request.content.read(64 * 1024):
                size += len(part)
                if size > MAX_PLAN_BYTES:
                    raise PayloadTooLarge(
                        f"relay plan is over {MAX_PLAN_BYTES} bytes: split the restore"
                    )
                parts.append(part)
    except TimeoutError as exc:
        raise InvalidRequest(f"relay plan did not arrive within {limit:.0f}s") from exc
    return b"".join(parts)


async def relay_handler(request: web.Request) -> web.StreamResponse:
    """A hop: the plan's query is authorized before the plan is decoded (docs/security.md,
    Hardened endpoints), from ``?store=`` before a byte of it is read, else from the plan's
    store field read alone (:func:`hop_store`); the plan must then be for that store."""
    node = request.app[NODE]
    claimed = request.query.get("store")
    named = StoreId.parse(claimed) if claimed is not None else None
    if named is not None:
        allow(request, "read", named.query)
    body = await _read_plan(request, node.config.body_timeout)
    if named is None:
        named = hop_store(body)
        allow(request, "read", named.query)
    store, hop, fold, depth, groups = decode_hop(body)
    if store != named:
        raise InvalidRequest(
            f"relay plan is for store {store.path}, but the request names {named.path}: "
            "send a plan to /v1/relay?store=<the plan's store>"
        )
    check_plan_hops(node, hop, depth)
    if node.config.inject_delay:
        await asyncio.sleep(node.config.inject_delay)
    work = (
        _tree(node, request, store.path, hop, depth, groups)
        if fold
        else _line(node, request, store.path, hop, depth)
    )
    # a hop waits on its children with no bound of its own (a tree hop's child sends
    # nothing until its subtree is folded): it stops when its requester leaves, which the
    # restorer at the top does once the stream is quiet for longer than the plan predicts
    resp = await while_requester_stays(request, work)
    if resp is None:  # nobody is there to read an answer: this one is never sent
        return web.Response(status=499, reason="Requester Left")
    return resp


def _named_checksum(key: str) -> int:
    """The xxh3-64 a chunk's name carries (``[dsw]<seq>-<hex>``); MalformedData otherwise."""
    name = parse_chunk_key(key)[2]
    try:
        return int(name.rsplit("-", 1)[1], 16)
    except (IndexError, ValueError) as exc:
        raise MalformedData(f"chunk {key} names no checksum") from exc
