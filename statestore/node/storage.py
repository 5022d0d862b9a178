"""Node-local storage: a tiny key-value interface, two backends, and the store layout on top.

Backends are chosen by URL: ``memory://`` (tests) or ``lmdb:///path/to/dir`` (nodes). LMDB
is the default on nodes because a write transaction is atomic over many keys and, opened with
``sync=True``, is fsynced before ``commit`` returns: so a chunk or a manifest is durable before
the node acknowledges it. Reads are zero-copy from the map and need no background threads.

Keys:  ``c:<store>/<version>/<chunk name>``  chunk bytes (checksum in the name, re-verified on read)
       ``m:<store>/<version, 20 digits>/<kind>``  manifest (msgpack)
       ``h:<store>``                         head, msgpack ``[epoch, version]``
       ``f:<store>``                         retention floor: versions below it are gone
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from urllib.parse import urlparse

from statestore.core.chunk import verify
from statestore.core.errors import CorruptChunk, StaleEpoch, VersionConflict
from statestore.core.ids import StoreId, parse_chunk_key
from statestore.core.manifest import Head, Manifest
from statestore.wire.head import decode_stored, encode_stored
from statestore.wire.manifest import decode_manifest, encode_manifest

__all__ = ["Backend", "LmdbBackend", "MemoryBackend", "NodeStore", "open_backend"]


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


def _mkey(store: StoreId, version: int, kind: str) -> bytes:
    return f"m:{store.path}/{version:020d}/{kind}".encode()


class NodeStore:
    """The node's chunks, manifests, heads and floors over one backend.

    Writes are meant to run on a single writer thread: the fencing check and the write happen
    in one call, so two manifests for the same store cannot interleave.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # -- chunks --------------------------------------------------------------------------
    def put_chunk(self, key: str, data: bytes) -> None:
        _, _, name = parse_chunk_key(key)
        verify(data, int(name.split("-", 1)[1], 16), key)
        self.backend.write({b"c:" + key.encode(): data})

    def get_chunk(self, key: str) -> bytes | None:
        """The chunk's bytes, re-verified; raises CorruptChunk if they rotted on disk."""
        _, _, name = parse_chunk_key(key)
        data = self.backend.get(b"c:" + key.encode())
        if data is not None:
            verify(data, int(name.split("-", 1)[1], 16), key)
        return data

    def has_chunks(self, keys: Sequence[str]) -> list[bool]:
        return [self.backend.get(b"c:" + k.encode()) is not None for k in keys]

    def chunk_keys(self) -> list[str]:
        return [k[2:].decode() for k in self.backend.scan_keys(b"c:")]

    def delete_chunks(self, keys: Sequence[str]) -> None:
        self.backend.write({}, [b"c:" + k.encode() for k in keys])

    # -- manifests -----------------------------------------------------------------------
    def put_manifest(self, m: Manifest) -> bool:
        """Store ``m`` unless fenced. Returns False when it was already there (idempotent).

        Raises StaleEpoch if the store's head has a higher epoch, or a manifest of the same
        version has one; VersionConflict if the same version and epoch carry other content.
        """
        head = self.head(m.store)
        if head is not None and m.epoch < head.epoch:
            raise StaleEpoch(
                f"store {m.store} is at epoch {head.epoch}; a writer with epoch {m.epoch} is "
                "fenced: a newer writer took over, so stop this one"
            )
        raw_old = self.backend.get(_mkey(m.store, m.version, m.kind))
        if raw_old is not None:
            old = decode_manifest(raw_old)
            if old.epoch > m.epoch:
                raise StaleEpoch(
                    f"store {m.store} version {m.version} was committed at epoch {old.epoch}; "
                    f"epoch {m.epoch} cannot overwrite it"
                )
            if old.epoch == m.epoch:
                if old.same_content(m):
                    return False
                raise VersionConflict(
                    f"store {m.store} version {m.version} already holds other content at "
                    f"epoch {m.epoch}: commit a new version, or take a higher epoch to replace it"
                )
        puts = {_mkey(m.store, m.version, m.kind): encode_manifest(m)}
        if head is None or (m.epoch, m.version) > head.key():
            puts[b"h:" + m.store.path.encode()] = encode_stored(Head(m.version, m.epoch))
        self.backend.write(puts)
        return True

    def get_manifest(self, store: StoreId, version: int, kind: str) -> Manifest | None:
        raw = self.backend.get(_mkey(store, version, kind))
        return decode_manifest(raw) if raw is not None else None

    def manifests(self, store: StoreId) -> tuple[dict[int, Manifest], dict[int, Manifest]]:
        deltas: dict[int, Manifest] = {}
        snaps: dict[int, Manifest] = {}
        for _, raw in self.backend.scan(f"m:{store.path}/".encode()):
            m = decode_manifest(raw)
            (deltas if m.kind == "delta" else snaps)[m.version] = m
        return deltas, snaps

    def versions(self, store: StoreId) -> list[int]:
        out = set()
        for k in self.backend.scan_keys(f"m:{store.path}/".encode()):
            out.add(int(k.decode().rsplit("/", 2)[1]))
        return sorted(out)

    def head(self, store: StoreId) -> Head | None:
        raw = self.backend.get(b"h:" + store.path.encode())
        if raw is None:
            return None
        return decode_stored(raw)

    def stores(self) -> list[StoreId]:
        return [StoreId.parse(k[2:].decode()) for k in self.backend.scan_keys(b"h:")]

    def manifest_keys(self) -> list[tuple[StoreId, int, str]]:
        out = []
        for k in self.backend.scan_keys(b"m:"):
            path, version, kind = k[2:].decode().rsplit("/", 2)
            out.append((StoreId.parse(path), int(version), kind))
        return out

    def raw_manifest(self, store: StoreId, version: int, kind: str) -> bytes | None:
        return self.backend.get(_mkey(store, version, kind))

    # -- retention -----------------------------------------------------------------------
    def floor(self, store: StoreId) -> int:
        raw = self.backend.get(b"f:" + store.path.encode())
        return int(raw) if raw is not None else 0

    def apply_floor(self, store: StoreId, floor: int) -> int:
        """Drop every manifest and chunk of ``store`` below ``floor``. Returns items dropped."""
        if floor <= self.floor(store):
            floor = self.floor(store)
        drop: list[bytes] = []
        for k in self.backend.scan_keys(f"m:{store.path}/".encode()):
            if int(k.decode().rsplit("/", 2)[1]) < floor:
                drop.append(k)
        for k in self.backend.scan_keys(f"c:{store.path}/".encode()):
            if int(k.decode().rsplit("/", 2)[1]) < floor:
                drop.append(k)
        self.backend.write({b"f:" + store.path.encode(): str(floor).encode()}, drop)
        return len(drop)

    def check_not_corrupt(self, key: str) -> None:
        try:
            self.get_chunk(key)
        except CorruptChunk:
            self.delete_chunks([key])
            raise

    def delete_manifest(self, store: StoreId, version: int, kind: str) -> None:
        """Drop one manifest (handed off to its owners); the head goes with the last one."""
        deletes = [_mkey(store, version, kind)]
        left = [k for k in self.backend.scan_keys(f"m:{store.path}/".encode()) if k != deletes[0]]
        if not left:
            deletes.append(b"h:" + store.path.encode())
        self.backend.write({}, deletes)
