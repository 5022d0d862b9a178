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

**Space given back.** LMDB reuses the pages a delete frees but never shrinks its file, so a
node's disk use is its high-water mark: after retention, ``gc`` or a drop freed most of
what it held, the file stays as large. :meth:`LmdbBackend.compact` writes a compacted copy
(``mdb_env_copy2`` with ``MDB_CP_COMPACT``: live pages only) beside the file while reads and
writes go on; the writes made meanwhile are logged and replayed onto the copy, which is then
fsynced and swapped in (``rename``, so a crash leaves either file, both whole). Only the last
replay and the close and reopen hold reads and writes (milliseconds). A rename whose
directory fsync fails turns the backend read-only until the process starts again
(``Backend.unsynced``). node/space.py decides when (docs/operations.md, "Disk space").
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlparse

from statestore.core.errors import InsufficientStorage

__all__ = [
    "DEFAULT_MAP_SIZE",
    "Backend",
    "LmdbBackend",
    "MemoryBackend",
    "Space",
    "open_backend",
]

DEFAULT_MAP_SIZE = 64 * 2**30
_COMPACT_DIR = "compact.tmp"  # the compacted copy, before it is swapped in
# writes made while a copy is made are kept in memory to be replayed onto it; past this
# many bytes the compaction gives up (and is tried again later)
MAX_COMPACT_LOG = 256 * 2**20
_Batch = tuple[dict[bytes, bytes], list[bytes]]


@dataclass(frozen=True)
class Space:
    """How a backend's file is used: ``file`` bytes in all, ``used`` by live pages (the
    rest is free pages LMDB reuses but does not give back)."""

    file: int
    used: int

    @property
    def free(self) -> int:
        return max(0, self.file - self.used)


class _Gate:
    """Many readers or one swap: the swap waits for the reads in flight and holds new ones."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._readers = 0
        self._swapping = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cv:
            while self._swapping:
                self._cv.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cv:
                self._readers -= 1
                if not self._readers and self._swapping:
                    self._cv.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cv:
            while self._swapping:
                self._cv.wait()
            self._swapping = True
            while self._readers:
                self._cv.wait()
        try:
            yield
        finally:
            with self._cv:
                self._swapping = False
                self._cv.notify_all()


class Backend(ABC):
    """Ordered bytes-to-bytes map with atomic, durable batches. ``gives_space_back``: its
    storage shrinks as data is freed (no compaction needed: node/space.py skips it).
    ``unsynced``: why no write can be made durable until the process starts again (None:
    writes can), and :meth:`write` refuses every write meanwhile."""

    gives_space_back = True
    unsynced: str | None = None

    @abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    def get_range(self, key: bytes, offset: int, length: int) -> tuple[bytes, int] | None:
        """Bytes ``offset`` to ``offset + length - 1`` of a value (fewer at its end) and the
        value's size; None if absent."""
        value = self.get(key)
        return None if value is None else (value[offset : offset + length], len(value))

    def get_ranges(
        self, key: bytes, spans: Sequence[tuple[int, int]]
    ) -> tuple[list[bytes], int] | None:
        """:meth:`get_range` of several ``(offset, length)`` spans of one value, read at once
        (one transaction); None if absent."""
        value = self.get(key)
        if value is None:
            return None
        return [value[o : o + n] for o, n in spans], len(value)

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

    def space(self) -> Space:
        """The bytes its storage takes and the bytes live data needs of them (a backend
        that gives space back as it frees it: the two are the same)."""
        used = sum(size for _, size in self.scan_sizes(b""))
        return Space(used, used)

    def compact(self, max_log: int = 0) -> tuple[int, int]:
        """Give free space back to the file system; ``(bytes before, bytes after)``;
        ``max_log``: the bytes of writes it may hold meanwhile (0: the backend's default)."""
        size = self.space().file
        return size, size

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


def _batch_bytes(puts: Mapping[bytes, bytes], deletes: Sequence[bytes]) -> int:
    """What a logged write holds in memory, roughly: its keys and values, and 64 bytes of
    bookkeeping per key."""
    return sum(len(k) + len(v) + 64 for k, v in puts.items()) + sum(len(d) + 64 for d in deletes)


