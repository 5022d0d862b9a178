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
    return sum(len(k) + len(v or b"") for k, v in rows.items()) + ROW_COST * len(rows)


class ChunkCache:
    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        # a chunk's or block's rows by its key, a blocked chunk's index by the chunk's key + "#i"
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        """The bytes it holds now (as declared by what was put)."""
        return self._bytes

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def get(self, key: str) -> dict[bytes, bytes | None] | None:
        return cast("dict[bytes, bytes | None] | None", self._get(key))

    def get_index(self, chunk: str) -> BlockIndex | None:
        return cast("BlockIndex | None", self._get(chunk + "#i"))

    def put_index(self, chunk: str, index: BlockIndex) -> None:
        self._put(chunk + "#i", index, index.nbytes)

    def _get(self, key: str) -> object | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        value: object = item[0]
        return value

    def put(self, key: str, rows: dict[bytes, bytes | None], size: int) -> None:
        self._put(key, rows, size)

    def _put(self, key: str, value: object, size: int) -> None:
        if size > self.max_bytes or key in self._items:
            return
        self._items[key] = (value, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self._bytes -= old
