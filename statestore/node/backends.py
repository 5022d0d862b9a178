"""Byte backends of a node's storage, chosen by URL: ``memory://`` (tests) or
``lmdb:///path/to/dir`` (nodes): a tiny key-value interface and nothing about stores.

LMDB is the default on nodes because a write transaction is atomic over many keys and, opened
with ``sync=True``, is fsynced before ``commit`` returns: so a chunk or a manifest is durable
before the node acknowledges it. Reads are zero-copy from the map and need no background
threads.

A write LMDB cannot complete (its map full, the disk full or failing at commit: py-lmdb raises
``lmdb.Error``, not OSError) is InsufficientStorage (507) here, at the storage boundary, with
the LMDB error as its cause; the node counts it and turns read-only (Node.write). The map is
64 GiB; ``lmdb:///dir?map_size=BYTES`` sets another (tests fill a small one).
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from urllib.parse import parse_qs, urlparse

from statestore.core.errors import InsufficientStorage

__all__ = ["DEFAULT_MAP_SIZE", "Backend", "LmdbBackend", "MemoryBackend", "open_backend"]

DEFAULT_MAP_SIZE = 64 * 2**30


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
    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE) -> None:
        import lmdb

        os.makedirs(path, exist_ok=True)
        self._lmdb = lmdb
        self._path = path
        self._map_size = map_size
        self._env = lmdb.open(
            path, map_size=map_size, sync=True, metasync=True, max_readers=256, readahead=False
        )

    def get(self, key: bytes) -> bytes | None:
        with self._env.begin() as txn:
            value: bytes | None = txn.get(key)
            return value

    def write(self, puts: Mapping[bytes, bytes], deletes: Sequence[bytes] = ()) -> None:
        try:
            with self._env.begin(write=True) as txn:  # aborted, nothing written, if it raises
                for k in deletes:
                    txn.delete(k)
                for k, v in puts.items():
                    txn.put(k, v)
        except self._lmdb.MapFullError as exc:
            raise InsufficientStorage(
                f"storage under {self._path} is full: its LMDB map of {self._map_size} bytes "
                f"is used up ({exc}); the node is read-only: free space with retention or "
                "statestore drop, or move the node to a larger map (lmdb://DIR?map_size=BYTES)"
            ) from exc
        except self._lmdb.Error as exc:
            raise InsufficientStorage(
                f"storage write under {self._path} failed ({type(exc).__name__}: {exc}): the "
                "disk is full or failing; the node is read-only until a write succeeds: free "
                "space on the data dir's file system or check the disk"
            ) from exc

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
    """``memory://`` or ``lmdb:///absolute/dir`` (or a bare directory path);
    ``lmdb:///dir?map_size=BYTES`` sets the LMDB map's size (default 64 GiB)."""
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        return MemoryBackend()
    if parsed.scheme == "lmdb":
        sizes = parse_qs(parsed.query).get("map_size", [])
        if sizes:
            if len(sizes) != 1 or not sizes[0].isascii() or not sizes[0].isdigit():
                raise ValueError(f"storage URL {url!r}: map_size must be a number of bytes")
            return LmdbBackend(parsed.path, int(sizes[0]))
        return LmdbBackend(parsed.path)
    if parsed.scheme == "":
        return LmdbBackend(url)
    raise ValueError(f"storage URL {url!r}: use memory:// or lmdb:///path")
