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
from collections.abc import Awaitable, Callable

import msgpack
from aiohttp import web

from statestore.core.cache import ChunkCache
from statestore.core.chunk import INDEX_OVERHEAD, BlockIndex, key_group, verify
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
    BlockPath,
    ReadStats,
    cache_key,
    fetch_part,
    load_index,
    read_by_blocks,
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

__all__ = ["CACHE", "MAX_KEY_BYTES", "lookup", "point_read", "register"]

MAX_KEY_BYTES = 64 * 1024
WINDOW = 16  # keys of one lookup read at once
# bytes of chunks' parts (indexes and blocks) one lookup may read, and of values it may answer
LOOKUP_READ_BYTES = 48 * 1024 * 1024
LOOKUP_ANSWER_BYTES = 32 * 1024 * 1024
CACHE = web.AppKey("point_read_cache", ChunkCache)


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
        node.transport, view, store, version, key, request.app[CACHE], max_raw=node.config.max_chunk
    )
    if value is None:
        raise NotFound(f"{store} has no value for that key at version {version}")
    return web.Response(
        body=value,
        content_type="application/octet-stream",
        headers={"X-Statestore-Version": str(version), EPOCH_HEADER: str(node.epoch)},
    )


def _parts(store: StoreId, body: LookupRequest) -> tuple[tuple[int, ChunkRef], ...]:
    """:func:`_checked_parts` of a lookup. A reader names the same chain's chunks lookup after
    lookup, so a list of up to :data:`KEPT_PARTS` is checked once: the last 256 are kept
    (2.5 MB at most; a bad list raises, and is not kept)."""
    if len(body.parts) > KEPT_PARTS:
        return _checked_parts.__wrapped__(store, body.groups, tuple(body.parts))
    return _checked_parts(store, body.groups, tuple(body.parts))


KEPT_PARTS = 32


@functools.lru_cache(maxsize=256)
def _checked_parts(
    store: StoreId, groups: int, parts: tuple[LookupPart, ...]
) -> tuple[tuple[int, ChunkRef], ...]:
    """The chunks a lookup names (their names checked on decode), checked: ranges within the
    store's groups, an index of at most :data:`MAX_LOOKUP_INDEX` bytes within its chunk, all
    of them together at most :data:`MAX_LOOKUP_INDEX_BYTES`, no chunk twice, newest version
    first and each version's ranges in order, overlapping at most at an end (a manifest's
    chunks: a key looks into one or two of a version's chunks)."""
    out: BlockPath = []
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
        out.append((p.version, ref))
    if sum(ref.index_len for _, ref in out) > MAX_LOOKUP_INDEX_BYTES:
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
        self.parts: dict[tuple[str, int, int, int], asyncio.Task[bytes]] = {}

    def fetch_for(
        self, version: int, ref: ChunkRef
    ) -> Callable[[tuple[int, int], int], Awaitable[bytes]]:
        ckey = chunk_key(self.store, version, ref.name)

        def fetch(span: tuple[int, int], expected: int) -> Awaitable[bytes]:
            task = self.parts.get((ckey, *span, expected))
            if task is None:
                self.bytes += span[1]
                if self.bytes > LOOKUP_READ_BYTES:
                    raise PayloadTooLarge(
                        f"lookup: its keys' blocks and indexes come to more than "
                        f"{LOOKUP_READ_BYTES} bytes: split the keys over several lookups"
                    )
                task = asyncio.ensure_future(self._read(version, ref, ckey, span, expected))
                self.parts[(ckey, *span, expected)] = task
            return task

        return fetch

    async def _read(
        self, version: int, ref: ChunkRef, ckey: str, span: tuple[int, int], expected: int
    ) -> bytes:
        offset, length = span
        await self.lease.take(length, "a lookup's reads")
        held = self.node.store.get_chunk_part(ckey, offset, length)
        if held is not None and offset + length <= held[1]:
            try:
                verify(held[0], expected, f"{ckey} bytes {offset}+{length}")
                return held[0]
            except CorruptChunk:
                pass  # a replica's copy; the scrub rewrites this one
        del held
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
    """The node's cache, with the indexes one lookup loaded kept for it whatever the cache
    evicts meanwhile (each is read and parsed once a request)."""

    def __init__(self, shared: ChunkCache) -> None:
        super().__init__(0)
        self.shared = shared
        self.indexes: dict[str, BlockIndex] = {}

    def get(self, key: str) -> dict[bytes, bytes | None] | None:
        return self.shared.get(key)

    def put(self, key: str, rows: dict[bytes, bytes | None], size: int) -> None:
        self.shared.put(key, rows, size)

    def get_index(self, chunk: str) -> BlockIndex | None:
        index = self.indexes.get(chunk)
        return index if index is not None else self.shared.get_index(chunk)

    def put_index(self, chunk: str, index: BlockIndex) -> None:
        self.indexes[chunk] = index
        self.shared.put_index(chunk, index)