class LmdbBackend(Backend):
    gives_space_back = False  # its file keeps freed pages: compact()

    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE) -> None:
        import lmdb

        os.makedirs(path, exist_ok=True)
        self._lmdb = lmdb
        self._path = path
        self._map_size = map_size
        self._gate = _Gate()
        # writes since a compaction's copy began (None: no compaction under way)
        self._log: list[_Batch] | None = None
        self._logged = 0
        self._max_log = MAX_COMPACT_LOG
        self._overflowed = False  # more than _max_log was written: the log was let go
        self._log_lock = threading.Lock()
        self._compacting = threading.Lock()
        self.last_pause = 0.0  # seconds the last compaction held reads and writes
        self._closed = False
        # a compacted copy a crash left before its swap: the file in place is whole
        shutil.rmtree(os.path.join(path, _COMPACT_DIR), ignore_errors=True)
        self._env = self._open()
        # a compaction's rename whose directory sync failed in an earlier process is made
        # durable here, before a write is acknowledged on top of it (or the node refuses)
        self._sync_dir("opening it")

    def _open(self) -> Any:
        return self._lmdb.open(
            self._path,
            map_size=self._map_size,
            sync=True,
            metasync=True,
            max_readers=256,
            readahead=False,
        )

    def get(self, key: bytes) -> bytes | None:
        with self._gate.shared(), self._env.begin() as txn:
            value: bytes | None = txn.get(key)
            return value

    def get_range(self, key: bytes, offset: int, length: int) -> tuple[bytes, int] | None:
        # a view of the map, sliced: only the part is copied (a block of a 4 MiB chunk)
        with self._gate.shared(), self._env.begin(buffers=True) as txn:
            value = txn.get(key)
            if value is None:
                return None
            return bytes(value[offset : offset + length]), len(value)

    def get_ranges(
        self, key: bytes, spans: Sequence[tuple[int, int]]
    ) -> tuple[list[bytes], int] | None:
        with self._gate.shared(), self._env.begin(buffers=True) as txn:
            value = txn.get(key)
            if value is None:
                return None
            return [bytes(value[o : o + n]) for o, n in spans], len(value)

    def write(self, puts: Mapping[bytes, bytes], deletes: Sequence[bytes] = ()) -> None:
        try:
            with self._gate.shared():
                # inside the gate: a write that waited on a compaction's swap whose directory
                # sync failed is refused, not made into the new file
                if self.unsynced is not None:
                    raise InsufficientStorage(
                        f"storage under {self._path} takes no writes: {self.unsynced}"
                    ) from OSError(self.unsynced)
                with self._env.begin(write=True) as txn:  # aborted, nothing written, on error
                    _apply(txn, puts, deletes)
                with self._log_lock:  # a compaction's copy is being made: it replays this
                    if self._log is not None and not self._overflowed:
                        self._log.append((dict(puts), list(deletes)))
                        self._logged += _batch_bytes(puts, deletes)
                        if self._logged > self._max_log:  # let it go now: the copy is lost
                            self._log, self._overflowed = [], True
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
        with self._gate.shared(), self._env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k, v in cur:
                    if not k.startswith(prefix):
                        break
                    out.append((bytes(k), bytes(v)))
        return iter(out)

    def scan_keys(self, prefix: bytes) -> list[bytes]:
        out = []
        with self._gate.shared(), self._env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(prefix):
                        break
                    out.append(bytes(k))
        return out

    def sizes(self, keys: Sequence[bytes]) -> dict[bytes, int | None]:
        out: dict[bytes, int | None] = {}
        # views into the map: nothing copied
        with self._gate.shared(), self._env.begin(buffers=True) as txn:
            for k in keys:
                v = txn.get(k)
                out[k] = None if v is None else len(v)
        return out

    def scan_sizes(self, prefix: bytes) -> list[tuple[bytes, int]]:
        out = []
        with self._gate.shared(), self._env.begin(buffers=True) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k, v in cur:
                    key = bytes(k)
                    if not key.startswith(prefix):
                        break
                    out.append((key, len(v)))
        return out

    def space(self) -> Space:
        """The file's size and its live pages (the main tree's branch, leaf and overflow
        pages and the two meta pages; the free list's own pages count as free)."""
        with self._gate.shared():
            info, stat = self._env.info(), self._env.stat()
        psize = stat["psize"]
        pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"] + 2
        try:
            size = os.path.getsize(os.path.join(self._path, "data.mdb"))
        except OSError:
            size = (info["last_pgno"] + 1) * psize
        return Space(size, min(size, pages * psize))

    def compact(self, max_log: int = 0) -> tuple[int, int]:
        """Swap in a compacted copy of the file (module docstring, "Space given back"):
        ``(bytes before, bytes after)``. Any thread; one compaction at a time. Raises
        InsufficientStorage when LMDB fails (the file in place is unchanged) or when more
        than ``max_log`` bytes (default :data:`MAX_COMPACT_LOG`) were written while the copy
        was made: the writes logged for the copy are let go as soon as they pass it, so a
        compaction never holds more than that in memory."""
        with self._compacting:
            data = os.path.join(self._path, "data.mdb")
            before = os.path.getsize(data)
            tmp = os.path.join(self._path, _COMPACT_DIR)
            shutil.rmtree(tmp, ignore_errors=True)
            with self._log_lock:
                self._log, self._logged, self._overflowed = [], 0, False
                self._max_log = max_log or MAX_COMPACT_LOG
            try:
                os.makedirs(tmp)
                with self._gate.shared():  # a snapshot: every later write is in the log
                    self._env.copy(tmp, compact=True)
                copy = self._lmdb.open(tmp, map_size=self._map_size, sync=False, max_readers=8)
                try:
                    for _ in range(8):  # catch up outside the gate while writes go on
                        if not self._replay(copy, 64):
                            break
                    copy.sync(True)  # the bulk on disk now: the swap's fsync has little left
                    _fsync(os.path.join(tmp, "data.mdb"))
                    with self._gate.exclusive():  # no read or write until reopened
                        if self._closed:  # the node stopped meanwhile: nothing swapped
                            return before, before
                        held = time.monotonic()
                        self._replay(copy, 0)
                        with self._log_lock:
                            self._log = None
                        copy.sync(True)
                        copy.close()
                        self._swap(os.path.join(tmp, "data.mdb"), data)
                        self.last_pause = time.monotonic() - held
                finally:
                    copy.close()  # a second close is a no-op
            except (self._lmdb.Error, OSError) as exc:
                # LMDB, or the file system (a full or read-only disk: the copy's directory,
                # an fsync): the file in place is whole, the old one or the copy swapped in
                after = f"; {self.unsynced}" if self.unsynced is not None else ""
                raise InsufficientStorage(
                    f"compacting the storage under {self._path} failed ({type(exc).__name__}: "
                    f"{exc}); the file in place is whole{after}"
                ) from exc
            finally:
                with self._log_lock:
                    self._log = None
                shutil.rmtree(tmp, ignore_errors=True)
            return before, os.path.getsize(data)

    def _replay(self, copy: Any, keep: int) -> bool:
        """Apply the logged writes onto ``copy``, unless fewer than ``keep`` wait; whether
        any were applied. Raises InsufficientStorage once the log passed its bound."""
        with self._log_lock:
            if self._overflowed:
                raise InsufficientStorage(
                    f"compaction of {self._path} given up: more than {self._max_log} bytes "
                    "were written while its copy was made; it is tried again later"
                )
            if self._log is None or len(self._log) < max(keep, 1):
                return False
            # the batch stays counted until it is applied: the log that fills meanwhile and
            # the batch together are what the bound holds
            batch, self._log = self._log, []
            done = sum(_batch_bytes(p, d) for p, d in batch)
        with copy.begin(write=True) as txn:
            for puts, deletes in batch:
                _apply(txn, puts, deletes)
        with self._log_lock:
            self._logged = max(0, self._logged - done)
        return True

    def _swap(self, copy: str, data: str) -> None:
        """The compacted file, fsynced, renamed over the old one and opened (the gate held
        exclusively); the old file is opened again if the rename fails. A rename whose
        directory sync fails is in place but may not be on disk: a power loss could bring
        back the old file, without any write made to the new one, so the backend refuses
        writes from then on (:meth:`_sync_dir`)."""
        _fsync(copy)
        self._env.close()
        try:
            os.replace(copy, data)
        finally:
            try:
                self._env = self._open()
            except self._lmdb.Error as exc:  # no storage to serve: reads fail too
                self.unsynced = (
                    f"its storage could not be opened again after a compaction ({exc}): "
                    "start the node again (check the disk)"
                )
                raise
        self._sync_dir("a compaction's rename")
        if self.unsynced is not None:
            raise OSError(self.unsynced)

    def _sync_dir(self, after: str) -> None:
        """fsync the data directory (what a compaction renamed in); when that fails,
        :attr:`unsynced` says so and :meth:`write` refuses every write until the process
        starts again. Not retried: a later fsync's success proves nothing after a failed
        one (Linux may have dropped the dirty state it failed to write). A file system that
        cannot fsync a directory at all (EINVAL, ENOTSUP: some network and FUSE ones) is
        taken as it is, as PostgreSQL does."""
        try:
            _fsync(self._path)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOTSUP):
                return
            self.unsynced = (
                f"its directory could not be synced after {after} ({exc}): the node is "
                "read-only until it is started again, after a reboot or a remount of its "
                "file system (check the disk; the file in place holds every write "
                "acknowledged before)"
            )

    def close(self) -> None:
        with self._gate.exclusive():
            self._closed = True
            self._env.close()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _apply(txn: Any, puts: Mapping[bytes, bytes], deletes: Sequence[bytes]) -> None:
    for k in deletes:
        txn.delete(k)
    for k, v in puts.items():
        txn.put(k, v)


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
