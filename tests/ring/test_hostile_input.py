"""Hostile input, second round (docs/security.md, Hardened endpoints), each against real nodes
on loopback port 0 (the ring:// file system through the Java provider's own classes).

- 11: a name, number or chunk name ending in a newline is refused (``$`` matched before it).
- 13: a relay plan's query is authorized before the plan is decoded, the plan's body and each
  hop's chunk list are bounded, and a chunk named twice is read and sent once.
- 17: a write LMDB cannot complete (a full map, a full file system) is 507
  ``insufficient_storage``, counted in ``storage_errors``, and makes the node read-only until
  space returns; free space is checked again at the write.
- 5: ``ring://`` directories ``/a/b`` and ``/a~b`` no longer share a store; a directory with
  ``~`` still reads what the old naming stored for it when no other directory shared that store.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import struct
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from client import RingClient, StoreId
from statestore.cli.local import LocalRing
from statestore.core.chunk import encode_chunks
from statestore.core.errors import InsufficientStorage, InvalidRequest
from statestore.core.ids import parse_chunk_key, parse_uint
from statestore.core.plan import ChunkTask, Hop
from statestore.core.quota import parse_quotas
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node
from statestore.wire.bodies import GossipMember
from statestore.wire.frames import (
    MAX_HOP_CHUNKS,
    MAX_PLAN_BYTES,
    decode_hop,
    encode_hop,
)
from statestore.wire.rows import encode_puts
from tests.javakit import Harness, harness_at
from tests.ringkit import FAST, assert_refused, call, local_ring, rss_kib, state_of

SID = StoreId("q1", 0, 3, "default")
BASE = f"/v1/stores/{SID.path}"

# -- 11: trailing newlines ------------------------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [
        lambda: StoreId("q1\n", 0, 3, "default"),
        lambda: StoreId("q1", 0, 3, "default\n"),
        lambda: StoreId.parse("q1/0\n/3/default"),
        lambda: parse_uint("7\n", "version", 10),
        lambda: parse_chunk_key("q1/0/3/default/1/d0-0123456789abcdef\n"),
        lambda: parse_chunk_key("q1/0/3/default/1\n/d0-0123456789abcdef"),
    ],
)
def test_names_and_numbers_ending_in_a_newline_are_refused(check: Any) -> None:
    with pytest.raises(InvalidRequest):
        check()


def test_quota_and_gossip_names_ending_in_a_newline_are_refused() -> None:
    with pytest.raises(ValueError, match="a query name"):
        parse_quotas(json.dumps({"q1\n": {"max_bytes": 5}}).encode())
    with pytest.raises(ValueError, match="a query name"):
        parse_quotas(json.dumps({"q1\n*": {"max_bytes": 5}}).encode())
    import msgspec

    member = {"id": "n1\n", "address": "127.0.0.1:1", "incarnation": 1, "heartbeat": 1}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(member).encode(), type=GossipMember)
    member = {**member, "id": "n1", "state": "normal\n"}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(member).encode(), type=GossipMember)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/stores/q1%0A/0/3/default/commit?version=1&epoch=1",
        "/v1/stores/q1/0/3/default%0A/commit?version=1&epoch=1",
        "/v1/stores/q1/0/3/default/commit?version=1%0A&epoch=1",
        "/v1/stores/q1/0/3/default/commit?version=1&epoch=1%0A",
    ],
)
async def test_a_commit_to_a_name_or_number_ending_in_a_newline_stores_nothing(
    solo: Node, path: str
) -> None:
    before = state_of(solo)
    status, body = await call(solo, "POST", path, data=encode_puts([b"k"], [b"v"]))
    assert_refused(status, body)
    assert state_of(solo) == before


# -- 13: relay plans ------------------------------------------------------------------------


async def _held(node: Node) -> str:
    """Commit one version of SID on ``node``; the key of its one chunk."""
    status, body = await call(
        node, "POST", f"{BASE}/commit?version=1&epoch=1", data=encode_puts([b"a"], [b"1" * 100])
    )
    assert status == 201, body
    (key,) = node.store.chunk_keys()
    return key


def _task(key: str, pos: int = 0) -> ChunkTask:
    _, version, name = parse_chunk_key(key)
    return ChunkTask(key, pos, version, name, int(name.split("-")[1], 16), 0, 0, 0, ())


async def _relay_frames(node: Node, path: str, body: bytes) -> tuple[int, list[bytes]]:
    """POST a plan; the status and the kinds of the frames answered."""
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{node.address}{path}", data=body) as r:
            raw = await r.read()
    kinds = []
    at = 0
    while r.status == 200 and at < len(raw):
        kind, mlen, dlen = struct.unpack(">cII", raw[at : at + 9])
        kinds.append(kind)
        at += 9 + mlen + dlen
    return r.status, kinds


async def test_a_chunk_named_many_times_in_a_plan_is_sent_once(solo: Node) -> None:
    key = await _held(solo)
    plan = Hop(solo.address, tuple(_task(key, i) for i in range(50)))
    body = encode_hop(SID, plan, False)
    _, hop, _, _, _ = decode_hop(body)
    assert [t.key for t in hop.chunks] == [key]
    for path in ("/v1/relay", f"/v1/relay?store={SID.path}"):
        status, kinds = await _relay_frames(solo, path, body)
        assert status == 200
        assert kinds.count(b"C") == 1, kinds


async def test_a_hop_s_chunk_list_and_the_plan_s_body_are_bounded(solo: Node) -> None:
    await _held(solo)
    before = state_of(solo)
    tasks = [[0, 1, f"d{i}-{i:016x}", i, 0, 0, 0] for i in range(MAX_HOP_CHUNKS + 1)]
    obj = {"v": 1, "store": SID.path, "hop": {"a": solo.address, "c": tasks, "k": []}}
    status, body = await call(solo, "POST", "/v1/relay", data=msgpack.packb(obj))
    assert (status, body["error"]["code"]) == (413, "payload_too_large"), body
    assert str(MAX_HOP_CHUNKS) in body["error"]["message"]
    big = msgpack.packb({**obj, "pad": b"x" * MAX_PLAN_BYTES})
    for path in ("/v1/relay", f"/v1/relay?store={SID.path}"):
        status, body = await call(solo, "POST", path, data=io.BytesIO(big))
        assert (status, body["error"]["code"]) == (413, "payload_too_large"), body
    # chunk names are chunk names: one byte per task would decode to ~70x its size
    obj["hop"]["c"] = [[0, 1, "x", 0, 0, 0, 0]]
    status, body = await call(solo, "POST", "/v1/relay", data=msgpack.packb(obj))
    assert_refused(status, body, "malformed_data")
    assert state_of(solo) == before


async def test_a_plan_must_be_for_the_store_its_url_names(solo: Node) -> None:
    key = await _held(solo)
    body = encode_hop(SID, Hop(solo.address, (_task(key),)), False)
    status, answer = await call(solo, "POST", "/v1/relay?store=q2/0/3/default", data=body)
    assert_refused(status, answer, "invalid_request")
    assert "q2/0/3/default" in answer["error"]["message"]


@pytest.fixture
def guarded_node(tmp_path: Path) -> Iterator[tuple[LocalRing, int]]:
    """One node process with tokens: ADMIN (everything), OTHER (read on query "other")."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "admin-token-0123456789": {"queries": ["*"], "rights": ["read", "write", "admin"]},
                "other-token-0123456789": {"queries": ["other"], "rights": ["read"]},
            }
        )
    )
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(os.urandom(32).hex().encode())
    args = [*FAST, "--replicas", "1", "--write-quorum", "1", "--auth-file", str(tokens)]
    args += ["--cluster-secret-file", str(secret)]
    with local_ring(tmp_path, 1, args, token="admin-token-0123456789") as ring:
        proc = ring.procs[0].proc
        assert proc is not None
        yield ring, proc.pid


