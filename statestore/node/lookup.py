"""Point reads served by a node, with a cache of its own that every reader shares.

``GET /v1/stores/{store}/key?key=HEX[&version=N]``, for callers without the ring client
(curl, the JVM, the dashboard's users): the node runs the client's point read
(``net/reads.read_key``: the chain walked newest first, only the key's key group fetched),
and answers the value's bytes (``404 not_found`` when the key has none at that version).
Timed by the metrics as ``statestore_point_read_seconds``.

``POST /v1/stores/{store}/lookup`` (wire/bodies.LookupRequest), for a reader that holds the
version's chain (an opened store of the SDK with no cache of its own): it names the blocked
chunks along the chain that the keys' groups fall in, and the node reads, of each, the index
and the one block a key can be in, from its own storage when it holds the chunk (else from a
replica), verified against the checksums the reader named and kept decoded in the node's
cache. The answer is a msgpack list: each key's value, or nil when it has none. One request
per read, however long the chain, and the indexes stay on the node: a reader with nothing
cached costs the node a few dictionary look-ups once its cache holds the store's indexes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

import msgpack
import zstandard
from aiohttp import web

from statestore.core.cache import ChunkCache, rows_cost
from statestore.core.chunk import (
    INDEX_OVERHEAD,
    BlockIndex,
    decode_block,
    decoded_bound,
    key_group,
    verify,
)
from statestore.core.errors import (
    CorruptChunk,
    InvalidRequest,
    NodeUnavailable,
    NotFound,
    PayloadTooLarge,
    StateStoreError,
)
from statestore.core.ids import StoreId, check_version, chunk_key
from statestore.core.manifest import ChunkRef
from statestore.net.quorate import gather_all
from statestore.net.reads import (
    Block,
    ReadStats,
    blocks_wanted,
    cache_key,
    decided,
    fetch_part,
    load_index,
    read_head,
    read_key,
)
from statestore.node.budget import LEASE, Lease
from statestore.node.daemon import NODE, Node
from statestore.node.request import read_body, store_of
from statestore.wire.bodies import (
    MAX_LOOKUP_INDEX,
    MAX_LOOKUP_INDEX_BYTES,
    MAX_LOOKUP_KEY_BYTES,
    MAX_LOOKUP_PATH,
    LookupPart,
    LookupRequest,
    decode_json,
)
from statestore.wire.headers import EPOCH_HEADER

__all__ = ["CACHE", "MAX_KEY_BYTES", "answer_lookup", "lookup", "point_read", "register"]

MAX_KEY_BYTES = 64 * 1024
WINDOW = 16  # keys of one lookup read at once
# bytes of chunks' parts (indexes and blocks) one lookup may read, and of values it may answer
LOOKUP_READ_BYTES = 48 * 1024 * 1024
LOOKUP_ANSWER_BYTES = 32 * 1024 * 1024
CACHE = web.AppKey("point_read_cache", ChunkCache)
# the node's decompression context for the blocks its lookups decode, kept (making one costs
# ~10x decompressing a 4 KiB block): used on the node's event loop only, with no await
# between a block's decompression and the next
DCTX = web.AppKey("lookup_dctx", zstandard.ZstdDecompressor)


def _key(text: str | None) -> bytes:
    if text is None or len(text) > 2 * MAX_KEY_BYTES:
        raise InvalidRequest(
            f"point read: give the key as ?key=<hex bytes>, at most {MAX_KEY_BYTES} bytes"
        )
    try:
        return bytes.fromhex(text)
    except ValueError as exc:
        raise InvalidRequest(f"point read: key {text[:40]!r} is not hex ({exc})") from exc


async def point_read(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = store_of(request)
    key = _key(request.query.get("key"))
    view = node.view()
    text = request.query.get("version")
    if text is None:
        version = (await read_head(node.transport, view, store)).version
    elif text.isascii() and text.isdigit() and len(text) <= 19:
        version = check_version(int(text))
    else:
        raise InvalidRequest(f"version {text[:40]!r} must be a positive integer")
    value = await read_key(
        node.transport, view, store, version, key, request.app[CACHE],
        max_raw=node.config.max_chunk, budget=request[LEASE],
    )  # fmt: skip
    if value is None:
        raise NotFound(f"{store} has no value for that key at version {version}")
    return web.Response(
        body=value,
        content_type="application/octet-stream",
        headers={"X-Statestore-Version": str(version), EPOCH_HEADER: str(node.epoch)},
    )


Part = tuple[int, ChunkRef, str]  # a chunk a lookup names: version, chunk, its cache_key


def _parts(store: StoreId, body: LookupRequest) -> tuple[Part, ...]:
    """:func:`_checked_parts` of a lookup. A reader names the same chain's chunks lookup after
    lookup, so a list of up to :data:`KEPT_PARTS` is checked once: the last 256 are kept
    (2.5 MB at most; a bad list raises, and is not kept)."""
    if len(body.parts) > KEPT_PARTS:
        return _checked_parts.__wrapped__(store, body.groups, tuple(body.parts))
    return _checked_parts(store, body.groups, tuple(body.parts))


KEPT_PARTS = 32


@functools.lru_cache(maxsize=256)
def _checked_parts(store: StoreId, groups: int, parts: tuple[LookupPart, ...]) -> tuple[Part, ...]:
    """The chunks a lookup names (their names checked on decode), with their cache keys
    (net/reads.cache_key, made once a list), checked: ranges within the
    store's groups, an index of at most :data:`MAX_LOOKUP_INDEX` bytes within its chunk, all
    of them together at most :data:`MAX_LOOKUP_INDEX_BYTES`, no chunk twice, newest version
    first and each version's ranges in order, overlapping at most at an end (a manifest's
    chunks: a key looks into one or two of a version's chunks)."""
    out: list[Part] = []
    last: tuple[int, int] | None = None
    seen: set[tuple[int, str]] = set()
    for p in parts:
        if not p.lo <= p.hi < groups:
            raise InvalidRequest(
                f"lookup: chunk {p.name} covers groups {p.lo}..{p.hi}, not within the "
                f"store's {groups}"
            )
        if p.index_len > MAX_LOOKUP_INDEX or p.index_len + INDEX_OVERHEAD > p.size:
            raise InvalidRequest(
                f"lookup: chunk {p.name}'s index is not within its bytes, or is over "
                f"{MAX_LOOKUP_INDEX} bytes (read such a chunk by parts)"
            )
        if p.index_checksum >= 1 << 64:
            raise InvalidRequest(f"lookup: chunk {p.name}'s index checksum is not 64 bits")
        if (p.version, p.name) in seen:
            raise InvalidRequest(f"lookup: chunk {p.name} of version {p.version} named twice")
        seen.add((p.version, p.name))
        if last is not None and not (
            p.version < last[0] or (p.version == last[0] and p.lo >= last[1])
        ):
            raise InvalidRequest(
                "lookup: give the parts newest version first, each version's chunks in group "
                "order (a group split over two chunks is the one they share)"
            )
        last = (p.version, p.hi)
        ref = ChunkRef(p.name, p.lo, p.hi, p.size, 0, 1, 0, p.index_len, p.index_checksum)
        out.append((p.version, ref, cache_key(store, p.version, ref)))
    if sum(ref.index_len for _, ref, _ in out) > MAX_LOOKUP_INDEX_BYTES:
        raise InvalidRequest(
            f"lookup: the chunks' indexes come to more than {MAX_LOOKUP_INDEX_BYTES} bytes: "
            "split the keys over several lookups"
        )
    return tuple(out)


