"""Byte backends of a node's storage, chosen by URL: ``memory://`` (tests) or
``lmdb:///path/to/dir`` (nodes): a tiny key-value interface and nothing about stores.

LMDB is the default on nodes because a write transaction is atomic over many keys and, opened
with ``sync=True``, is fsynced before ``commit`` returns: so a chunk or a manifest is durable
before the node acknowledges it. Reads are zero-copy from the map and need no background
threads.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from urllib.parse import urlparse

__all__ = ["Backend", "LmdbBackend", "MemoryBackend", "open_backend"]


class Backend(ABC):
    """Ordered bytes-to-bytes map with atomic, durable batches."""

    @abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    @abstractmethod
    def write(self, puts: Mapping[bytes, bytes], deletes: Sequence[bytes] = ()) -> None:
        """Apply puts and deletes atomically; durable when it returns."""

    @abstractmethod
    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items whose key starts with ``prefix``, in key order (a snapshot)."""

    @abstractmethod
    def scan_keys(self, prefix: bytes) -> list[bytes]: ...

    def sizes(self, keys: Sequence[bytes]) -> dict[bytes, int | None]:
        """The size of each key's value (None: absent), without keeping the values."""
        out: dict[bytes, int | None] = {}
        for k in keys:
            v = self.get(k)
            out[k] = None if v is None else len(v)
        return out

    def scan_sizes(self, prefix: bytes) -> list[tuple[bytes, int]]:
        """(key, size of its value) of every key starting with ``prefix``."""
        return [(k, len(v)) for k, v in self.scan(prefix)]

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class MemoryBackend(Backend):
    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def write(self, puts: Mapping[bytes, bytes], deletes: Sequence[bytes] = ()) -> None:
        with self._lock:
            for k in deletes:
                self._data.pop(k, None)
            self._data.update(puts)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        with self._lock:
            items = sorted((k, v) for k, v in self._data.items() if k.startswith(prefix))
        return iter(items)

    def scan_keys(self, prefix: bytes) -> list[bytes]:
        with self._lock:
            return sorted(k for k in self._data if k.startswith(prefix))


class LmdbBackend(Backend):
    def __init__(self, path: str, map_size: int = 64 * 2**30) -> None:
        import lmdb

        os.makedirs(path, exist_ok=True)
        self._env = lmdb.open(
            path, map_size=map_size, sync=True, metasync=True, max_readers=256, readahead=False
        )

    def get(self, key: bytes) -> bytes | None:
        with self._env.begin() as txn:
            value: bytes | None = txn.get(key)
            return value

    def write(self, puts: Mapping[bytes, bytes], deletes: Sequence[bytes] = ()) -> None:
        with self._env.begin(write=True) as txn:
            for k in deletes:
                txn.delete(k)
            for k, v in puts.items():
                txn.put(k, v)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        out = []
        with self._env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k, v in cur:
                    if not k.startswith(prefix):
                        break
                    out.append((bytes(k), bytes(v)))
        return iter(out)

    def scan_keys(self, prefix: bytes) -> list[bytes]:
        out = []
        with self._env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(prefix):
                        break
                    out.append(bytes(k))
        return out

    def sizes(self, keys: Sequence[bytes]) -> dict[bytes, int | None]:
        out: dict[bytes, int | None] = {}
        with self._env.begin(buffers=True) as txn:  # views into the map: nothing copied
            for k in keys:
                v = txn.get(k)
                out[k] = None if v is None else len(v)
        return out

    def scan_sizes(self, prefix: bytes) -> list[tuple[bytes, int]]:
        out = []
        with self._env.begin(buffers=True) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k, v in cur:
                    key = bytes(k)
                    if not key.startswith(prefix):
                        break
                    out.append((key, len(v)))
        return out

    def close(self) -> None:
        self._env.close()


def open_backend(url: str) -> Backend:
    """``memory://`` or ``lmdb:///absolute/dir`` (or a bare directory path)."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryBackend()
    if parsed.scheme == "lmdb":
        return LmdbBackend(parsed.path)
    if parsed.scheme == "":
        return LmdbBackend(url)
    raise ValueError(f"storage URL {url!r}: use memory:// or lmdb:///path")