async def test_an_unauthorized_relay_plan_is_refused_before_it_is_decoded(
    guarded_node: tuple[LocalRing, int],
) -> None:
    ring, pid = guarded_node
    address = ring.seeds[0]
    # ~8 MiB of one-byte fields: the old node decoded it (to ~600 MiB) before asking whose it was
    hostile = msgpack.packb(
        {
            "v": 1,
            "store": SID.path,
            "hop": {"a": address, "c": [[0, 1, "x", 0, 0, 0, 0]] * 950_000, "k": []},
        }
    )
    assert len(hostile) > 8 * 2**20
    base = rss_kib(pid, "VmRSS")
    headers = {"Authorization": "Bearer other-token-0123456789"}
    async with aiohttp.ClientSession() as s:

        async def post(path: str) -> int:
            data = io.BytesIO(hostile)
            async with s.post(f"http://{address}{path}", data=data, headers=headers) as r:
                await r.read()
                return r.status

        statuses = await asyncio.gather(
            *(post(p) for p in ["/v1/relay"] * 3 + [f"/v1/relay?store={SID.path}"] * 3)
        )
    assert all(s in (403, 413) for s in statuses), statuses
    peak = rss_kib(pid, "VmHWM")
    assert peak - base < 64 * 1024, f"the node's RSS rose by {(peak - base) // 1024} MiB"
    # the owner of the query still restores through a relay
    with RingClient([address], token="admin-token-0123456789") as client:
        client.commit(SID, 1, {b"k": b"v"}, epoch=1)
        assert dict(client.restore(SID, 1, plan="line")) == {b"k": b"v"}


