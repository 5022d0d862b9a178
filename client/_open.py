"""Opened stores: a version of a store read lazily, key group by key group.

``AsyncRingClient.open(store, version)`` resolves the head (or takes the version given) and the
chain of manifests that rebuilds it, once: the result is pinned to that version (commits made
after it was opened do not change what it reads). Nothing else is fetched up front. A group
load (``get_many``, and ``get`` of chunks written whole) fetches only the chunks whose
key-group range ``[lo, hi]`` covers the key's group, along the chain (the snapshot or
version 1, then the deltas above it), verifies them against the checksums the manifests
give, and folds them oldest first: a put replaces, a delete removes (the rule every restore
applies, core/fold.py). Every group the fetched chunks hold whole (not only the one asked
for) is folded and kept in a bounded LRU of decoded key groups, so the next read of a key of
any of them costs a dictionary look-up.

A point read (``get``) of a key whose group is not cached reads blocks instead, where it can:
when every chunk along the chain (down to the newest snapshot) that covers the group is
blocked (core/chunk.py, written since 0.3.0), it fetches, of each such chunk at once, its
index and then the one block the key can be in, each by range and verified
(net/reads.read_by_blocks), and the newest manifest naming the key decides. A cold read
costs two rounds of small fetches, not the chunks of a whole group; indexes and blocks are
cached too. ``get_many`` and iteration load whole
groups, as before (many keys of a group are cheaper fetched at once).

Iteration streams the version by key-group ranges, one range of chunks at a time: at most the
chunks of the range being folded (and those that reach past it into the next) are held decoded,
besides the bounded cache, which a scan does not fill (it would evict the point reads' groups).

:class:`AsyncLazyState` is the asyncio form; :class:`LazyState`, what ``RingClient.open`` gives,
is a read-only ``collections.abc.Mapping[bytes, bytes]`` over it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    ValuesView,
)
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import xxhash

from statestore.core.cache import ROW_COST, ChunkCache
from statestore.core.chunk import MAX_CHUNK_RAW, decode_chunk, key_group
from statestore.core.errors import (
    CorruptChunk,
    InvalidRequest,
    MalformedData,
    NodeUnavailable,
    NotFound,
    StateStoreError,
    VersionNotFound,
)
from statestore.core.fold import Row, apply
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Head, Manifest
from statestore.net.quorate import gather_all
from statestore.net.reads import BlockPath, ReadStats, block_path, lookup_fits, read_by_blocks
from statestore.wire.bodies import (
    MAX_LOOKUP_INDEX_BYTES,
    MAX_LOOKUP_KEY_BYTES,
    MAX_LOOKUP_KEYS,
    MAX_LOOKUP_PARTS,
)

__all__ = ["DEFAULT_OPEN_CACHE", "AsyncLazyState", "ChunkFetch", "LazyState"]

T = TypeVar("T")

DEFAULT_OPEN_CACHE = 64 * 1024 * 1024
# A group known to hold no row, still worth remembering (it was fetched to learn that).
EMPTY_GROUP_COST = 64
# Key groups whose point-read path an opened state remembers (a few hundred bytes each).
PATHS_KEPT = 4096
# Keys in one lookup that point reads share (get's): a reader waits for its whole lookup,
# which the node reads 16 keys at a time.
SHARED_LOOKUP_KEYS = 64
_UNSEEN: Any = object()

Split = dict[int, list[Row]]  # a decoded chunk's rows by key group (None values: deletes)
Folded = dict[int, dict[bytes, bytes]]  # key group -> its rows
# a group load under way: the chain it was planned on, its groups lo..hi, the load
_Loading = tuple[tuple[Manifest, ...], int, int, "asyncio.Future[Folded]"]
# Fetches one chunk of the store (version, ref), verified against ref's checksum, counting
# what it fetched in the stats (the client's: net/reads.fetch_chunk on its ring view).
ChunkFetch = Callable[[int, ChunkRef, ReadStats], Awaitable[bytes]]
# Fetches bytes (offset, length) of one chunk, verified against the checksum given (the
# client's: net/reads.fetch_part).
PartFetch = Callable[[int, ChunkRef, tuple[int, int], int, ReadStats], Awaitable[bytes]]
# Asks one node for the values of keys along a block path (the client's: net/reads.lookup_keys).
Lookup = Callable[[BlockPath, Sequence[bytes], ReadStats], Awaitable[list[bytes | None]]]
# Reads the opened version's chain of manifests again (the client's: net/reads.read_chain).
Rechain = Callable[[], Awaitable[Sequence[Manifest]]]
# The node a lookup anchored on chunk (version, ref) is sent to first (the client's: the
# first of the chunk's read order on its current ring view).
Route = Callable[[int, ChunkRef], str]


def _in_lookup_order(parts: Iterable[tuple[int, ChunkRef]]) -> BlockPath:
    """Chunks as a lookup takes them: newest version first, each version's in group order,
    the anchor (a snapshot chunk every key of the lookup looks into) named last."""
    return sorted(parts, key=lambda vr: (-vr[0], vr[1].lo, vr[1].hi))


def lookup_batches(
    items: Iterable[tuple[bytes, BlockPath]],
    most_keys: int = MAX_LOOKUP_KEYS,
    route: Route | None = None,
) -> list[tuple[list[bytes], BlockPath]]:
    """Keys with their (non-empty) block paths, as lookups: one per snapshot chunk the keys
    fall in (their anchor), or with ``route``, one per node their anchors are read from
    first (a lookup goes to a holder of its path's last chunk, so its keys' anchors are
    all read from that node's storage: where each key's own lookup would have gone); at
    most ``most_keys`` keys, :data:`MAX_LOOKUP_PARTS` chunks, :data:`MAX_LOOKUP_KEY_BYTES` of
    keys and :data:`MAX_LOOKUP_INDEX_BYTES` of indexes each; each with the union of its
    keys' paths, in lookup order."""
    by_anchor: dict[object, list[tuple[bytes, BlockPath]]] = {}
    routes: dict[tuple[int, str], object] = {}
    for k, path in items:
        v, ref = path[-1]
        to = routes.get((v, ref.name))
        if to is None:
            to = routes[(v, ref.name)] = (v, ref.name) if route is None else route(v, ref)
        by_anchor.setdefault(to, []).append((k, path))
    batches: list[tuple[list[bytes], BlockPath]] = []
    for keyed in by_anchor.values():
        batch: list[bytes] = []
        union: dict[tuple[int, str], tuple[int, ChunkRef]] = {}
        key_bytes = index_bytes = 0
        for k, path in keyed:
            new = {(v, r.name): (v, r) for v, r in path if (v, r.name) not in union}
            more = sum(r.index_len for v, r in new.values())
            if batch and (
                len(batch) >= most_keys
                or len(union) + len(new) > MAX_LOOKUP_PARTS
                or key_bytes + len(k) > MAX_LOOKUP_KEY_BYTES
                or index_bytes + more > MAX_LOOKUP_INDEX_BYTES
            ):
                batches.append((batch, _in_lookup_order(union.values())))
                batch, union, key_bytes, index_bytes = [], {}, 0, 0
                new = {(v, r.name): (v, r) for v, r in path}
                more = sum(r.index_len for _, r in path)
            batch.append(k)
            union.update(new)
            key_bytes += len(k)
            index_bytes += more
        batches.append((batch, _in_lookup_order(union.values())))
    return batches


