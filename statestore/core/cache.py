"""An LRU of decoded chunks, blocks and block indexes (pure). Chunks never change (the
checksum is in the name), so nothing cached can be stale; the cache only bounds memory."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, cast

from statestore.core.chunk import BlockIndex

__all__ = ["ROW_COST", "ChunkCache", "rows_cost"]

# What one decoded row costs in memory besides its key and value bytes: two bytes objects'
# headers (33 bytes each) and a dictionary slot.
ROW_COST = 100


def rows_cost(rows: Mapping[bytes, bytes | None]) -> int:
    """The bytes decoded rows take, by the :data:`ROW_COST` rule."""
    values = sum(map(len, filter(None, rows.values())))  # builtins: ~5x a generator's speed
    return sum(map(len, rows)) + values + ROW_COST * len(rows)


class ChunkCache:
    """Decoded chunks, blocks and block indexes by key, up to ``max_bytes`` (as declared by
    what was put). Every key starts with its chunk's key, ``query/...``: past its bytes the
    cache drops the least recently used item *of the query holding the most*, so that one
    query's readers (a scan, a tenant's flood of lookups on a node's shared cache) cannot push
    another query's working set below an equal share of it (max-min fairness); with one query
    it is a plain LRU."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        # per query, oldest first: a chunk's or block's rows by its key, a blocked chunk's
        # index by the chunk's key + "#i"
        self._items: dict[str, OrderedDict[str, tuple[Any, int]]] = {}
        self._held: dict[str, int] = {}  # bytes per query
        self._forgotten: dict[str, int] = {}  # per query, how many times it was forgotten
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        """The bytes it holds now (as declared by what was put)."""
        return self._bytes

    def held_by(self, query: str) -> int:
        """The bytes it holds of ``query``'s chunks."""
        return self._held.get(query, 0)

    def forget(self, query: str) -> None:
        """Drop everything of ``query`` (its chunks were purged: a drop), and count it
        (:meth:`generation`), so that a reader that began before puts nothing back."""
        self._bytes -= self._held.pop(query, 0)
        self._items.pop(query, None)
        self._forgotten[query] = self._forgotten.get(query, 0) + 1

    def generation(self, query: str) -> int:
        """How many times ``query`` was forgotten: a reader that saw another number when it
        began must not put what it read (it may be what was purged)."""
        return self._forgotten.get(query, 0)

    def clear(self) -> None:
        self._items.clear()
        self._held.clear()
        self._bytes = 0

    def get(self, key: str) -> dict[bytes, bytes | None] | None:
        return cast("dict[bytes, bytes | None] | None", self._get(key))

    def get_index(self, chunk: str) -> BlockIndex | None:
        return cast("BlockIndex | None", self._get(chunk + "#i"))

    def put_index(self, chunk: str, index: BlockIndex) -> None:
        self._put(chunk + "#i", index, index.nbytes)

    def _get(self, key: str) -> object | None:
        lru = self._items.get(_query(key))
        item = lru.get(key) if lru is not None else None
        if item is None:
            self.misses += 1
            return None
        assert lru is not None
        lru.move_to_end(key)
        self.hits += 1
        value: object = item[0]
        return value

    def put(self, key: str, rows: dict[bytes, bytes | None], size: int) -> None:
        self._put(key, rows, size)

    def _put(self, key: str, value: object, size: int) -> None:
        if size > self.max_bytes:
            return
        query = _query(key)
        lru = self._items.setdefault(query, OrderedDict())
        if key in lru:
            return
        lru[key] = (value, size)
        self._held[query] = self._held.get(query, 0) + size
        self._bytes += size
        while self._bytes > self.max_bytes:
            most = max(self._held, key=self._held.__getitem__)
            victims = self._items[most]
            _, (_, old) = victims.popitem(last=False)
            self._held[most] -= old
            self._bytes -= old
            if not victims:
                del self._items[most], self._held[most]


def _query(key: str) -> str:
    """The query a cache key's chunk belongs to (its first path segment)."""
    return key.split("/", 1)[0]