# -- 17: storage faults ---------------------------------------------------------------------


def _chunk(seed: int, size: int) -> tuple[str, bytes]:
    """An incompressible chunk of about ``size`` bytes and its key (version ``seed + 1``)."""
    (chunk,) = encode_chunks({b"k%d" % seed: os.urandom(size)}, [])
    return f"{SID.path}/{seed + 1}/{chunk.name}", chunk.data


async def _metrics(node: Node) -> dict[str, float]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.address}/metrics") as r:
            text = await r.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def _fill(node: Node, size: int, limit: int = 200) -> tuple[list[str], dict[str, Any]]:
    """PUT chunks until one is refused; the keys stored and the refusal."""
    stored = []
    for i in range(limit):
        key, data = _chunk(i, size)
        status, body = await call(node, "PUT", f"/v1/chunks/{key}", data=data)
        if status != 201:
            return stored, {"status": status, **body}
        stored.append(key)
    raise AssertionError(f"{limit} chunks of {size} bytes all fit")


async def _check_full(node: Node, stored: list[str], refusal: dict[str, Any]) -> None:
    assert refusal["status"] == 507, refusal
    assert refusal["error"]["code"] == "insufficient_storage", refusal
    assert node.storage_errors[0] >= 1
    assert node.read_only_reason() is not None
    metrics = await _metrics(node)
    assert metrics["statestore_storage_errors_total"] >= 1
    assert metrics["statestore_read_only"] == 1
    status, health = await call(node, "GET", "/v1/health")
    assert health["status"] == "degraded", health
    # read-only: the next write is refused before it reaches storage; reads go on
    errors = node.storage_errors[0]
    key, data = _chunk(999, 1000)
    status, body = await call(node, "PUT", f"/v1/chunks/{key}", data=data)
    assert (status, body["error"]["code"]) == (507, "insufficient_storage")
    assert node.storage_errors[0] == errors
    status, _ = await call(node, "GET", f"/v1/chunks/{stored[0]}")
    assert status == 200


@pytest.fixture
async def small_map(tmp_path: Path) -> AsyncIterator[Node]:
    """A node whose LMDB map is 2 MiB (``lmdb://DIR?map_size=``)."""
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "n"),
        storage=f"lmdb://{tmp_path / 'n' / 'db'}?map_size={2 * 2**20}",
        replicas=1,
        write_quorum=1,
        dht=False,
        min_free_bytes=0,
    )
    node, runner = await start_node(config)
    yield node
    await stop_node(node, runner)


async def test_a_full_lmdb_map_is_507_counted_and_read_only(small_map: Node) -> None:
    stored, refusal = await _fill(small_map, 200_000)
    assert stored, "not one chunk fit"
    assert "LMDB map" in refusal["error"]["message"], refusal
    await _check_full(small_map, stored, refusal)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs, unmounted afterwards; skipped unless root may mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_file_system_under_lmdb_is_507_until_space_returns(tmpfs: Path) -> None:
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (2 * 2**20))  # freed below: space returns
    config = NodeConfig(
        port=0,
        data_dir=str(tmpfs / "n"),
        replicas=1,
        write_quorum=1,
        dht=False,
        min_free_bytes=0,  # no reserve: the write itself finds the file system full
    )
    node, runner = await start_node(config)
    try:
        stored, refusal = await _fill(node, 300_000)
        assert stored, "not one chunk fit"
        await _check_full(node, stored, refusal)
        filler.unlink()
        key, data = _chunk(500, 1000)
        status, body = await call(node, "PUT", f"/v1/chunks/{key}", data=data)
        assert status == 201, body
        assert node.read_only_reason() is None
        assert (await _metrics(node))["statestore_read_only"] == 0
    finally:
        await stop_node(node, runner)


