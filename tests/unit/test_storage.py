"""Node storage: both backends behind one interface, fencing, idempotence, retention."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from statestore.core.chunk import encode_chunks
from statestore.core.errors import (
    CorruptChunk,
    InsufficientStorage,
    InvalidRequest,
    StaleEpoch,
    VersionConflict,
)
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Head, Manifest
from statestore.core.retention import Thinning
from statestore.node import backends
from statestore.node.backends import LmdbBackend, Space, open_backend
from statestore.node.config import NodeConfig
from statestore.node.replica import NodeStore
from statestore.node.space import CHECK_EVERY, MAX_BACKOFF, reclaim, space_loop
from statestore.testing.clock import run_simulated

SID = StoreId("q", 1, 2, "agg")


@pytest.fixture(params=["memory", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NodeStore]:
    url = "memory://" if request.param == "memory" else f"lmdb://{tmp_path}/db"
    s = NodeStore(open_backend(url))
    yield s
    s.backend.close()


def commit(version: int, epoch: int, value: bytes = b"v", kind: str = "delta") -> Manifest:
    chunks = encode_chunks({b"k": value}, [], kind=kind[0])
    return Manifest(SID, version, kind, epoch, 128, tuple(ChunkRef.of(c) for c in chunks), {})


def test_head_moves_forward_only(store: NodeStore) -> None:
    assert store.put_manifest(commit(1, 1))
    assert store.put_manifest(commit(2, 1))
    assert store.head(SID) == Head(2, 1)
    assert store.put_manifest(commit(3, 2))
    store.put_manifest(commit(3, 2, kind="snapshot"))
    assert store.head(SID) == Head(3, 2)
    assert store.versions(SID) == [1, 2, 3]
    assert store.stores() == [SID]


def test_recommit_same_content_is_idempotent(store: NodeStore) -> None:
    assert store.put_manifest(commit(1, 1)) is True
    assert store.put_manifest(commit(1, 1)) is False


def test_other_content_same_epoch_conflicts(store: NodeStore) -> None:
    store.put_manifest(commit(1, 1, b"a"))
    with pytest.raises(VersionConflict, match="already holds other content"):
        store.put_manifest(commit(1, 1, b"b"))


def test_zombie_writer_is_fenced(store: NodeStore) -> None:
    store.put_manifest(commit(1, 5))
    with pytest.raises(StaleEpoch, match="fenced"):
        store.put_manifest(commit(2, 4))
    # a newer writer may replace a version
    assert store.put_manifest(commit(1, 6, b"new"))
    assert store.head(SID) == Head(1, 6)
    assert store.get_manifest(SID, 1, "delta").epoch == 6  # type: ignore[union-attr]


def test_a_compactors_snapshot_is_fenced_by_the_heads_lineage(store: NodeStore) -> None:
    """A compactor's snapshot (``?compaction=1``) of a version below the one a newer writer
    took over at is the state that writer built on: taken under the head's higher epoch
    (the floor's rung below it, core/retention.py). One of a version the newer writer
    re-committed (a dead branch) is refused, and so is a writer's own snapshot."""
    for v in range(1, 5):
        store.put_manifest(commit(v, 1))
    store.put_manifest(commit(5, 2))  # a new writer restored 4 and went on from it
    with pytest.raises(StaleEpoch, match="fenced"):
        store.put_manifest(commit(3, 1, kind="snapshot"))  # a zombie writer's
    assert store.put_manifest(commit(3, 1, kind="snapshot"), None, True)
    assert store.head(SID) == Head(5, 2)
    # a newer writer that restored 2 and re-committed 3 and 4: version 3 at epoch 1 is a
    # dead branch's state
    store.put_manifest(commit(3, 3, b"again"))
    store.put_manifest(commit(4, 3, b"again"))
    with pytest.raises(StaleEpoch, match="fenced"):
        store.put_manifest(commit(2, 1, b"other", kind="snapshot"), None, False)
    assert store.put_manifest(commit(2, 1, kind="snapshot"), None, True)  # still its line
    with pytest.raises(StaleEpoch):
        store.put_manifest(commit(4, 1, kind="snapshot"), None, True)


def test_chunks_are_verified_on_write_and_read(store: NodeStore) -> None:
    (c,) = encode_chunks({b"a": b"b"}, [])
    key = chunk_key(SID, 1, c.name)
    with pytest.raises(CorruptChunk):
        store.put_chunk(key, c.data + b"x")
    store.put_chunk(key, c.data)
    assert store.get_chunk(key) == c.data
    assert store.has_chunks([key, key + "0"]) == [True, False]
    store.backend.write({b"c:" + key.encode(): c.data[:-1] + bytes([c.data[-1] ^ 1])})  # rot
    with pytest.raises(CorruptChunk):
        store.get_chunk(key)


def test_a_replaced_manifest_is_kept(store: NodeStore) -> None:
    """A higher epoch replaces a version's manifest but never destroys the lower one: a later
    version may be built on it (core/manifest.py, "Lineage"); retention drops both."""
    store.put_manifest(commit(1, 1, b"acked"))
    store.put_manifest(commit(1, 2, b"refused elsewhere"))
    assert store.get_manifest(SID, 1, "delta").epoch == 2  # type: ignore[union-attr]
    assert store.get_manifest(SID, 1, "delta", 1) == commit(1, 1, b"acked")
    deltas, _ = store.manifests(SID)
    assert [m.epoch for m in deltas[1]] == [2, 1]
    assert sorted(e for *_, e in store.manifest_items()) == [1, 2]
    assert store.versions(SID) == [1]
    assert len(store.query_keys("q")["manifests"]) == 2
    store.put_manifest(commit(2, 2))
    assert store.apply_floor(SID, 2) == 2
    assert store.manifest_items() == [(SID, 2, "delta", 2)]


def test_repair_copies_every_epoch(store: NodeStore) -> None:
    """A repair copy is not fenced: a lower epoch lands beside the higher one, a higher one
    takes the main key; deleting a hand-off's copy keeps the others."""
    store.put_manifest(commit(1, 3, b"c"))
    assert store.copy_manifest(commit(1, 1, b"a")) is True
    assert store.copy_manifest(commit(1, 1, b"a")) is False
    assert store.copy_manifest(commit(1, 4, b"d")) is True
    assert store.head(SID) == Head(1, 4)
    deltas, _ = store.manifests(SID)
    assert [m.epoch for m in deltas[1]] == [4, 3, 1]
    store.delete_manifest(SID, 1, "delta", 4)  # the main one: the next epoch takes its key
    assert store.get_manifest(SID, 1, "delta").epoch == 3  # type: ignore[union-attr]
    store.delete_manifest(SID, 1, "delta", 1)
    store.delete_manifest(SID, 1, "delta", 3)
    assert store.manifest_items() == [] and store.head(SID) is None


def test_floor_drops_old_versions(store: NodeStore) -> None:
    for v in range(1, 6):
        m = commit(v, 1, str(v).encode())
        store.put_manifest(m)
        (c,) = encode_chunks({b"k": str(v).encode()}, [])
        store.put_chunk(chunk_key(SID, v, c.name), c.data)
    dropped = store.apply_floor(SID, 3)
    assert dropped == 4
    assert store.versions(SID) == [3, 4, 5]
    assert all(int(k.split("/")[4]) >= 3 for k in store.chunk_keys())
    assert store.apply_floor(SID, 2) == 0 and store.floor(SID) == 3  # floors never go back


def test_a_delta_at_the_floor_is_taken_only_of_the_floor_snapshots_epoch(
    store: NodeStore,
) -> None:
    """A delta at the floor needs the version below it, which the floor dropped, unless a
    snapshot at the floor of its own epoch ends its chain: a newer writer's (it restored
    the version below before the floor rose) is refused, by a commit and by a copy."""
    for v in range(1, 4):
        store.put_manifest(commit(v, 1))
    store.put_manifest(commit(3, 1, kind="snapshot"))
    store.apply_floor(SID, 3)
    newer = replace(commit(3, 2, b"n"), base_epoch=1)
    with pytest.raises(InvalidRequest, match="below retention"):
        store.put_manifest(newer)
    assert store.copy_manifests([newer]) == [False]
    with pytest.raises(InvalidRequest, match="below retention"):
        store.put_hint(newer, ["a"])  # nor kept as a tentative commit
    assert store.head(SID) == Head(3, 1)
    assert store.put_manifest(commit(3, 1)) is False  # the one held: a retry is answered
    store.delete_manifest(SID, 3, "delta", 1)
    assert store.copy_manifests([commit(3, 1)]) == [True]  # its chain ends at the snapshot


def test_a_floor_is_raised_only_where_every_version_kept_here_stays(store: NodeStore) -> None:
    for v in range(1, 9):
        store.put_manifest(commit(v, 1))
    for v in (4, 7):
        store.put_manifest(commit(v, 1, kind="snapshot"))
    store.set_retain(SID, 5)  # the writer keeps 5: versions 4..8
    with pytest.raises(InvalidRequest, match="within the 5 versions"):
        store.raise_floor(SID, 7)  # a compactor that keeps fewer sent it
    assert store.floor(SID) == 0
    assert store.raise_floor(SID, 4) > 0 and store.floor(SID) == 4
    # a newer writer's delta at 7, on the old writer's 6: the snapshot at 7 is off its line
    store.put_manifest(replace(commit(7, 2, b"n"), base_epoch=1))
    store.set_retain(SID, 1)
    with pytest.raises(InvalidRequest, match="not a snapshot this node holds"):
        store.raise_floor(SID, 7)
    assert store.floor(SID) == 4 and store.versions(SID) == [4, 5, 6, 7, 8]


def test_a_chunk_copy_below_the_floor_is_not_taken_back(store: NodeStore) -> None:
    """What retention dropped does not come back from a node that did not take the floor
    yet (its repair pushes; hostile review 71); a writer's own chunk is its commit's."""
    store.apply_floor(SID, 3)
    (c,) = encode_chunks({b"k": b"v"}, [])
    old, new = chunk_key(SID, 2, c.name), chunk_key(SID, 3, c.name)
    assert store.put_chunk(old, c.data, copy=True) is False
    assert store.put_chunk(new, c.data, copy=True) is True
    assert store.has_chunks([old, new]) == [False, True]


def test_lmdb_survives_reopen(tmp_path: Path) -> None:
    s = NodeStore(LmdbBackend(str(tmp_path / "db")))
    s.put_manifest(commit(1, 1))
    s.backend.close()
    s2 = NodeStore(open_backend(f"lmdb://{tmp_path}/db"))
    assert s2.head(SID) == Head(1, 1)
    s2.backend.close()


def test_unknown_storage_url() -> None:
    with pytest.raises(ValueError, match="memory:// or lmdb"):
        open_backend("redis://x")


def test_chunk_cache_bounds_bytes_and_counts_hits() -> None:
    from statestore.core.cache import ChunkCache

    cache = ChunkCache(max_bytes=100)  # keys of one query: a plain LRU
    cache.put("q/a", {b"k": b"v"}, 60)
    cache.put("q/b", {b"k": None}, 30)
    assert cache.get("q/a") == {b"k": b"v"}  # a is now the most recent
    cache.put("q/c", {}, 30)  # over budget: b, the least recent, goes
    assert cache.get("q/b") is None and cache.get("q/c") == {} and cache.get("q/a") is not None
    cache.put("q/huge", {}, 1000)
    assert cache.get("q/huge") is None
    assert (cache.hits, cache.misses) == (3, 2)


def test_chunk_cache_keeps_each_querys_share_whatever_another_reads() -> None:
    """A node's lookup cache is shared by every query's readers: one query reading ten times
    the cache (a scan, a flood of lookups) evicts its own items once it holds the most, and
    another query's working set within an equal share stays whole. Fails on the plain LRU
    before (the scan evicted all of it)."""
    from statestore.core.cache import ChunkCache

    cache = ChunkCache(max_bytes=1000)
    hot = [f"a/0/0/s/1/s1-{i}#0" for i in range(8)]  # query a: 400 bytes, under half
    for key in hot:
        cache.put(key, {b"k": b"v"}, 50)
    for i in range(200):  # query b reads 10,000 bytes, reading a's set in between
        cache.put(f"b/0/0/s/{i}/s1-x#0", {}, 50)
        if i % 50 == 0:
            assert all(cache.get(key) is not None for key in hot)
    assert all(cache.get(key) is not None for key in hot)
    assert (cache.held_by("a"), cache.held_by("b"), cache.size_bytes) == (400, 600, 1000)
    # a third query reads as much: the largest holders give way, down to equal shares (a's
    # set is over a third now: its least recently read items go)
    for i in range(200):
        cache.put(f"c/0/0/s/{i}/s1-y#0", {}, 50)
    assert sorted(cache.held_by(q) for q in "abc") == [300, 350, 350]
    assert cache.size_bytes == 1000


def test_lmdb_compaction_gives_space_back_and_keeps_every_key(tmp_path: Path) -> None:
    """Deletes leave LMDB's file at its high-water mark; compact() swaps in a copy holding
    the live pages only, every key intact, while another thread reads throughout."""
    import os
    import threading

    backend = LmdbBackend(str(tmp_path / "db"))
    value = os.urandom(8000)
    backend.write({b"k%05d" % i: value for i in range(1000)})
    backend.write({}, [b"k%05d" % i for i in range(100, 1000)])
    before = backend.space()
    assert before.free > 0.8 * before.file  # the deletes freed pages, the file kept them
    stop, seen, errors = threading.Event(), [0], []

    def read() -> None:
        while not stop.is_set():
            try:
                assert backend.get(b"k00007") == value
                seen[0] += 1
            except Exception as exc:  # any failure during the swap
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        size_before, size_after = backend.compact()
    finally:
        stop.set()
        reader.join()
    assert not errors and seen[0] > 0
    assert size_before == before.file and size_after < 0.2 * size_before
    after = backend.space()
    assert after.file == size_after and after.free < 0.2 * after.file
    assert len(backend.scan_keys(b"k")) == 100 and backend.get(b"k00099") == value
    backend.write({b"new": b"v"})  # still writable, and durable across a reopen
    backend.close()
    again = LmdbBackend(str(tmp_path / "db"))
    assert again.get(b"new") == b"v" and len(again.scan_keys(b"k")) == 100
    assert not (tmp_path / "db" / "compact.tmp").exists()
    again.close()


@pytest.mark.parametrize(
    ("file", "used", "at", "min_bytes", "due"),
    [
        (100, 40, 0.5, 10, True),  # 60% free, over the floor
        (100, 60, 0.5, 10, False),  # 40% free
        (100, 40, 0.5, 70, False),  # 60 bytes free, under --reclaim-min
        (100, 40, 0.0, 0, False),  # --reclaim-at 0: never
        (100, 100, 0.5, 0, False),  # nothing free
    ],
)
def test_when_space_is_given_back(
    file: int, used: int, at: float, min_bytes: int, due: bool
) -> None:
    from statestore.node.backends import Space
    from statestore.node.space import due as is_due

    assert is_due(Space(file, used), at, min_bytes) is due


def test_writes_made_while_the_copy_is_made_are_kept(tmp_path: Path) -> None:
    """A compaction's copy is a snapshot: the writes made while it is made and caught up
    are logged and replayed onto it before the swap, puts and deletes in order; writers on
    another thread never wait for the copy, and lose nothing."""
    import threading

    class Racing(LmdbBackend):
        """Writes land between the copy and the swap (at the first catch-up)."""

        raced = False

        def _replay(self, copy: object, keep: int) -> bool:
            if not self.raced and keep:
                self.raced = True
                self.write({b"during": b"1", b"gone": b"x"}, [b"k00001"])
                self.write({}, [b"gone"])
            return super()._replay(copy, keep)

    backend = Racing(str(tmp_path / "db"))
    backend.write({b"k%05d" % i: b"v" * 4000 for i in range(500)})
    backend.write({}, [b"k%05d" % i for i in range(250, 500)])
    written: list[bytes] = []
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            key = b"w%06d" % i
            backend.write({key: b"y" * 100})
            written.append(key)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        backend.compact()
    finally:
        stop.set()
        writer.join()
    assert backend.raced
    assert backend.get(b"during") == b"1" and backend.get(b"gone") is None
    assert backend.get(b"k00001") is None and backend.get(b"k00002") == b"v" * 4000
    assert written and all(backend.get(k) == b"y" * 100 for k in written)
    backend.close()
    again = LmdbBackend(str(tmp_path / "db"))
    assert again.get(b"during") == b"1" and again.get(written[-1]) == b"y" * 100
    again.close()


def test_a_backend_closed_during_a_compaction_is_not_opened_again(tmp_path: Path) -> None:
    """The node stops while a compaction's copy is made (it runs on a worker thread): the
    compaction swaps nothing in and leaves the backend closed; the data dir opens whole."""

    class Stopping(LmdbBackend):
        def _replay(self, copy: object, keep: int) -> bool:
            if keep:
                self.close()
            return super()._replay(copy, keep)

    backend = Stopping(str(tmp_path / "db"))
    backend.write({b"k%05d" % i: b"v" * 4000 for i in range(300)})
    backend.write({}, [b"k%05d" % i for i in range(100, 300)])
    before = backend.space().file
    assert backend.compact() == (before, before)
    again = LmdbBackend(str(tmp_path / "db"))
    assert len(again.scan_keys(b"k")) == 100 and again.space().file == before
    assert not (tmp_path / "db" / "compact.tmp").exists()
    again.close()


def test_a_compaction_the_disk_fails_gives_up_and_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file system fails a compaction (a full or read-only disk: the copy's directory
    cannot be made, or an fsync fails): it gives up as when LMDB fails (InsufficientStorage,
    which node/space.py counts and backs off from), where the build before let the OSError
    out of the space loop; the file in place serves every key and takes writes."""
    backend = LmdbBackend(str(tmp_path / "db"))
    backend.write({b"k%05d" % i: b"v" * 4000 for i in range(300)})
    backend.write({}, [b"k%05d" % i for i in range(100, 300)])
    real = os.makedirs

    def full(path: str, *a: object, **kw: object) -> None:
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(os, "makedirs", full)
    with pytest.raises(InsufficientStorage, match="No space left"):
        backend.compact()
    monkeypatch.setattr(os, "makedirs", real)
    monkeypatch.setattr(
        "statestore.node.backends._fsync", lambda path: (_ for _ in ()).throw(OSError(5, "EIO"))
    )
    with pytest.raises(InsufficientStorage, match="EIO"):
        backend.compact()
    backend.write({b"after": b"1"})
    assert len(backend.scan_keys(b"k")) == 100 and backend.get(b"after") == b"1"
    assert backend._log is None
    backend.close()


def test_a_rename_the_directory_sync_fails_leaves_the_storage_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compacted file is renamed in and the directory's fsync fails: the rename may not
    be on disk, and a power loss could bring back the old file without any write made since.
    The backend refuses every write from then on (the build before logged a give-up and went
    on acknowledging writes into the new file) and serves reads; opened again (the node
    started again), the directory is synced first and writes go on."""
    path = str(tmp_path / "db")
    backend = LmdbBackend(path)
    backend.write({b"k%05d" % i: b"v" * 4000 for i in range(300)})
    backend.write({}, [b"k%05d" % i for i in range(100, 300)])
    real = backends._fsync

    def failing(target: str) -> None:
        if os.path.isdir(target):
            raise OSError(5, "Input/output error", target)
        real(target)

    monkeypatch.setattr("statestore.node.backends._fsync", failing)
    with pytest.raises(InsufficientStorage, match="read-only until it is started again"):
        backend.compact()
    assert backend.unsynced is not None and "Input/output error" in backend.unsynced
    with pytest.raises(InsufficientStorage, match="takes no writes"):
        backend.write({b"after": b"1"})
    with pytest.raises(InsufficientStorage, match="takes no writes"):
        backend.write({}, [b"k00001"])  # a delete too: a lost one would bring data back
    assert len(backend.scan_keys(b"k")) == 100 and backend.get(b"after") is None
    backend.close()
    monkeypatch.setattr("statestore.node.backends._fsync", real)
    again = LmdbBackend(path)
    assert again.unsynced is None
    again.write({b"after": b"1"})
    assert len(again.scan_keys(b"k")) == 100 and again.get(b"after") == b"1"
    again.close()
    monkeypatch.setattr("statestore.node.backends._fsync", failing)
    third = LmdbBackend(path)  # the directory cannot be synced at the start either
    assert third.unsynced is not None and "opening it" in third.unsynced
    with pytest.raises(InsufficientStorage, match="takes no writes"):
        third.write({b"later": b"1"})
    third.close()


def test_a_write_waiting_on_a_swap_whose_directory_sync_fails_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that reached the backend while a compaction's swap held reads and writes
    waits for it; the directory's fsync then fails: that write is refused too, not made
    into the new file (the build before checked before waiting, and acknowledged it:
    hostile review 77). A file system that cannot fsync a directory at all (EINVAL) is
    taken as it is."""
    backend = LmdbBackend(str(tmp_path / "db"))
    backend.write({b"k%05d" % i: b"v" * 4000 for i in range(300)})
    backend.write({}, [b"k%05d" % i for i in range(100, 300)])
    real = backends._fsync
    outcome: list[object] = []
    started = threading.Event()

    def late_write() -> None:
        started.set()
        try:
            backend.write({b"late": b"1"})
            outcome.append("acknowledged")
        except InsufficientStorage as exc:
            outcome.append(exc)

    writer = threading.Thread(target=late_write)

    def failing(target: str) -> None:
        if not os.path.isdir(target):
            return real(target)
        writer.start()  # the swap holds the gate: the write waits on it
        started.wait()
        time.sleep(0.2)
        raise OSError(5, "Input/output error", target)

    monkeypatch.setattr(backends, "_fsync", failing)
    with pytest.raises(InsufficientStorage):
        backend.compact()
    writer.join()
    assert len(outcome) == 1 and isinstance(outcome[0], InsufficientStorage), outcome
    assert backend.get(b"late") is None
    backend.close()

    def unsupported(target: str) -> None:
        if os.path.isdir(target):
            raise OSError(errno.EINVAL, "Invalid argument", target)
        real(target)

    monkeypatch.setattr(backends, "_fsync", unsupported)
    again = LmdbBackend(str(tmp_path / "db"))
    assert again.unsynced is None
    again.compact()
    again.write({b"after": b"1"})
    assert again.unsynced is None and again.get(b"after") == b"1"
    again.close()


def test_a_compaction_lets_go_of_writes_past_its_log_bound(tmp_path: Path) -> None:
    """More than ``max_log`` bytes written while the copy is made: the logged writes are let
    go at once (a compaction never holds more than its bound in memory, node/space.py gives
    it a quarter of --memory-budget), the compaction gives up, and every write is in the
    file in place, which was not swapped."""

    class Busy(LmdbBackend):
        peak = most = 0  # the counted bytes, and the bytes of values the log held

        def _replay(self, copy: object, keep: int) -> bool:
            if keep and not self.peak:
                for i in range(40):  # 40 x 10 KB against a 64 KB bound
                    self.write({b"busy%03d" % i: b"z" * 10_000})
                    self.peak = max(self.peak, self._logged)
                    held = sum(len(v) for p, _ in self._log or [] for v in p.values())
                    self.most = max(self.most, held)
            return super()._replay(copy, keep)

    backend = Busy(str(tmp_path / "db"))
    backend.write({b"k%05d" % i: b"v" * 4000 for i in range(300)})
    backend.write({}, [b"k%05d" % i for i in range(100, 300)])
    before = backend.space().file
    with pytest.raises(InsufficientStorage, match="given up"):
        backend.compact(max_log=64_000)
    assert 0 < backend.peak <= 64_000 + 10_100  # let go as soon as one write passed it
    assert 0 < backend.most <= 64_000
    assert backend.space().file >= before  # not swapped: it grew by the writes, if at all
    assert all(backend.get(b"busy%03d" % i) == b"z" * 10_000 for i in range(40))
    backend.write({b"after": b"1"})  # no compaction under way: nothing is logged
    assert backend._log is None and backend.get(b"after") == b"1"
    backend.close()


def test_compactions_that_give_up_back_off() -> None:
    """node/space.space_loop: a compaction that gives up (a steady writer) is tried again
    twice as late each time, up to MAX_BACKOFF, not every CHECK_EVERY seconds (each try
    copies the whole file); simulated time."""
    tries: list[float] = []

    class Busy:
        gives_space_back = False
        unsynced = None

        def space(self) -> Space:
            return Space(1 << 30, 1 << 20)  # almost all free: due

        def compact(self, max_log: int = 0) -> tuple[int, int]:
            tries.append(asyncio.get_running_loop().time())
            raise InsufficientStorage("given up: written meanwhile")

    node = SimpleNamespace(
        config=NodeConfig(),
        store=SimpleNamespace(backend=Busy()),
        stats={"compactions": 0, "bytes_reclaimed": 0, "compactions_given_up": 0},
        disk_free=lambda: None,
    )

    async def main() -> None:
        task = asyncio.ensure_future(space_loop(node))  # type: ignore[arg-type]
        await asyncio.sleep(1800)
        task.cancel()

    run_simulated(main)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert node.stats["compactions_given_up"] == len(tries)
    assert gaps[0] == 2 * CHECK_EVERY and max(gaps) == MAX_BACKOFF
    assert len(tries) < 15  # not 1800 / CHECK_EVERY = 360


def test_no_compaction_starts_on_a_disk_too_full_for_its_copy() -> None:
    """node/space.reclaim: a compaction's copy takes the live pages' bytes on the same disk;
    with less free than that plus the node's read-only reserve, none starts (counted as given
    up, so the loop backs off), where the build before started it and let it fail half way
    or turn the node read-only."""
    copies: list[int] = []

    class Loose:
        gives_space_back = False
        unsynced = None

        def space(self) -> Space:
            return Space(1 << 30, 256 << 20)  # 768 MiB of free pages: due

        def compact(self, max_log: int = 0) -> tuple[int, int]:
            copies.append(1)
            return 1 << 30, 256 << 20

    free = {"bytes": (256 << 20) + (32 << 20)}  # the copy and 32 MiB: under the reserve
    node = SimpleNamespace(
        config=NodeConfig(min_free_bytes=64 << 20),
        store=SimpleNamespace(backend=Loose()),
        stats={"compactions": 0, "bytes_reclaimed": 0, "compactions_given_up": 0},
        disk_free=lambda: free["bytes"],
    )
    assert asyncio.run(reclaim(node)) is None  # type: ignore[arg-type]
    assert copies == [] and node.stats["compactions_given_up"] == 1
    free["bytes"] = (256 << 20) + (64 << 20)  # the copy and the reserve
    assert asyncio.run(reclaim(node)) == (1 << 30, 256 << 20)  # type: ignore[arg-type]
    assert copies == [1] and node.stats["compactions"] == 1


def test_a_peers_retain_only_ever_makes_a_store_keep_more() -> None:
    """NodeStore.retains_to_adopt / adopt_retains: a writer-set ``retain`` offered by a peer
    (sync/have) is taken only above both what the node holds and its ``--retain``: a stale
    lower one (a replica that missed the writer's raise) never makes a store keep less."""
    from statestore.node.backends import MemoryBackend

    store = NodeStore(MemoryBackend())
    a, b, c = StoreId("q", 0, 0), StoreId("q", 0, 1), StoreId("q", 0, 2)
    store.set_retain(b, 400)
    offered = {a: 50, b: 300, c: 500}
    assert store.retains_to_adopt(offered, 100) == {c: 500}  # a: under --retain; b: held
    assert store.adopt_retains(offered, 100) == 1
    assert (store.retain(a), store.retain(b), store.retain(c)) == (None, 400, 500)
    assert store.adopt_retains({a: 150, b: 450}, 100) == 2
    assert (store.retain(a), store.retain(b)) == (150, 450)


def test_a_stored_manifest_with_any_bit_flipped_is_never_read() -> None:
    """A manifest record is sealed (0x70, xxh3-64 of its bytes, the bytes): any one to three
    flipped bits make it unreadable (None: absent, the scrub replaces it) instead of another
    manifest that decodes, such as one of a higher epoch (statestore-sim seed
    240856282107648). A record written before seals is read as it is."""
    import random

    from statestore.node.replica import _opened, _seal
    from statestore.wire.manifest import encode_manifest
    from statestore.wire.tentative import encode_hint

    rng = random.Random(5)
    for hint, body in (
        (False, encode_manifest(commit(7, 3))),
        (True, encode_hint(commit(7, 3), ["n1:7400"])),  # a hint's record, sealed the same way
    ):
        sealed = _seal(body)
        assert _opened(sealed, hint) == body and _opened(body, hint) == body
        for _ in range(2000):
            rotted = bytearray(sealed)
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(rotted) * 8)
                rotted[i // 8] ^= 1 << (i % 8)
            if bytes(rotted) != sealed:
                assert _opened(bytes(rotted), hint) is None


def test_a_stores_head_floor_thinning_and_retention_are_sealed(store: NodeStore) -> None:
    """Since disk format 3 a store's head, floor, thinning line and retention are sealed as
    manifests are: one to three flipped bits are never read as another value (a raised
    floor drops retained versions, a raised epoch fences every writer). A rotted one is
    taken as what drops nothing: the head as the highest manifest held, the floor as 0, no
    thinning line (and, while it is lost, no copy of a snapshot below the head taken back:
    the line may have dropped it), the most a writer may ask to retain (the node's own
    --retain would let its compactor raise the floor ring-wide); each is rewritten sealed at
    its next change. Records written before seals are read as they are. Fails on the code
    before (flipped records were read as other numbers, or raised)."""
    import random

    from statestore.core.items import Prefix
    from statestore.core.retention import MAX_RETAIN
    from statestore.node.replica import _skey
    from statestore.wire.head import encode_stored

    store.put_manifest(commit(6, 2))
    store.put_manifest(commit(9, 3))
    store.apply_floor(SID, 4)
    store.apply_thinning(SID, Thinning(below=8, every=5, chunks=0, floor=4))
    store.set_retain(SID, 40)

    def read() -> tuple[object, ...]:
        # the floor as a store started again reads it (NodeStore keeps a floor once read
        # and forgets it at a write of floors: rot after the read is seen at the next start)
        floor = NodeStore(store.backend).floor(SID)
        return store.head(SID), floor, store.thinning(SID), store.retain(SID)

    want = (Head(9, 3), 4, Thinning(8, 5, 0, 4), 40)
    assert read() == want
    instead = (Head(9, 3), 0, Thinning(), MAX_RETAIN)
    rng = random.Random(11)
    for i, prefix in enumerate((Prefix.HEAD, Prefix.FLOOR, Prefix.THINNING, Prefix.RETAIN)):
        key = _skey(prefix, SID)
        sealed = store.backend.get(key)
        assert sealed is not None
        for _ in range(300):
            rotted = bytearray(sealed)
            for _ in range(rng.randint(1, 3)):
                bit = rng.randrange(len(rotted) * 8)
                rotted[bit // 8] ^= 1 << (bit % 8)
            if bytes(rotted) == sealed:
                continue
            store.backend.write({key: bytes(rotted)})
            got = read()
            assert got[i] == instead[i], (prefix, bytes(rotted), got)
            assert got[:i] + got[i + 1 :] == want[:i] + want[i + 1 :]
            lost = prefix == Prefix.THINNING
            assert store.thinning_lost(SID) is lost
            assert store.thinned(SID, 5) is lost and not store.thinned(SID, 9)  # 5: a rung
        store.backend.write({key: sealed})
    store.set_retain(SID, 41)  # a rotted record is written sealed again at its next change
    assert store.retain(SID) == 41
    store.backend.write(  # as the builds before disk format 3 wrote them
        {
            _skey(Prefix.HEAD, SID): encode_stored(Head(9, 3)),
            _skey(Prefix.FLOOR, SID): b"4",
            _skey(Prefix.THINNING, SID): b"8 5 0 4",
            _skey(Prefix.RETAIN, SID): b"40",
        }
    )
    assert read() == want


def test_a_copy_of_an_older_version_leaves_the_head_and_its_fence(store: NodeStore) -> None:
    """Repair's copy of an older version keeps the head where it is, so a writer of a lower
    epoch is still fenced (a first version of manifest seals read the head, then unsealed,
    as a rotted manifest and lowered it on every copy)."""
    store.put_manifest(commit(10, 5))
    assert store.copy_manifest(commit(2, 1))
    assert store.head(SID) == Head(10, 5)
    with pytest.raises(StaleEpoch):
        store.put_manifest(commit(11, 1))


def test_a_rotted_main_record_takes_no_write_and_hides_no_other_epoch(store: NodeStore) -> None:
    """A version whose main record rotted: a commit of it is refused (node_unavailable, not
    taken as if nothing were there), a copy waits for the scrub, and its other epochs are
    still read."""
    from statestore.core.errors import NodeUnavailable
    from statestore.node.replica import _mkey

    store.put_manifest(commit(3, 1))
    store.put_manifest(commit(3, 2, b"w"))  # epoch 1 moves to a side key
    key = _mkey(SID, 3, "delta")
    raw = bytearray(store.backend.get(key) or b"")
    raw[-1] ^= 1
    store.backend.write({key: bytes(raw)})
    with pytest.raises(NodeUnavailable, match="rotted"):
        store.put_manifest(commit(3, 2, b"w"))
    assert store.copy_manifest(commit(3, 4)) is False
    assert store.raw_manifest(SID, 3, "delta") is None
    side = store.get_manifest(SID, 3, "delta", epoch=1)
    assert side is not None and side.epoch == 1


def test_a_record_written_before_seals_is_read_and_sealed_once(store: NodeStore) -> None:
    """A manifest record of disk format 1 (unsealed) is read as it is; the scrub seals it
    once verified (seal_record), and sealing twice writes nothing."""
    from statestore.node.replica import _mkey, _opened
    from statestore.wire.manifest import encode_manifest

    m = commit(4, 2)
    key = _mkey(SID, 4, "delta")
    store.backend.write({key: encode_manifest(m)})  # as the previous build wrote it
    assert store.get_manifest(SID, 4, "delta") == m and store.unsealed_record(key)
    assert store.seal_record(key) and not store.unsealed_record(key)
    assert not store.seal_record(key)
    sealed = store.backend.get(key)
    assert sealed is not None and sealed != encode_manifest(m)
    assert _opened(sealed) == encode_manifest(m) and store.get_manifest(SID, 4, "delta") == m


def test_thinning_keeps_its_first_spacing_and_the_floor_it_was_drawn_at(
    store: NodeStore,
) -> None:
    """NodeStore.apply_thinning: manifests go at the line, chunks only at the chunks' line;
    a later line with another spacing keeps the first (a snapshot dropped under one is no
    rung under another: its chunks may be gone) and a lower floor does not lower the line's;
    a dropped snapshot's manifest is refused on every path that stores one."""
    for v in range(1, 13):
        store.put_manifest(commit(v, 1))
        store.put_manifest(commit(v, 1, value=b"s%d" % v, kind="snapshot"))
        c = encode_chunks({b"k": b"s%d" % v}, [], kind="s")[0]  # the snapshot's chunk
        store.put_chunk(chunk_key(SID, v, c.name), c.data)
    store.apply_thinning(SID, Thinning(below=10, every=4, chunks=0, floor=5))
    assert store.snapshot_versions(SID) == [1, 2, 3, 4, 5, 8, 10, 11, 12]
    chunks = sorted(int(k.split("/")[4]) for k in store.store_chunk_keys(SID) if "/s" in k)
    assert chunks == list(range(1, 13))  # the chunks wait for their own line
    store.apply_thinning(SID, Thinning(below=11, every=3, chunks=10, floor=0))
    assert store.thinning(SID) == Thinning(below=11, every=4, chunks=10, floor=5)
    assert store.snapshot_versions(SID) == [1, 2, 3, 4, 5, 8, 11, 12]
    chunks = sorted(int(k.split("/")[4]) for k in store.store_chunk_keys(SID) if "/s" in k)
    assert chunks == [1, 2, 3, 4, 5, 8, 10, 11, 12]
    with pytest.raises(InvalidRequest):
        store.put_manifest(commit(9, 1, value=b"s9", kind="snapshot"))
    assert store.copy_manifests([commit(6, 1, value=b"s6", kind="snapshot")]) == [False]
    assert 6 not in store.snapshot_versions(SID)


def test_a_snapshot_committed_whole_is_never_thinned(store: NodeStore) -> None:
    """A writer's whole snapshot names its chunks ``w`` (core/commit.py): a thinning line
    drops neither its manifest nor its chunks, and a node holding the line takes a copy of
    one (repair's, a writer's), where it refuses a folded (``s``) one. A newer writer that
    went back below the line and committed a version whole was acknowledged by nodes that
    missed the line and lost when the line reached them: the builds before could not tell
    such a snapshot from a folded one whose delta they lacked."""
    from statestore.core.chunk import EncodedChunk
    from statestore.core.commit import build_commit

    def whole(version: int, epoch: int, kind: str = "w") -> tuple[Manifest, list[EncodedChunk]]:
        puts = {b"k": b"w%d" % version}
        return build_commit(
            SID,
            version,
            puts,
            [],
            {},
            epoch,
            True,
            key_groups=128,
            chunk_size=1 << 20,
            max_chunk=1 << 24,
            snapshot_kind=kind,
        )

    for v in range(1, 13):
        store.put_manifest(commit(v, 1))
        store.put_manifest(commit(v, 1, value=b"s%d" % v, kind="snapshot"))
        c = encode_chunks({b"k": b"s%d" % v}, [], kind="s")[0]
        store.put_chunk(chunk_key(SID, v, c.name), c.data)
    m6, c6 = whole(6, 2)
    assert m6.whole and all(c.name.startswith("w") for c in c6)
    assert not commit(6, 1, kind="snapshot").whole and not commit(6, 1).whole
    store.put_manifest(m6)  # the newer writer's version 6, above the folded one of epoch 1
    for c in c6:
        store.put_chunk(chunk_key(SID, 6, c.name), c.data)
    store.apply_thinning(SID, Thinning(below=11, every=4, chunks=11, floor=0))
    assert store.snapshot_versions(SID) == [4, 6, 8, 11, 12]
    assert store.get_manifest(SID, 6, "snapshot") == m6
    assert store.get_manifest(SID, 6, "snapshot", epoch=1) is None  # the folded one went
    held = sorted((int(k.split("/")[4]), k.split("/")[5][0]) for k in store.store_chunk_keys(SID))
    assert [h for h in held if h[1] != "d"] == [(4, "s"), (6, "w"), (8, "s"), (11, "s"), (12, "s")]
    # under the line: a whole snapshot is taken, a folded one refused, on every path
    m9, _ = whole(9, 3)
    assert store.put_manifest(m9)
    assert store.copy_manifests([whole(10, 3)[0], commit(7, 1, kind="snapshot")]) == [True, False]
    with pytest.raises(InvalidRequest):
        store.put_manifest(commit(5, 3, value=b"s5", kind="snapshot"))
    assert store.snapshot_versions(SID) == [4, 6, 8, 9, 10, 11, 12]

    # a whole commit laid out with ``s`` names (the view did not say ``whole_names`` yet) and
    # retried, or copied, with ``w`` names: the whole one replaces it (same state, only safer)
    s13, _ = whole(13, 4, kind="s")  # above the line: taken either way
    assert store.put_manifest(s13) and not store.get_manifest(SID, 13, "snapshot").whole
    assert store.put_manifest(whole(13, 4)[0]) and store.get_manifest(SID, 13, "snapshot").whole
    assert not store.put_manifest(whole(13, 4)[0]) and not store.put_manifest(s13)  # no way back
    s14, _ = whole(14, 4, kind="s")
    assert store.put_manifest(s14)
    assert store.copy_manifests([whole(14, 4)[0], s14]) == [True, False]
    assert store.get_manifest(SID, 14, "snapshot").whole
    # whole means every chunk named ``w``
    mixed = replace(m6, chunks=(*m6.chunks, *commit(6, 2, kind="snapshot").chunks))
    assert not mixed.whole and not replace(m6, chunks=()).whole
    assert not replace(m6, kind="delta").whole


def test_a_floor_kept_once_read_follows_every_write_of_floors(store: NodeStore) -> None:
    """NodeStore keeps the floors it read (a lookup checks one each time): a raised floor,
    a dropped query's and a floor read while a write lands are never answered stale."""
    store.put_manifest(commit(6, 2))
    assert store.floor(SID) == 0  # read, and kept
    store.apply_floor(SID, 4)
    assert store.floor(SID) == 4
    store.purge_query(SID.query, b"tombstone")
    assert store.floor(SID) == 0
    store.put_manifest(commit(9, 3))
    store.apply_floor(SID, 6)  # (forgets the floors kept)
    # a read that began before a write of floors keeps nothing: the next read sees the write
    began = store.backend.get
    calls = []

    def racing(key: bytes) -> bytes | None:
        got = began(key)
        if not calls:
            calls.append(key)
            store.apply_floor(SID, 9)  # lands after the read, before it is kept
        return got

    store.backend.get = racing  # type: ignore[method-assign]
    try:
        assert store.floor(SID) == 6  # (read before the write)
    finally:
        store.backend.get = began  # type: ignore[method-assign]
    assert store.floor(SID) == 9