def _keys(texts: list[str]) -> list[bytes]:
    keys = []
    for text in texts:
        try:
            keys.append(bytes.fromhex(text))
        except ValueError as exc:
            raise InvalidRequest(f"lookup: key {text[:40]!r} is not hex ({exc})") from exc
    if len(set(keys)) < len(keys):
        raise InvalidRequest("lookup: a key is named twice")
    if sum(map(len, keys)) > MAX_LOOKUP_KEY_BYTES:
        raise InvalidRequest(
            f"lookup: its keys come to more than {MAX_LOOKUP_KEY_BYTES} bytes: split them over "
            "several lookups"
        )
    return keys


class _Reads:
    """One lookup's reads of parts of chunks: from this node's storage, verified, else from a
    replica (when it does not hold the chunk or its copy is bad); each part once per
    request whatever the keys asking for it, at most :data:`LOOKUP_READ_BYTES` in all (a
    reader naming a checksum no copy has costs each holder one read per part it names, not
    one per key). Each part's bytes are taken from the node's ``--memory-budget`` (the
    request's lease, node/budget.py) before it is read: lookups at once hold no more than
    the budget allows, a lookup needing more than all of it gets 413, one that finds no room
    waits for it, then gets 429."""

    def __init__(self, node: Node, store: StoreId, lease: Lease) -> None:
        self.node = node
        self.store = store
        self.lease = lease
        self.stats = ReadStats()
        self.bytes = 0
        self.parts: dict[tuple[str, int, int, int], asyncio.Task[bytes]] = {}  # indexes
        self.read: dict[tuple[str, int, int, int], bytes] = {}  # blocks, as read

    def _count(self, length: int) -> None:
        self.bytes += length
        if self.bytes > LOOKUP_READ_BYTES:
            raise PayloadTooLarge(
                f"lookup: its keys' blocks and indexes come to more than "
                f"{LOOKUP_READ_BYTES} bytes: split the keys over several lookups"
            )

    def fetch_for(
        self, version: int, ref: ChunkRef
    ) -> Callable[[tuple[int, int], int], Awaitable[bytes]]:
        ckey = chunk_key(self.store, version, ref.name)

        def fetch(span: tuple[int, int], expected: int) -> Awaitable[bytes]:
            task = self.parts.get((ckey, *span, expected))
            if task is None:
                self._count(span[1])
                task = asyncio.ensure_future(self._read(version, ref, ckey, span, expected))
                self.parts[(ckey, *span, expected)] = task
            return task

        return fetch

    async def blocks(
        self, wanted: Sequence[tuple[int, ChunkRef, tuple[int, int], int]]
    ) -> list[bytes]:
        """The bytes of ``wanted`` parts, (version, chunk, span, checksum) each: those this
        lookup read before as they were (each part is read and counted once a request),
        the others taken from the lease together, then read from this node's storage where
        it holds a copy that verifies (no task, no wait), the rest from replicas at once."""
        out: list[bytes | None] = []
        new = []
        for version, ref, span, expected in wanted:
            ckey = chunk_key(self.store, version, ref.name)
            data = self.read.get((ckey, *span, expected))
            out.append(data)
            if data is None:
                new.append((len(out) - 1, version, ref, ckey, span, expected))
        total = sum(span[1] for *_, span, _ in new)
        self._count(total)
        await self.lease.take(total, "a lookup's reads")
        elsewhere = []
        by_chunk: dict[str, list[tuple[int, int, ChunkRef, str, tuple[int, int], int]]] = {}
        for item in new:
            by_chunk.setdefault(item[3], []).append(item)
        for ckey, items in by_chunk.items():  # a chunk's blocks in one read of storage
            held = self._held_parts(ckey, [(span, expected) for *_, span, expected in items])
            for (n, version, ref, ckey, span, expected), data in zip(items, held, strict=True):
                out[n] = data
                if data is None:
                    elsewhere.append((n, version, ref, ckey, span, expected))
        if elsewhere:
            got = await gather_all(self._from_replica(*e[1:]) for e in elsewhere)
            for (n, *_), data in zip(elsewhere, got, strict=True):
                out[n] = data
        for n, _v, _ref, ckey, span, expected in new:
            self.read[(ckey, *span, expected)] = cast("bytes", out[n])
        return cast("list[bytes]", out)

    async def _read(
        self, version: int, ref: ChunkRef, ckey: str, span: tuple[int, int], expected: int
    ) -> bytes:
        await self.lease.take(span[1], "a lookup's reads")
        data = self._held(ckey, span, expected)
        if data is None:
            data = await self._from_replica(version, ref, ckey, span, expected)
        return data

    def _held_parts(
        self, ckey: str, wanted: Sequence[tuple[tuple[int, int], int]]
    ) -> list[bytes | None]:
        """Parts of one chunk, (span, checksum) each, from this node's storage: each one
        held that verifies, else None (read from a replica)."""
        held = self.node.store.get_chunk_parts(ckey, [span for span, _ in wanted])
        if held is None:
            return [None] * len(wanted)
        parts, size = held
        out: list[bytes | None] = []
        for ((offset, length), expected), data in zip(wanted, parts, strict=True):
            try:
                if offset + length > size:
                    raise CorruptChunk(f"{ckey} holds {size} bytes, not {offset}+{length}")
                verify(data, expected, f"{ckey} bytes {offset}+{length}")
                out.append(data)
            except CorruptChunk:
                out.append(None)  # a replica's copy; the scrub rewrites this one
        return out

    def _held(self, ckey: str, span: tuple[int, int], expected: int) -> bytes | None:
        """The part from this node's storage, if it holds the chunk and its copy verifies."""
        offset, length = span
        held = self.node.store.get_chunk_part(ckey, offset, length)
        if held is not None and offset + length <= held[1]:
            try:
                verify(held[0], expected, f"{ckey} bytes {offset}+{length}")
                return held[0]
            except CorruptChunk:
                pass  # a replica's copy; the scrub rewrites this one
        return None

    async def _from_replica(
        self, version: int, ref: ChunkRef, ckey: str, span: tuple[int, int], expected: int
    ) -> bytes:
        skipped: list[StateStoreError] = []
        node = self.node
        try:
            return await fetch_part(
                node.transport, node.view(), self.store, version, ref, span, expected,
                self.stats, skipped,
            )  # fmt: skip
        except NodeUnavailable:
            # every live holder answered: none has it, or none has it as the reader named
            if skipped and all(isinstance(e, NotFound) for e in skipped):
                raise NotFound(
                    f"chunk {ckey} is on no live holder: the lookup names a chunk the "
                    "store does not have (retention may have dropped it)"
                ) from None
            if skipped and all(isinstance(e, NotFound | CorruptChunk) for e in skipped):
                raise CorruptChunk(
                    f"no copy of chunk {ckey} has the checksum the lookup names: "
                    f"{next(e for e in skipped if isinstance(e, CorruptChunk))}"
                ) from None
            raise

    def cancel(self) -> None:
        for task in self.parts.values():  # a read failed: the others are not waited for
            task.cancel()