async def test_a_compaction_whose_rename_is_not_synced_turns_the_node_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node compacts its storage file and the data directory's fsync fails after the
    rename (a failing disk): a power loss could bring the old file back without any write
    acknowledged since, so the node takes no write until it is started again, and says so
    in /v1/health and /metrics; reads go on. The build before logged a give-up and went on
    acknowledging writes. Started again on a disk that syncs, it takes writes."""
    from statestore.node import backends, space

    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "n"),
        replicas=1,
        write_quorum=1,
        dht=False,
        min_free_bytes=0,
        reclaim_at=0,  # no space loop: the one compaction is this test's
        reclaim_min=0,
    )
    node, runner = await start_node(config)
    node.config = replace(config, reclaim_at=0.01)
    try:
        stored = []
        for i in range(40):
            key, data = _chunk(i, 20_000)
            status, body = await call(node, "PUT", f"/v1/chunks/{key}", data=data)
            assert status == 201, body
            stored.append(key)
        await node.write(node.store.delete_chunks, stored[10:])  # free pages to give back
        real = backends._fsync

        def failing(target: str) -> None:
            if os.path.isdir(target):
                raise OSError(5, "Input/output error", target)
            real(target)

        monkeypatch.setattr(backends, "_fsync", failing)
        assert await space.reclaim(node) is None  # given up, counted
        assert node.stats["compactions_given_up"] == 1
        monkeypatch.setattr(backends, "_fsync", real)  # the disk answers again: no matter
        assert "started again" in (node.read_only_reason() or "")
        key, data = _chunk(900, 1000)
        status, body = await call(node, "PUT", f"/v1/chunks/{key}", data=data)
        assert (status, body["error"]["code"]) == (507, "insufficient_storage"), body
        status, health = await call(node, "GET", "/v1/health")
        assert health["status"] == "degraded"
        assert any("started again" in r for r in health["reasons"]), health
        assert (await _metrics(node))["statestore_read_only"] == 1
        for k in stored[:10]:
            status, _ = await call(node, "GET", f"/v1/chunks/{k}")
            assert status == 200
    finally:
        await stop_node(node, runner)
    node, runner = await start_node(config)
    try:
        assert node.read_only_reason() is None
        status, body = await call(node, "PUT", f"/v1/chunks/{key}", data=data)
        assert status == 201, body
    finally:
        await stop_node(node, runner)


async def test_free_space_is_checked_at_the_write_not_only_when_the_request_starts(
    small_map: Node,
) -> None:
    key, data = _chunk(0, 1000)
    small_map.config.min_free_bytes = 2**62  # the disk filled while the write waited its turn
    with pytest.raises(InsufficientStorage, match="disk nearly full"):
        await small_map.write(small_map.store.put_chunk, key, data)
    assert small_map.store.get_chunk(key) is None
    assert small_map.storage_errors[0] == 0  # a refusal, not a failed write
    await small_map.write(small_map.store.delete_chunks, [key])  # deletions go on
    small_map.config.min_free_bytes = 0
    await small_map.write(small_map.store.put_chunk, key, data)
    assert small_map.store.get_chunk(key) == data


# -- 5: ring:// directory names -------------------------------------------------------------


@pytest.fixture(scope="module")
def fs_harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    return harness_at(tmp_path_factory.mktemp("ring-fs"))


@pytest.fixture
def ring1(tmp_path: Path) -> Iterator[LocalRing]:
    with local_ring(tmp_path, 1, [*FAST, "--replicas", "1", "--write-quorum", "1"]) as ring:
        yield ring


def _fs(harness: Harness, ring: LocalRing, name: str, ops: list[list[Any]]) -> list[Any]:
    """Run ``ops`` on ring://name in a fresh JVM."""
    (out,) = harness("fs", [{"seeds": ring.seeds, "name": name, "ops": ops}])
    assert isinstance(out, list)
    return out