def _fail(waiters: Mapping[bytes, list[asyncio.Future[bytes | None]]], exc: Exception) -> None:
    """Give ``exc`` to every waiter not answered yet."""
    for fs in waiters.values():
        for f in fs:
            if not f.done():
                f.set_exception(exc)


def _check_key(key: object) -> bytes:
    if not isinstance(key, bytes):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    return key


def _decode_split(data: bytes, groups: int, max_raw: int, what: str) -> tuple[Split, int]:
    """Decode one (verified) chunk and split its rows by key group; with the bytes that
    holding them costs (:data:`ROW_COST`)."""
    rows = decode_chunk(data, max_raw=max_raw, what=what)
    if not rows:
        return {}, 0
    keys = [k for k, _ in rows]
    gs = list(map(groups.__rmod__, map(xxhash.xxh3_64_intdigest, keys)))
    out: Split = {}
    start = 0
    # a chunk's rows come in key-group order (core/chunk.py): one run per group, sliced
    for g, run in itertools.groupby(gs):
        n = sum(1 for _ in run)
        out.setdefault(g, []).extend(rows[start : start + n])
        start += n
    cost = sum(len(k) + (len(v) if v else 0) for k, v in rows) + ROW_COST * len(rows)
    return out, cost


def _state_cost(state: Mapping[bytes, bytes]) -> int:
    if not state:
        return EMPTY_GROUP_COST
    return sum(map(len, state)) + sum(map(len, state.values())) + ROW_COST * len(state)