class _Pinned(ChunkCache):
    """The node's cache, with the indexes one lookup loads or finds there kept for it whatever
    the cache evicts meanwhile (each is read and parsed at most once a request; those found
    are taken from its lease, those loaded were as they were read)."""

    def __init__(self, shared: ChunkCache, query: str) -> None:
        super().__init__(0)
        self.shared = shared
        self.indexes: dict[str, BlockIndex] = {}
        # a drop of the query meanwhile (ChunkCache.forget): what this lookup read is not
        # put back in the shared cache
        self.query = query
        self.began = shared.generation(query)

    def _current(self) -> bool:
        return self.shared.generation(self.query) == self.began

    def get(self, key: str) -> dict[bytes, bytes | None] | None:
        return self.shared.get(key)

    def put(self, key: str, rows: dict[bytes, bytes | None], size: int) -> None:
        if self._current():
            self.shared.put(key, rows, size)

    def get_index(self, chunk: str) -> BlockIndex | None:
        index = self.indexes.get(chunk)
        if index is None:
            index = self.shared.get_index(chunk)
            if index is not None:  # found: kept for the lookup from now on
                self.indexes[chunk] = index
        return index

    def put_index(self, chunk: str, index: BlockIndex) -> None:
        self.indexes[chunk] = index
        if self._current():
            self.shared.put_index(chunk, index)