def test_ring_fs_directories_that_differ_by_a_tilde_keep_their_own_files(
    fs_harness: Harness, ring1: LocalRing
) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    stores = _fs(fs_harness, ring1, name, [["store", p] for p in ("/a/b", "/a~b", "/a%7Eb")])
    assert len({s[0] for s in stores}) == 3, stores
    _fs(
        fs_harness,
        ring1,
        name,
        [["write", "/a/b/f", b"one"], ["write", "/a~b/f", b"two"], ["write", "/a/b/g", b"3"]],
    )
    got = _fs(
        fs_harness,
        ring1,
        name,
        [["read", "/a/b/f"], ["read", "/a~b/f"], ["list", "/a/b"], ["list", "/a~b"]],
    )
    assert got == [b"one", b"two", ["f", "g"], ["f"]]


def _entry(length: int, blob: str, parts: int) -> bytes:
    """RingFileSystem's file record (Java DataOutputStream: long, long, UTF, int)."""
    raw = blob.encode()
    return struct.pack(">qqH", length, 1_700_000_000_000, len(raw)) + raw + struct.pack(">i", parts)


def _old_layout(client: RingClient, store: str, rows: dict[bytes, bytes]) -> None:
    client.commit(StoreId.parse(store), 1, rows, epoch=1, snapshot=True)


def test_ring_fs_reads_what_the_old_naming_stored_where_it_is_unambiguous(
    fs_harness: Harness, ring1: LocalRing
) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    (root, _), (new, old), (_, shared), (p_store, _) = _fs(
        fs_harness,
        ring1,
        name,
        [["store", "/"], ["store", "/x~y"], ["store", "/p~q"], ["store", "/p"]],
    )
    assert old is not None and old != new
    file_rows = {b"f:file": _entry(3, "blob1", 1), b"b:blob1:0": b"old"}
    with RingClient(ring1.seeds) as client:
        # as the old naming left them: /x~y (alone in its store); /p~q and /p/q sharing one
        _old_layout(client, root, {b"d:x~y": b"", b"d:p~q": b"", b"d:p": b""})
        _old_layout(client, old, file_rows)
        _old_layout(client, p_store, {b"d:q": b""})
        _old_layout(client, shared, file_rows)
    got = _fs(
        fs_harness,
        ring1,
        name,
        [["list", "/x~y"], ["read", "/x~y/file"], ["read", "/p/q/file"], ["read", "/p~q/file"]],
    )
    assert got == [["file"], b"old", b"old", None]
    # the first change writes the adopted rows to the directory's own store
    _fs(fs_harness, ring1, name, [["write", "/x~y/g", b"new"]])
    got = _fs(fs_harness, ring1, name, [["list", "/x~y"], ["read", "/x~y/file"]])
    assert got == [["file", "g"], b"old"]
    with RingClient(ring1.seeds) as client:
        assert client.latest(StoreId.parse(new)).version == 1


async def test_a_point_read_counts_a_chunk_at_what_it_decodes_to_not_at_its_manifests_word(
    tmp_path: Path,
) -> None:
    """A writer's manifest names each chunk's raw size: one that says 0 for a whole chunk of
    a few KiB that decodes to MiBs made the node's point-read cache count it as nothing, so
    point reads pinned such chunks decoded for good, past the cache's bytes; and the decode
    itself was not taken from the node's memory budget (hostile review 87). Now the cache
    counts what the rows take, and a decode larger than the budget is refused (413)."""
    from statestore.core.cache import rows_cost
    from statestore.core.ids import chunk_key
    from statestore.core.manifest import ChunkRef, Manifest
    from statestore.node.lookup import CACHE

    sid = StoreId("q1", 0, 0, "default")
    config = NodeConfig(
        port=0, data_dir=str(tmp_path / "n"), storage="memory://", replicas=1,
        write_quorum=1, dht=False, max_body=1 << 20, max_chunk=64 << 20,
        memory_budget=4 << 20, lookup_cache=32 << 20,
    )  # fmt: skip
    node, runner = await start_node(config)
    try:
        # 40,000 rows of 100 equal bytes: ~4.5 MB raw, ~150 KB compressed
        rows = {b"k%08d" % i: b"x" * 100 for i in range(40_000)}
        small = {b"a": b"1"}
        for version, puts in ((1, small), (2, rows)):
            (c,) = encode_chunks(puts, [], target_size=16 << 20, block_size=0)
            assert len(c.data) < 256 << 10 and c.raw_size >= (4 << 20 if puts is rows else 0)
            node.store.put_chunk(chunk_key(sid, version, c.name), c.data)
            ref = replace(ChunkRef.of(c), raw_size=0)  # the writer's word: nothing
            node.store.put_manifest(Manifest(sid, version, "snapshot", 1, 128, (ref,), {}))
        url = f"http://{node.address}/v1/stores/{sid.path}/key"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}?key={b'a'.hex()}&version=1") as r:
                assert (r.status, await r.read()) == (200, b"1")
            async with s.get(f"{url}?key={b'k00000007'.hex()}&version=2") as r:
                big = (r.status, await r.text())
        # the 4.5 MB chunk decodes to more than the 4 MiB budget: refused, nothing cached
        cache = runner.app[CACHE]
        assert big[0] == 413, big
        assert cache.size_bytes == rows_cost(small)
    finally:
        await stop_node(node, runner)