class _Lru:
    """Values by key, least recently used evicted first, bounded by their declared bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def get(self, key: Any) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Any, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, gone) = self._items.popitem(last=False)
            self.bytes -= gone

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)


_ABSENT = object()  # a key a point read found no value of


class _Rows:
    """The rows point reads answered, least recently used evicted first, within ``max_bytes``
    counted as key and value bytes plus :data:`ROW_COST` a row (what a row costs in a plain
    dictionary: its two bytes objects' headers and a slot; an absent key is remembered too)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._rows: dict[bytes, object] = {}  # insertion order: the least recent first

    def get(self, key: bytes) -> object | None:
        """``key``'s value, :data:`_ABSENT`, or None when not remembered."""
        value = self._rows.pop(key, None)
        if value is not None:
            self._rows[key] = value  # the most recent now
        return value

    def put(self, key: bytes, value: bytes | None) -> None:
        size = len(key) + (len(value) if value is not None else 0) + ROW_COST
        if size > self.max_bytes or key in self._rows:
            return
        self._rows[key] = _ABSENT if value is None else value
        self.bytes += size
        while self.bytes > self.max_bytes:
            old = next(iter(self._rows))
            gone = self._rows.pop(old)
            self.bytes -= len(old) + (len(gone) if isinstance(gone, bytes) else 0) + ROW_COST

    def clear(self) -> None:
        self._rows.clear()
        self.bytes = 0


@dataclass(frozen=True)
class _Span:
    """What one key group's read fetches: per manifest of the chain (oldest first), the
    chunks that cover the group; and the groups ``lo..hi`` those chunks hold whole (every
    chunk of every manifest that holds rows of them is among the fetched)."""

    parts: tuple[tuple[Manifest, tuple[ChunkRef, ...]], ...]
    lo: int
    hi: int

    def chunks(self) -> Iterator[tuple[Manifest, ChunkRef]]:
        for m, refs in self.parts:
            for ref in refs:
                yield m, ref


class AsyncLazyState:
    """A version of a store, read lazily (what :meth:`AsyncRingClient.open` returns).

    ``await view.get(key)`` (None when absent), ``await view.has(key)``,
    ``await view.get_many(keys)``, ``async for key in view`` / ``view.keys()``,
    ``view.items()`` / ``view.values()`` (async iterators streaming key-group ranges),
    ``await view.count()`` (the number of keys, by streaming). Keys are bytes (TypeError
    otherwise).

    Attributes: ``store``, ``version``, ``head`` (the version and the epoch that wrote it),
    ``positions`` (the source positions it covers), ``chain`` (its manifests, oldest first),
    ``key_groups``, ``stats`` (what it fetched: ``chunks``, ``bytes``, ``failovers``,
    ``by_node``; also as ``chunks_fetched`` / ``bytes_fetched``), ``total_chunks`` (the chunks
    of the chain, for comparison), ``cache_hits`` / ``cache_misses`` (key-group look-ups).

    Chunks are fetched through the client that opened it (its ring view, transport and
    failover): use it while the client is open. Closing it frees its cache.
    """

    def __init__(
        self,
        store: StoreId,
        chain: Sequence[Manifest],
        version: int,
        *,
        fetch: ChunkFetch,
        fetch_part: PartFetch | None = None,
        lookup: Lookup | None = None,
        route: Route | None = None,
        rechain: Rechain | None = None,
        concurrency: int = 16,
        max_chunk: int = MAX_CHUNK_RAW,
        cache_bytes: int = DEFAULT_OPEN_CACHE,
    ) -> None:
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be a non-negative int, got {cache_bytes!r}")
        top = chain[-1]
        self._fetch_bytes = fetch
        self._fetch_part = fetch_part
        # given, a point read is one lookup a node answers from its own cache and storage
        self._lookup = lookup
        self._route = route  # point reads asked together share lookups by this
        # given, a read that no holder answers reads the version's chain again: the nodes
        # may have thinned the snapshot it was opened on (:meth:`_over_chain`)
        self._rechain = rechain
        self._rechaining = asyncio.Lock()
        # reads and chain reads are numbered as they begin: a read that failed takes the
        # outcome of a chain read begun after it began (readers that failed together share
        # one), and a version found gone stays gone
        self._tick = 0
        self._rechained = -1  # the number of the last chain read
        self._gone: VersionNotFound | None = None
        self._max_chunk = max_chunk
        self.store = store
        self.version = version
        self.chain: tuple[Manifest, ...] = tuple(chain)
        self.head = Head(version, top.epoch)
        self.positions: dict[str, Any] = dict(top.positions)
        self.key_groups = top.key_groups
        self.stats = ReadStats(chain=len(self.chain))
        self.cache_hits = 0
        self.cache_misses = 0
        # within cache_bytes, a quarter each: key group -> its folded rows; chunk key -> its
        # decoded rows, for chunks that reach past the span they were fetched for; the blocks
        # and indexes of blocked chunks a point read fetched; and the rows point reads
        # answered: a hot key costs its row, not its block's ~40
        self._groups = _Lru(cache_bytes - 3 * (cache_bytes // 4))
        self._chunks = _Lru(cache_bytes // 4)
        self._blocks = ChunkCache(cache_bytes // 4)
        self._rows = _Rows(cache_bytes // 4)
        # a point read's path along the pinned chain depends on the key's group only
        # (block_path): found once per group, for up to PATHS_KEPT groups
        self._paths: dict[int, BlockPath | None] = {}
        self._fetching: dict[str, asyncio.Future[Split]] = {}
        # group loads under way: (the chain they were planned on, lo, hi, the load)
        self._loading: list[_Loading] = []
        self._sem = asyncio.Semaphore(concurrency)
        # point reads waiting for the next lookup (key -> its path, its readers), and the
        # lookups under way (referenced until they finish)
        self._queued: dict[bytes, tuple[BlockPath, list[asyncio.Future[bytes | None]]]] = {}
        self._answering: set[asyncio.Future[None]] = set()
        self._alone = 0  # lookups of a reader that found no other under way (not shared)
        self._count: int | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"AsyncLazyState({self.store}, version={self.version}, chain={len(self.chain)}, "
            f"chunks_fetched={self.stats.chunks})"
        )

    # -- metrics ----------------------------------------------------------------------------
    @property
    def chunks_fetched(self) -> int:
        return self.stats.chunks

    @property
    def bytes_fetched(self) -> int:
        return self.stats.bytes

    @property
    def total_chunks(self) -> int:
        return sum(len(m.chunks) for m in self.chain)

    @property
    def cache_bytes(self) -> int:
        """Bytes the cache holds now: decoded key groups and chunks, blocks and indexes, and
        the rows point reads answered (by the :data:`ROW_COST` rule)."""
        return self._groups.bytes + self._chunks.bytes + self._blocks.size_bytes + self._rows.bytes

    # -- lifecycle --------------------------------------------------------------------------
    async def close(self) -> None:
        """Free the cache; later reads raise RuntimeError."""
        self._release()

    def _release(self) -> None:
        self._closed = True
        self._release_caches()

    def _release_caches(self) -> None:
        self._groups.clear()
        self._chunks.clear()
        self._blocks.clear()
        self._rows.clear()

    async def __aenter__(self) -> AsyncLazyState:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the opened state of {self.store} v{self.version} is closed")
        if self._gone is not None:  # found gone: every read after fails too, cached or not
            raise VersionNotFound(str(self._gone))

    # -- the chain --------------------------------------------------------------------------
    async def _over_chain(self, read: Callable[[], Awaitable[T]]) -> T:
        """``read()`` along the chain; when no holder answers it (NodeUnavailable, NotFound)
        and the version's chain is another now, ``read()`` again along that one. The nodes
        thin the snapshots between their floor and their newest (core/retention.py): the
        one this version was opened on goes once newer ones are there, though the version
        is still retained, and its chain is then an older base and the deltas above it.
        What is cached stays: the version's rows are the same along any of its chains."""
        before, began = self.chain, self._tick
        self._tick += 1
        try:
            return await read()
        except (NodeUnavailable, NotFound) as exc:
            if not await self._chain_moved(before, began, exc):
                raise
        self._check_open()
        return await read()

    async def _chain_moved(
        self, before: tuple[Manifest, ...], began: int, failure: StateStoreError
    ) -> bool:
        """Whether the version's chain is another than ``before`` now, for a read numbered
        ``began`` that failed: read again, unless a chain read begun after that read began
        has answered (then its outcome), one at a time. Raises VersionNotFound when the
        version is gone (retention dropped it, or a newer writer committed it again since
        it was opened), StoreNotFound when the store is."""
        if self._rechain is None:
            return False
        async with self._rechaining:
            if self.chain != before:
                return True  # another reader read it again meanwhile
            if self._gone is not None:
                raise VersionNotFound(str(self._gone)) from failure
            if self._rechained > began:
                return False  # read again since this read began: the same chain
            self._rechained = self._tick
            self._tick += 1
            try:
                chain = tuple(await self._rechain())
            except VersionNotFound as exc:
                self._gone = VersionNotFound(
                    f"version {self.version} of {self.store} is no longer held ({exc}); "
                    f"a read of it had failed: {failure}"
                )
                self._release_caches()
                raise VersionNotFound(str(self._gone)) from failure
            except NotFound:
                raise  # the store is gone
            except StateStoreError:
                return False  # the ring cannot say now: the read's own failure stands
            top = chain[-1] if chain else None
            if (
                top is None
                or top.version != self.version
                or top.epoch != self.head.epoch
                or not _same_history(before, chain)
            ):
                self._gone = VersionNotFound(
                    f"version {self.version} of {self.store} at epoch {self.head.epoch} is "
                    "gone: a newer writer committed it, or a version under it, again since "
                    "it was opened (or its query was dropped and written anew); open it again"
                )
                self._release_caches()
                raise VersionNotFound(str(self._gone)) from failure
            if chain == before:
                return False
            self.chain = chain
            self.stats.chain = len(chain)
            self._paths.clear()  # a point read's path depends on the chain
            return True

    # -- point reads ------------------------------------------------------------------------
    async def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` in this version, or None if it has none."""
        _check_key(key)
        self._check_open()
        return await self._over_chain(partial(self._get, key))

    async def _get(self, key: bytes) -> bytes | None:
        g = key_group(key, self.key_groups)
        if self._groups.get(g) is None and self._fetch_part is not None:
            row = self._rows.get(key)
            if row is not None:
                return row if isinstance(row, bytes) else None
            path = self._paths.get(g, _UNSEEN)
            if path is _UNSEEN:
                path = block_path(self.chain, key)
                if len(self._paths) < PATHS_KEPT:
                    self._paths[g] = path
            if path is not None:
                self.cache_misses += 1
                value = await self._point_read(key, path)
                self._rows.put(key, value)
                return value
        return (await self._group(g)).get(key)

    async def _point_read(self, key: bytes, path: BlockPath) -> bytes | None:
        """``key``'s value read along ``path``: one lookup a node answers, or by blocks."""
        if self._lookup is not None and lookup_fits(key, path):
            if not path:
                return None
            try:
                queued = self._queued.get(key)
                if (self._queued or self._answering or self._alone) and (
                    queued is None or queued[0] == path  # not one along an older chain
                ):
                    return await self._looked_up(key, path)  # shared with the others asking
                self._alone += 1  # nothing else asked: no batch to wait for
                try:
                    async with self._sem:
                        return (await self._lookup(path, [key], self.stats))[0]
                finally:
                    self._alone -= 1
            except InvalidRequest:
                pass  # a value past a lookup's answer, a chain it refuses: by parts
        return await read_by_blocks(
            path,
            self.key_groups,
            self._part_fetch,
            self.store,
            key,
            self._blocks,
            max_raw=self._max_chunk,
        )

    def _looked_up(self, key: bytes, path: BlockPath) -> asyncio.Future[bytes | None]:
        """``key``'s value from a lookup shared with the point reads asked in the same turn
        of the event loop, while another lookup is under way (a reader that finds none
        sends its own at once: a lone reader waits for nothing): they are sent together,
        cut as :func:`lookup_batches` cuts them (at most :data:`SHARED_LOOKUP_KEYS` keys a
        lookup), when the loop next runs its callbacks, so concurrent readers pay a request
        per batch, not per key. A reader that gives up (cancelled) leaves its lookup to the
        others; one that nobody waits for any more is not sent, or is cancelled."""
        loop = asyncio.get_running_loop()
        queued = self._queued.get(key)
        if queued is None:
            queued = self._queued[key] = (path, [])
            if len(self._queued) == 1:
                loop.call_soon(self._send_queued)
        fut: asyncio.Future[bytes | None] = loop.create_future()
        queued[1].append(fut)
        return fut

    def _send_queued(self) -> None:
        queued, self._queued = self._queued, {}
        items = ((k, p) for k, (p, _) in queued.items())
        try:
            batches = lookup_batches(items, SHARED_LOOKUP_KEYS, self._route)
        except Exception as exc:  # no reader left waiting for a flush that never came
            _fail({k: fs for k, (_, fs) in queued.items()}, exc)
            return
        for keys, path in batches:
            waiters = {k: queued[k][1] for k in keys}
            task = asyncio.ensure_future(self._answer_lookup(keys, path, waiters))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
            readers = [f for fs in waiters.values() for f in fs]

            def abandoned(
                _f: object,
                task: asyncio.Future[None] = task,
                readers: list[asyncio.Future[bytes | None]] = readers,
            ) -> None:
                # every reader gave up (none waits; some cancelled): so does their lookup
                if not task.done() and all(f.done() for f in readers):
                    if any(f.cancelled() for f in readers):
                        task.cancel()

            for f in readers:
                f.add_done_callback(abandoned)

    async def _answer_lookup(
        self,
        keys: list[bytes],
        path: BlockPath,
        waiters: dict[bytes, list[asyncio.Future[bytes | None]]],
    ) -> None:
        """One lookup of ``keys``, each waiter given its key's value or the lookup's error.
        Errors that may be one key's (a value past the answer's bound, a chunk corrupt on
        every holder) are not shared: a lookup of several keys is asked again a key each;
        nor are the ring's errors of one of its snapshot chunks (its holders down): a
        lookup of several is asked again a chunk each."""
        lookup = self._lookup
        assert lookup is not None
        try:
            async with self._sem:
                keys = [k for k in keys if not all(f.done() for f in waiters[k])]
                if not keys:
                    return  # every reader gave up while it queued
                values = await lookup(path, keys, self.stats)
            if len(values) != len(keys):
                raise MalformedData(f"a lookup of {len(keys)} keys answered {len(values)} values")
            for k, v in zip(keys, values, strict=True):
                for f in waiters[k]:
                    if not f.done():
                        f.set_result(v)
        except (InvalidRequest, CorruptChunk) as exc:
            if len(keys) == 1:
                _fail(waiters, exc)
                return
            # a key a lookup, along its own path (the batch's union is more than it needs)
            await asyncio.gather(
                *(
                    self._answer_lookup([k], block_path(self.chain, k) or path, {k: waiters[k]})
                    for k in keys
                )
            )
        except StateStoreError as exc:  # no holder answers, not found, busy, ...
            # one snapshot chunk's (its holders down, say): a lookup of several is asked
            # again a chunk a lookup, so the keys of the others get their values
            own = [(k, block_path(self.chain, k) or path) for k in keys]
            by_anchor = lookup_batches(own, SHARED_LOOKUP_KEYS)
            if len(by_anchor) == 1:
                _fail(waiters, exc)  # the one chunk's error: every reader's, as alone
                return
            await asyncio.gather(
                *(self._answer_lookup(ks, p, {k: waiters[k] for k in ks}) for ks, p in by_anchor)
            )
        except Exception as exc:  # not the ring's answer (a bug, a bad value): shared
            _fail(waiters, exc)
        except BaseException:  # cancelled (every reader gave up, or the loop is closing)
            for fs in waiters.values():
                for f in fs:
                    f.cancel()
            raise
        finally:  # nothing left waiting forever, whatever went wrong above
            if any(not f.done() for fs in waiters.values() for f in fs):
                _fail(waiters, RuntimeError(f"a lookup of {self.store} ended without an answer"))

    def _part_fetch(
        self, version: int, ref: ChunkRef
    ) -> Callable[[tuple[int, int], int], Awaitable[bytes]]:
        """Fetches parts of chunk ``ref`` of ``version`` (within the client's concurrency)."""
        part = self._fetch_part
        assert part is not None

        async def fetch(span: tuple[int, int], expected: int) -> bytes:
            async with self._sem:
                return await part(version, ref, span, expected, self.stats)

        return fetch

    async def has(self, key: bytes) -> bool:
        """Whether ``key`` has a value in this version."""
        return await self.get(key) is not None

    async def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """The values of those of ``keys`` present in this version. The key groups not in the
        cache are fetched together: one span of chunks per range of groups, all at once
        (within the client's ``concurrency``)."""
        wanted = [_check_key(k) for k in keys]
        self._check_open()
        return await self._over_chain(partial(self._get_many, wanted))

    async def _get_many(self, wanted: list[bytes]) -> dict[bytes, bytes]:
        looked_up: dict[bytes, bytes] = {}
        if self._lookup is not None:
            looked_up, wanted = await self._lookup_many(wanted)
        by_group: dict[int, list[bytes]] = {}
        for k in wanted:
            by_group.setdefault(key_group(k, self.key_groups), []).append(k)
        found: dict[int, Mapping[bytes, bytes]] = {}
        missing: list[int] = []
        for g in sorted(by_group):
            hit = self._cached(g)
            if hit is None:
                missing.append(g)
            else:
                found[g] = hit
        # plan the spans: a group that an earlier span holds whole rides along with it
        loads: list[tuple[int, int, Awaitable[dict[int, dict[bytes, bytes]]]]] = []
        for g in missing:
            if any(lo <= g <= hi for lo, hi, _ in loads):
                continue
            lo, hi, fut = self._span_load(g)
            loads.append((lo, hi, fut))
        results = await asyncio.gather(*(fut for _, _, fut in loads))
        for g in missing:
            for (lo, hi, _), groups in zip(loads, results, strict=True):
                if lo <= g <= hi:
                    found[g] = groups[g]
                    break
        return looked_up | {
            k: v for g, ks in by_group.items() for k in ks if (v := found[g].get(k)) is not None
        }

    async def _lookup_many(self, keys: list[bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """Of ``keys``, the values lookups found (absent keys left out), and the keys left
        to group loads (a group cached, a chunk written whole, a chain too long for one
        lookup). One lookup per snapshot chunk the keys fall in, at most
        :data:`MAX_LOOKUP_KEYS` keys and :data:`MAX_LOOKUP_PARTS` chunks each, all at once
        (within the client's ``concurrency``)."""
        assert self._lookup is not None
        lookup = self._lookup
        rest: list[bytes] = []
        lookable: list[tuple[bytes, BlockPath]] = []
        for k in dict.fromkeys(keys):
            if self._groups.get(key_group(k, self.key_groups)) is not None:
                rest.append(k)
                continue
            path = block_path(self.chain, k)
            if path is None or not lookup_fits(k, path):
                rest.append(k)
            elif path:  # else no chunk has a row of its group: absent
                lookable.append((k, path))
        batches = lookup_batches(lookable)

        async def one(batch: list[bytes], path: BlockPath) -> list[bytes | None]:
            try:
                async with self._sem:
                    return await lookup(path, batch, self.stats)
            except InvalidRequest:  # values past a lookup's answer, a chain it refuses
                rest.extend(batch)  # the keys load by groups
                return [None] * len(batch)

        answers = await gather_all(one(b, p) for b, p in batches)  # a failure stops the rest
        found = {
            k: v
            for (batch, _), values in zip(batches, answers, strict=True)
            for k, v in zip(batch, values, strict=True)
            if v is not None
        }
        return found, rest

    def _cached(self, g: int) -> dict[bytes, bytes] | None:
        hit: dict[bytes, bytes] | None = self._groups.get(g)
        if hit is None:
            self.cache_misses += 1
        else:
            self.cache_hits += 1
        return hit

    async def _group(self, g: int) -> Mapping[bytes, bytes]:
        hit = self._cached(g)
        if hit is not None:
            return hit
        _, _, fut = self._span_load(g)
        return (await fut)[g]

    def _span_load(self, g: int) -> tuple[int, int, asyncio.Future[dict[int, dict[bytes, bytes]]]]:
        """The load of the span of group ``g``: one already under way that holds ``g`` whole
        (shared: concurrent reads of one span fetch it once), else a new one."""
        for chain, lo, hi, fut in self._loading:
            # a load planned on a chain read before the last one may fail on a chunk the
            # nodes dropped: a reader that read the chain again does not wait on it
            if chain is self.chain and lo <= g <= hi:
                return lo, hi, _shared(fut)
        span = self._span(g)
        task = asyncio.ensure_future(self._load(span))
        entry = (self.chain, span.lo, span.hi, task)
        self._loading.append(entry)
        task.add_done_callback(lambda _t: self._loading.remove(entry))
        return span.lo, span.hi, _shared(task)

    async def _load(self, span: _Span) -> dict[int, dict[bytes, bytes]]:
        """Fetch a span's chunks (at once), fold the groups it holds whole, cache them."""
        splits = await asyncio.gather(*(self._chunk(m, ref, span) for m, ref in span.chunks()))
        folded = _fold(span, splits, range(span.lo, span.hi + 1))
        for g, state in folded.items():
            self._groups.put(g, state, _state_cost(state))
        return folded

    def _span(self, g: int) -> _Span:
        """The chunks of the chain to fetch for group ``g``, and the groups they hold whole."""
        lo, hi = 0, self.key_groups - 1
        parts = []
        for m in self.chain:
            if m.key_groups != self.key_groups:
                # a manifest cut by another number of key groups (a writer with another
                # key_groups option): its chunk ranges say nothing of ours, take them all
                parts.append((m, tuple(c for c in m.chunks if c.rows)))
                continue
            refs = []
            for c in m.chunks:
                if not c.rows:  # an empty commit's chunk covers every group, holds none
                    continue
                if c.lo <= g <= c.hi:
                    refs.append(c)
                elif c.hi < g:
                    lo = max(lo, c.hi + 1)
                else:
                    hi = min(hi, c.lo - 1)
            parts.append((m, tuple(refs)))
        return _Span(tuple(parts), lo, hi)

    async def _chunk(self, m: Manifest, ref: ChunkRef, span: _Span | None = None) -> Split:
        """One chunk of the chain, decoded and split by key group: from the cache of wide
        chunks, from a fetch already under way, else fetched (verified against its checksum,
        from the first holder that gives good bytes) and decoded off the event loop."""
        ckey = chunk_key(self.store, m.version, ref.name)
        hit: Split | None = self._chunks.get(ckey)
        if hit is not None:
            return hit
        fut = self._fetching.get(ckey)
        if fut is None:
            fut = asyncio.ensure_future(self._fetch(m, ref, ckey, span))
            self._fetching[ckey] = fut
            fut.add_done_callback(lambda _f: self._fetching.pop(ckey, None))
        return await _shared(fut)

    async def _fetch(self, m: Manifest, ref: ChunkRef, ckey: str, span: _Span | None) -> Split:
        async with self._sem:
            data = await self._fetch_bytes(m.version, ref, self.stats)
        split, cost = await asyncio.get_running_loop().run_in_executor(
            None, partial(_decode_split, data, self.key_groups, self._max_chunk, ref.name)
        )
        # a chunk that reaches past the span it was fetched for holds part of the next one:
        # kept (bounded) so that the next span's read does not fetch it again
        if span is not None and (
            m.key_groups != self.key_groups or ref.lo < span.lo or ref.hi > span.hi
        ):
            self._chunks.put(ckey, split, cost)
        return split

    # -- streaming --------------------------------------------------------------------------
    async def spans(self) -> AsyncIterator[dict[bytes, bytes]]:
        """The version's rows, one range of key groups at a time, in key-group order: each
        a dict of the rows of the groups the chunks fetched for it hold whole."""
        self._check_open()
        scan = _Scan(self)
        while True:
            rows = await scan.next()
            if rows is None:
                return
            yield rows

    async def items(self) -> AsyncIterator[tuple[bytes, bytes]]:
        async for rows in self.spans():
            for kv in rows.items():
                yield kv

    async def keys(self) -> AsyncIterator[bytes]:
        async for rows in self.spans():
            for k in rows:
                yield k

    async def values(self) -> AsyncIterator[bytes]:
        async for rows in self.spans():
            for v in rows.values():
                yield v

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.keys()

    async def count(self) -> int:
        """The number of keys of this version (streamed the first time, or known from a
        whole scan, then remembered: the version is pinned)."""
        if self._count is None:
            n = 0
            async for rows in self.spans():
                n += len(rows)
            self._count = n
        return self._count


def _shared(fut: asyncio.Future[T]) -> asyncio.Future[T]:
    """Await ``fut`` without a waiter's cancellation cancelling it for the others."""
    return asyncio.shield(fut)


def _fold(span: _Span, splits: Sequence[Split], groups: range) -> dict[int, dict[bytes, bytes]]:
    """The folded rows of ``groups`` (all held whole by ``span``'s chunks, whose decoded
    rows ``splits`` are, in the order of :meth:`_Span.chunks`): oldest manifest first."""
    out: dict[int, dict[bytes, bytes]] = {g: {} for g in groups}
    for split in splits:
        for g, rows in split.items():
            state = out.get(g)
            if state is not None:
                apply(state, rows)
    return out


def _same_content(a: Manifest, b: Manifest) -> bool:
    """Whether two manifests of a version are the same commit: kind, epoch, lineage, key
    groups and chunk checksums (a chunk's name may differ: a whole snapshot's ``s`` names
    become ``w`` ones, node/replica.py)."""
    return (a.version, a.kind, a.epoch, a.base_epoch, a.key_groups) == (
        b.version,
        b.kind,
        b.epoch,
        b.base_epoch,
        b.key_groups,
    ) and [c.checksum for c in a.chunks] == [c.checksum for c in b.chunks]


def _same_history(before: Sequence[Manifest], chain: Sequence[Manifest]) -> bool:
    """Whether ``chain``, read again for the version a state was opened on, may hold the same
    state as ``before``: every version both name is the same commit where both name the same
    kind (a delta, a snapshot), and of the same epoch where one names a snapshot folded from
    the other's deltas. What may differ is where the chain starts: the nodes thinned the
    snapshot it started at, so it starts at an older one now, or folded a newer one. (A
    folded snapshot cannot be checked against the deltas it was folded from: a query dropped
    and written anew at the same epoch, whose newest version is a delta where the state was
    opened on a snapshot, is not told apart.)"""
    if not chain or not before:
        return False
    had: dict[int, list[Manifest]] = {}
    for m in before:
        had.setdefault(m.version, []).append(m)
    for m in chain:
        for o in had.get(m.version, ()):
            if o.kind == m.kind and not _same_content(o, m):
                return False
            if o.epoch != m.epoch:
                return False
    return True


class _Scan:
    """A cursor over the version by key-group ranges (:meth:`AsyncLazyState.spans`): each
    step fetches the span of the first group not yet given and gives the groups it holds
    whole. Decoded chunks that reach past a step are held for the next and let go once the
    scan is past them; cached groups are given from the cache; the scan fills no cache."""

    def __init__(self, lazy: AsyncLazyState) -> None:
        self.lazy = lazy
        self.next_group = 0
        self.rows = 0
        # decoded chunks that reach past the last step (None: the scan is over)
        self.held: dict[tuple[int, str], tuple[ChunkRef, Split]] | None = {}

    async def next(self) -> dict[bytes, bytes] | None:
        lazy = self.lazy
        lazy._check_open()
        g = self.next_group
        if g >= lazy.key_groups:
            if self.held is not None:  # the first time past the end: the count is known
                lazy._count = self.rows
            self.held = None
            return None
        hit = lazy._groups.get(g)
        if hit is not None:
            self.next_group = g + 1
            self.rows += len(hit)
            return dict(hit)
        return await lazy._over_chain(partial(self._step, g))

    async def _step(self, g: int) -> dict[bytes, bytes]:
        """The rows of the groups the span of ``g`` holds whole."""
        lazy = self.lazy
        span = lazy._span(g)
        held = self.held or {}

        async def one(m: Manifest, ref: ChunkRef) -> Split:
            got = held.get((m.version, ref.name))
            if got is not None:
                return got[1]
            return await lazy._chunk(m, ref)

        splits = await asyncio.gather(*(one(m, ref) for m, ref in span.chunks()))
        folded = _fold(span, splits, range(g, span.hi + 1))
        self.next_group = span.hi + 1
        self.held = {
            (m.version, ref.name): (ref, split)
            for (m, ref), split in zip(span.chunks(), splits, strict=True)
            if m.key_groups != lazy.key_groups or ref.hi > span.hi
        }
        out: dict[bytes, bytes] = {}
        for rows in folded.values():
            out.update(rows)
        self.rows += len(out)
        return out


class LazyState(Mapping[bytes, bytes]):
    """A version of a store as a read-only ``Mapping[bytes, bytes]``, read lazily (what
    :meth:`RingClient.open` returns; :class:`AsyncLazyState` does the reading).

    ``state[key]`` (KeyError when absent), ``state.get(key)``, ``key in state``,
    ``iter(state)`` / ``items()`` / ``values()`` (streamed by key-group ranges), ``len(state)``
    (streamed once, then remembered), ``get_many(keys)``. Keys are bytes (TypeError
    otherwise). ``version``, ``head``, ``positions``, ``stats``, ``chunks_fetched``,
    ``bytes_fetched``, ``total_chunks`` as :class:`AsyncLazyState`'s. ``close()`` (or ``with``)
    frees its cache.
    """

    def __init__(
        self, lazy: AsyncLazyState, call: Callable[[Coroutine[Any, Any, Any]], Any]
    ) -> None:
        self._lazy = lazy
        self._call = call
        self.store = lazy.store
        self.version = lazy.version
        self.head = lazy.head
        self.positions = lazy.positions
        self.key_groups = lazy.key_groups

    def __repr__(self) -> str:
        return (
            f"LazyState({self.store}, version={self.version}, chain={len(self._lazy.chain)}, "
            f"chunks_fetched={self.chunks_fetched})"
        )

    @property
    def lazy(self) -> AsyncLazyState:
        """The asyncio view this one runs (on the client's loop thread)."""
        return self._lazy

    @property
    def stats(self) -> ReadStats:
        return self._lazy.stats

    @property
    def chunks_fetched(self) -> int:
        return self._lazy.chunks_fetched

    @property
    def bytes_fetched(self) -> int:
        return self._lazy.bytes_fetched

    @property
    def total_chunks(self) -> int:
        return self._lazy.total_chunks

    @property
    def cache_hits(self) -> int:
        return self._lazy.cache_hits

    @property
    def cache_misses(self) -> int:
        return self._lazy.cache_misses

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's loop thread; a closed view (or client) raises
        RuntimeError without leaving it unawaited."""
        try:
            self._lazy._check_open()
            result: T = self._call(coro)
        except BaseException:
            coro.close()
            raise
        return result

    def __getitem__(self, key: bytes) -> bytes:
        value: bytes | None = self._run(self._lazy.get(_check_key(key)))
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return bool(self._run(self._lazy.has(_check_key(key))))

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """:meth:`AsyncLazyState.get_many`: the values of those of ``keys`` present."""
        return dict(self._run(self._lazy.get_many(list(keys))))

    def _spans(self) -> Iterator[dict[bytes, bytes]]:
        self._lazy._check_open()
        scan = _Scan(self._lazy)
        while True:
            rows: dict[bytes, bytes] | None = self._run(scan.next())
            if rows is None:
                return
            yield rows

    def __iter__(self) -> Iterator[bytes]:
        for rows in self._spans():
            yield from rows

    def __len__(self) -> int:
        return int(self._run(self._lazy.count()))

    def items(self) -> ItemsView[bytes, bytes]:
        return _StreamedItems(self)

    def values(self) -> ValuesView[bytes]:
        return _StreamedValues(self)

    def close(self) -> None:
        """Free the cache (also after the client was closed); later reads raise
        RuntimeError."""
        self._lazy._release()

    def __enter__(self) -> LazyState:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _StreamedItems(ItemsView[bytes, bytes]):
    """``LazyState.items()``: pairs streamed span by span (not a look-up per key)."""

    _mapping: LazyState

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        for rows in self._mapping._spans():
            yield from rows.items()


class _StreamedValues(ValuesView[bytes]):
    """``LazyState.values()``: values streamed span by span."""

    _mapping: LazyState

    def __iter__(self) -> Iterator[bytes]:
        for rows in self._mapping._spans():
            yield from rows.values()