async def lookup(request: web.Request) -> web.Response:
    """``POST /v1/stores/{store}/lookup``."""
    node = request.app[NODE]
    store = store_of(request)
    body = decode_json(
        await read_body(request),
        LookupRequest,
        "lookup",
        '{"groups": G, "keys": [hex, ...], "parts": [[version, name, lo, hi, size, '
        "index_len, index_checksum], ...]}",
    )
    keys = _keys(body.keys)
    parts = _parts(store, body)
    paths = []
    for key in keys:
        g = key_group(key, body.groups)
        path = [(v, ref) for v, ref in parts if ref.lo <= g <= ref.hi]
        if len(path) > MAX_LOOKUP_PATH:
            raise InvalidRequest(
                f"lookup: a key looks into {len(path)} chunks, more than {MAX_LOOKUP_PATH}: "
                "read a chain that long by parts"
            )
        paths.append(path)
    reads = _Reads(node, store, request[LEASE])
    # a lookup of several keys keeps the indexes it loaded for itself (a reader's get reads
    # each once anyway)
    cache = _Pinned(request.app[CACHE]) if len(keys) > 1 else request.app[CACHE]
    max_raw = node.config.max_chunk

    def one(key: bytes, path: BlockPath) -> Awaitable[bytes | None]:
        return read_by_blocks(
            path, body.groups, reads.fetch_for, store, key, cache, max_raw=max_raw
        )

    values: list[bytes | None] = []
    answer = 0
    try:
        if len(keys) > 1:  # each index the keys need, read and parsed once
            needed = {(v, ref.name): (v, ref) for path in paths for v, ref in path}
            await gather_all(
                load_index(reads.fetch_for(v, ref), ref, cache_key(store, v, ref), cache)
                for v, ref in needed.values()
            )
        # a window of keys at a time: at most WINDOW * MAX_LOOKUP_PATH reads in flight
        for i in range(0, len(keys), WINDOW):
            window = zip(keys[i : i + WINDOW], paths[i : i + WINDOW], strict=True)
            if len(keys) == 1:  # a reader's get: no task
                got = [await one(keys[0], paths[0])]
            else:
                got = await gather_all(one(k, p) for k, p in window)
            size = sum(len(v) for v in got if v is not None)
            answer += size
            if answer > LOOKUP_ANSWER_BYTES:
                raise PayloadTooLarge(
                    f"lookup: its values come to more than {LOOKUP_ANSWER_BYTES} bytes: split "
                    "the keys over several lookups"
                )
            await reads.lease.take(2 * size, "a lookup's answer")  # the values, then packed
            values += got
    finally:
        reads.cancel()
    return web.Response(
        body=msgpack.packb(values, use_bin_type=True),
        content_type="application/msgpack",
        headers={EPOCH_HEADER: str(node.epoch)},
    )


def register(app: web.Application) -> None:
    app[CACHE] = ChunkCache(app[NODE].config.lookup_cache)
    app.router.add_get("/v1/stores/{query}/{operator}/{partition}/{name}/key", point_read)
    app.router.add_post("/v1/stores/{query}/{operator}/{partition}/{name}/lookup", lookup)