async def test_a_chunk_named_many_times_in_a_batch_is_sent_once(solo: Node) -> None:
    """``POST /v1/chunks`` with one key named 50 times read and sent the chunk 50 times: a
    few KB of request for 50x a chunk's bytes of reads, checks and answer (hostile review
    87). Each key is read and sent once."""
    from statestore.core.ids import chunk_key

    sid = StoreId("q1", 0, 0, "default")
    (c,) = encode_chunks({b"k": os.urandom(64 << 10)}, [])
    key = chunk_key(sid, 1, c.name)
    solo.store.put_chunk(key, c.data)
    async with aiohttp.ClientSession() as s:
        url = f"http://{solo.address}/v1/chunks"
        async with s.post(url, json={"keys": [key] * 50}) as r:
            assert r.status == 200
            body = await r.read()
    assert body.count(c.data) == 1
    assert len(body) < 2 * len(c.data)


async def test_a_lookup_takes_a_block_that_declares_far_more_than_its_bytes_from_the_budget(
    tmp_path: Path,
) -> None:
    """A block of a few KiB that declares 40 MiB (a row of zeros, or a writer's bomb) was
    decoded by any lookup whose key its index routes there, outside the node's budget: a
    lookup of an absent key answered nil after 40 MiB of decode (hostile review 88). Now
    what a block declares past 4x its bytes is taken while it decodes: 413 under a 16 MiB
    budget, nothing held after."""
    from statestore.core.chunk import key_group
    from statestore.core.ids import chunk_key
    from statestore.core.manifest import ChunkRef, Manifest

    sid = StoreId("q1", 0, 0, "default")
    config = NodeConfig(
        port=0, data_dir=str(tmp_path / "n"), storage="memory://", replicas=1,
        write_quorum=1, dht=False, max_body=1 << 20, memory_budget=16 << 20,
    )  # fmt: skip
    node, runner = await start_node(config)
    try:
        # a delta: no Bloom filter to rule the key out before its block is read
        (c,) = encode_chunks({b"a": bytes(40 << 20)}, [], kind="d", target_size=64 << 20)
        assert c.index_len > 0 and len(c.data) < 256 << 10
        node.store.put_chunk(chunk_key(sid, 1, c.name), c.data)
        ref = ChunkRef.of(c)
        node.store.put_manifest(Manifest(sid, 1, "delta", 1, 128, (ref,), {}))
        g = key_group(b"a", 128)
        absent = next(k for i in range(10_000) if key_group(k := b"a%d" % i, 128) == g)
        body = {
            "groups": 128,
            "keys": [absent.hex()],
            "parts": [[1, ref.name, ref.lo, ref.hi, ref.size, ref.index_len, ref.index_checksum]],
        }
        url = f"http://{node.address}/v1/stores/{sid.path}/lookup"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, data=json.dumps(body).encode()) as r:
                status, text = r.status, (await r.read())[:300]
        assert status == 413 and b"--memory-budget" in text, (status, text)
        assert node.budget.used == 0
    finally:
        await stop_node(node, runner)