async def _values(
    keys: Sequence[bytes],
    paths: Sequence[Sequence[Part]],
    groups: int,
    store: StoreId,
    reads: _Reads,
    cache: _Pinned,
    max_raw: int,
    dctx: zstandard.ZstdDecompressor,
) -> list[bytes | None]:
    """The values of ``keys`` along their ``paths``, every index pinned in ``cache``: the
    blocks the keys need and the cache does not hold, of all of them together and each
    once, read at once, verified, decoded and cached; then each key's value from the
    blocks (the newest naming it decides), those found cached kept for the lookup meanwhile."""
    held: dict[str, dict[bytes, bytes | None]] = {}
    values: list[bytes | None] = []
    wanted: dict[str, Block] = {}
    waiting: list[tuple[int, bytes | None, list[Block]]] = []
    for n, (key, path) in enumerate(zip(keys, paths, strict=True)):
        walk = blocks_wanted(
            [(v, ref) for v, ref, _ in path], store, key_group(key, groups), key, cache, held,
            [ckey for _, _, ckey in path],
        )  # fmt: skip
        if walk is None:
            raise RuntimeError("lookup: an index it loaded is not pinned")
        value, blocks = walk
        values.append(None if blocks else value)
        if blocks:
            waiting.append((n, value, blocks))
            for block in blocks:
                wanted.setdefault(f"{block[2]}#{block[3]}", block)
    if not wanted:
        return values
    spans = []
    for version, ref, ckey, i in wanted.values():
        index = cache.indexes[ckey]
        spans.append((version, ref, (index.offsets[i], index.lengths[i]), index.checksums[i]))
    frames = await reads.blocks(spans)
    # what the blocks decode to at most, by their frames' own declared sizes (a block may
    # hold one large row, up to a chunk's limit), past the frames' bytes that the lookup
    # holds already, taken while they decode: the rows are then the cache's, counted there,
    # and the values the answer's, taken with it. Not waited for once the lookup holds
    # room (two lookups each holding reads and waiting for the other's would both wait
    # out the body timeout): refused at once then (429), and the reader asks again
    declared = sum(decoded_bound(frame, max_raw) for frame in frames)
    bound = max(0, declared - sum(map(len, frames)))
    await reads.lease.take(bound, "a lookup's blocks decoded", patient=reads.lease.held == 0)
    try:
        for (bkey, (_v, _ref, ckey, i)), frame in zip(wanted.items(), frames, strict=True):
            index = cache.indexes[ckey]
            rows = dict(decode_block(frame, index, i, max_raw=max_raw, what=ckey, dctx=dctx))
            cache.put(bkey, rows, rows_cost(rows))
            held[bkey] = rows
    finally:
        await reads.lease.give(bound)
    for n, value, blocks in waiting:  # each block it wanted now held
        values[n] = decided(keys[n], value, blocks, held)
    return values


