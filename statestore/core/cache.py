"""An LRU of decoded chunks (pure). Chunks never change (the checksum is in the name), so a
cached chunk can never be stale; the cache only bounds memory, by raw bytes."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["ChunkCache"]


class ChunkCache:
    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[dict[bytes, bytes | None], int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[bytes, bytes | None] | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item[0]

    def put(self, key: str, rows: dict[bytes, bytes | None], size: int) -> None:
        if size > self.max_bytes or key in self._items:
            return
        self._items[key] = (rows, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self._bytes -= old