LOOKUP_SHAPE = (
    '{"groups": G, "keys": [hex, ...], "parts": [[version, name, lo, hi, size, '
    "index_len, index_checksum], ...]}"
)


async def lookup(request: web.Request) -> web.Response:
    """``POST /v1/stores/{store}/lookup``."""
    store = store_of(request)
    raw = await read_body(request)
    answer = await answer_lookup(request.app, store, raw, request[LEASE])
    return web.Response(
        body=answer,
        content_type="application/msgpack",
        headers={EPOCH_HEADER: str(request.app[NODE].epoch)},
    )


async def answer_lookup(app: web.Application, store: StoreId, raw: bytes, lease: Lease) -> bytes:
    """A lookup's answer (a msgpack list of the keys' values) to the body ``raw`` of a
    reader authorized to read ``store``, its reads and answer taken from ``lease``: the one
    path of ``POST .../lookup`` and of a lookup channel's messages (node/channel.py)."""
    node = app[NODE]
    body = decode_json(raw, LookupRequest, "lookup", LOOKUP_SHAPE)
    keys = _keys(body.keys)
    parts = _parts(store, body)
    floor = node.store.floor(store)
    if floor and any(v < floor for v, _, _ in parts):
        # retention dropped those versions here: what the cache may still hold of them is
        # not answered (the reader's chain read then says the version is gone)
        raise NotFound(
            f"lookup: {store} holds no version below {floor} on this node (retention dropped "
            "them): read the version's chain again"
        )
    paths = []
    for key in keys:
        g = key_group(key, body.groups)
        path = [part for part in parts if part[1].lo <= g <= part[1].hi]
        if len(path) > MAX_LOOKUP_PATH:
            raise InvalidRequest(
                f"lookup: a key looks into {len(path)} chunks, more than {MAX_LOOKUP_PATH}: "
                "read a chain that long by parts"
            )
        paths.append(path)
    reads = _Reads(node, store, lease)
    cache = _Pinned(app[CACHE], store.query)  # the indexes it reads or finds, kept
    values: list[bytes | None] = []
    answer = 0
    try:
        needed = {(v, ref.name): (v, ref, ckey) for path in paths for v, ref, ckey in path}
        missing, found = [], 0
        for v, ref, ckey in needed.values():
            if cache.get_index(ckey) is None:
                missing.append((v, ref, ckey))
            else:
                found += ref.index_len
        # those found cached stay for it whatever the cache evicts: from its lease too, as
        # those it reads are (their bytes as stored)
        await reads.lease.take(found, "a lookup's indexes")
        await gather_all(  # each index the keys need and the cache lacks, read once
            load_index(reads.fetch_for(v, ref), ref, ckey, cache) for v, ref, ckey in missing
        )
        # a window of keys at a time: their blocks held at once, at most WINDOW paths' worth
        for i in range(0, len(keys), WINDOW):
            got = await _values(
                keys[i : i + WINDOW], paths[i : i + WINDOW], body.groups, store, reads, cache,
                node.config.max_chunk, app[DCTX],
            )  # fmt: skip
            size = sum(len(v) for v in got if v is not None)
            answer += size
            if answer > LOOKUP_ANSWER_BYTES:
                raise PayloadTooLarge(
                    f"lookup: its values come to more than {LOOKUP_ANSWER_BYTES} bytes: split "
                    "the keys over several lookups"
                )
            await reads.lease.take(2 * size, "a lookup's answer")  # the values, then packed
            values += got
            if i + WINDOW < len(keys):
                # a window read from this node's storage may not have waited at all: the
                # other requests run before the next one
                await asyncio.sleep(0)
    finally:
        reads.cancel()
    packed: bytes = msgpack.packb(values, use_bin_type=True)
    return packed


def register(app: web.Application) -> None:
    app[CACHE] = ChunkCache(app[NODE].config.lookup_cache)
    app[NODE].purge_hooks.append(app[CACHE].forget)  # a dropped query's reads are forgotten
    app[DCTX] = zstandard.ZstdDecompressor()
    app.router.add_get("/v1/stores/{query}/{operator}/{partition}/{name}/key", point_read)
    app.router.add_post("/v1/stores/{query}/{operator}/{partition}/{name}/lookup", lookup)
