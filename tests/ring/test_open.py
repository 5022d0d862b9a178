"""``ring.open(sid, version)``: a version read lazily, key group by key group, on real nodes.

Every test writes stores of many small chunks (``chunk_size=512``: a key group spans several
chunks, and chunks share boundary groups) through versions of puts and deletes, a snapshot in
the middle, and compares what the opened version reads with what ``restore()`` rebuilds.
The asyncio client runs against in-process nodes; the blocking one against node processes.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from client import (
    AsyncLazyState,
    AsyncRingClient,
    InvalidRequest,
    LazyState,
    NodeUnavailable,
    RingClient,
    StoreId,
    StoreNotFound,
    VersionNotFound,
)
from client._open import SHARED_LOOKUP_KEYS
from statestore.cli.local import LocalRing
from statestore.core.chunk import index_span, key_group, parse_index
from statestore.core.ids import chunk_key
from statestore.core.manifest import Manifest
from statestore.net.reads import ReadStats, block_path
from statestore.node.channel import MESSAGE_BYTES
from statestore.wire.bodies import MAX_LOOKUP_KEYS
from tests.ringkit import eventually, local_ring, nodes, scrape, state_of, value

CHUNK = 512  # raw bytes per chunk: hundreds of chunks for a few thousand keys
Ref = dict[bytes, bytes]


def _versions(seed: int) -> list[tuple[Ref, list[bytes], bool]]:
    """Six commits: a snapshot of 2,000 keys, deltas that overwrite, add, delete, re-add what
    was deleted and delete what was just added, a snapshot of the whole state at v4 and a
    delta above it. Returns (puts, deletes, snapshot) per version."""
    rng = random.Random(seed)

    def val() -> bytes:
        return rng.randbytes(rng.randrange(1, 60))

    state: Ref = {f"key-{i:05d}".encode(): val() for i in range(2000)}
    out: list[tuple[Ref, list[bytes], bool]] = [(dict(state), [], True)]
    for v in (2, 3, 5, 6):
        if v == 5:  # v4: the whole state as a snapshot
            out.append((dict(state), [], True))
        live = sorted(state)
        puts = {k: val() for k in rng.sample(live, 200)}
        puts.update({f"new-{v}-{i}".encode(): val() for i in range(150)})
        dels = [k for k in rng.sample(live, 250) if k not in puts]
        if v == 3:  # re-put some keys v2 deleted, delete some v2 added
            puts.update({f"key-{i:05d}".encode(): val() for i in range(0, 2000, 7)})
            dels += [f"new-2-{i}".encode() for i in range(0, 150, 3)]
            dels = [k for k in dels if k not in puts]
        out.append((puts, dels, False))
        state.update(puts)
        for k in dels:
            state.pop(k, None)
    return out


def _expected(commits: list[tuple[Ref, list[bytes], bool]]) -> dict[int, Ref]:
    state: Ref = {}
    out: dict[int, Ref] = {}
    for v, (puts, dels, _snap) in enumerate(commits, 1):
        state.update(puts)
        for k in dels:
            state.pop(k, None)
        out[v] = dict(state)
    return out


def _every_key(commits: list[tuple[Ref, list[bytes], bool]]) -> list[bytes]:
    keys = {k for puts, dels, _ in commits for k in (*puts, *dels)}
    return sorted(keys | {b"never-written", b""})


def _chunks_for(chain: tuple[Manifest, ...], key: bytes) -> tuple[int, int]:
    """The chunks (with rows) along ``chain`` whose group range covers ``key``'s group, and
    their bytes: what a cold point read may fetch, no more."""
    refs = [
        c
        for m in chain
        for c in m.chunks
        if c.rows and c.lo <= key_group(key, m.key_groups) <= c.hi
    ]
    return len(refs), sum(c.size for c in refs)


# -- asyncio: in-process nodes ---------------------------------------------------------------
async def _commit_all(
    ring: AsyncRingClient, sid: StoreId, commits: list[tuple[Ref, list[bytes], bool]]
) -> None:
    for v, (puts, dels, snap) in enumerate(commits, 1):
        await ring.commit(sid, v, puts, dels, {"src": v}, epoch=1, snapshot=snap)


async def _scan(lazy: AsyncLazyState) -> Ref:
    got: Ref = {}
    async for k, v in lazy.items():
        assert k not in got, f"{k!r} streamed twice"
        got[k] = v
    return got


async def test_async_open_reads_what_restore_rebuilds(tmp_path: Path) -> None:
    sid = StoreId("open", 0, 1, "default")
    commits = _versions(seed=1)
    expected = _expected(commits)
    every = _every_key(commits)
    async with (
        nodes(tmp_path, 3) as live,
        AsyncRingClient([live[0].address], chunk_size=CHUNK) as ring,
    ):
        await _commit_all(ring, sid, commits)
        for version in (None, 6, 5, 4, 3, 2, 1):
            restored = await ring.restore(sid, version)
            assert dict(restored) == expected[version or 6]  # the reference itself is right
            assert await (await ring.open(sid, version)).count() == len(restored)  # cold
            lazy = await ring.open(sid, version)
            assert lazy.version == restored.version and lazy.head.epoch == restored.epoch
            assert lazy.positions == restored.positions
            # a chain of several manifests, of many chunks, some of them wider than a group
            assert lazy.total_chunks > 100
            if version in (None, 6, 3):
                assert len(lazy.chain) >= 2
            # every key, present or not (half of them read through get_many)
            half = every[::2]
            many = await lazy.get_many(half)
            assert many == {k: restored[k] for k in half if k in restored}
            for key in every[1::2]:
                want = restored.get(key)
                assert await lazy.get(key) == want, (version, key)
                assert await lazy.has(key) is (want is not None)
            # iteration equals restore's items, each key once; and the count
            assert await _scan(lazy) == dict(restored)
            assert [k async for k in lazy] == [k async for k in lazy.keys()]
            assert sorted([v async for v in lazy.values()]) == sorted(restored.values())
            assert await lazy.count() == len(restored)
            await lazy.close()


async def test_async_point_read_fetches_only_its_groups_chunks(tmp_path: Path) -> None:
    sid = StoreId("open", 0, 2, "default")
    commits = _versions(seed=2)
    expected = _expected(commits)
    async with (
        nodes(tmp_path, 3) as live,
        AsyncRingClient([live[0].address], chunk_size=CHUNK) as ring,
    ):
        await _commit_all(ring, sid, commits)
        # an empty commit: its one chunk covers every group and holds no row
        await ring.commit(sid, 7, {}, [], {"src": 7}, epoch=1)
        expected[7] = expected[6]
        for version in (7, 3):
            for key in (b"key-00042", b"new-2-7", b"key-01999", b"never-written"):
                lazy = await ring.open(sid, version)
                assert lazy.chunks_fetched == 0 and lazy.bytes_fetched == 0  # nothing up front
                # get_many loads whole groups: exactly the chunks covering the key's group
                assert await lazy.get_many([key]) == _present(expected[version], key)
                chunks, size = _chunks_for(lazy.chain, key)
                assert lazy.chunks_fetched == chunks, (version, key)
                assert lazy.bytes_fetched == size
                assert 0 < chunks < lazy.total_chunks / 10
                # warm: the folded group is cached, nothing more is fetched
                assert await lazy.get(key) == expected[version].get(key)
                assert lazy.chunks_fetched == chunks and lazy.cache_hits >= 1
                assert lazy.stats.parts == 0
                # concurrent reads of keys of one group share the fetch
                fresh = await ring.open(sid, version)
                await asyncio.gather(*(fresh.get_many([key]) for _ in range(8)))
                assert fresh.chunks_fetched == chunks


def _present(state: Ref, key: bytes) -> Ref:
    return {key: state[key]} if key in state else {}


async def test_async_cold_point_read_fetches_an_index_and_one_block_per_chunk(
    tmp_path: Path,
) -> None:
    """Chunks of the default size (4 MiB) cut into 16 KiB blocks: a cold ``get`` fetches,
    of each chunk along the chain that covers the key's group, its index and the one block
    that can hold the key, and the newest manifest naming the key decides. A store written
    whole (``block_size=0``, the layout before 0.3.0) is read by whole chunks, as before."""
    rng = random.Random(5)
    base = {f"key-{i:06d}".encode(): rng.randbytes(150) for i in range(30_000)}
    delta = {k: rng.randbytes(150) for k in rng.sample(sorted(base), 300)}
    gone = [k for k in rng.sample(sorted(base), 100) if k not in delta]
    want = {**base, **delta}
    for k in gone:
        del want[k]
    async with nodes(tmp_path, 3) as live:
        for block_size in (16 * 1024, 0):
            sid = StoreId("open", 0, 9, f"b{block_size}")
            async with AsyncRingClient([live[0].address], block_size=block_size) as ring:
                await ring.commit(sid, 1, base, [], {}, epoch=1, snapshot=True)
                await ring.commit(sid, 2, delta, gone, {}, epoch=1)
                keys = [*rng.sample(sorted(base), 20), *sorted(delta)[:5], *gone[:5], b"absent"]
                for key in keys:
                    lazy = await ring.open(sid)
                    assert await lazy.get(key) == want.get(key), (block_size, key)
                    chunks, size = _chunks_for(lazy.chain, key)
                    if block_size == 0:
                        assert (lazy.chunks_fetched, lazy.bytes_fetched) == (chunks, size)
                        continue
                    assert lazy.chunks_fetched == 0
                    assert 1 <= lazy.stats.parts <= 2 * chunks, (key, lazy.stats)
                    # an index and a block of each: a small part of the chunks' bytes
                    assert lazy.bytes_fetched < size / 20, (key, lazy.bytes_fetched, size)
                    parts = lazy.stats.parts
                    assert await lazy.get(key) == want.get(key)  # warm: nothing fetched
                    assert lazy.stats.parts == parts
                    await lazy.close()


async def test_async_open_is_pinned_and_refuses_bad_input(tmp_path: Path) -> None:
    sid = StoreId("open", 0, 3, "default")
    commits = _versions(seed=3)
    expected = _expected(commits)
    async with (
        nodes(tmp_path, 3) as live,
        AsyncRingClient([live[0].address], chunk_size=CHUNK) as ring,
    ):
        await _commit_all(ring, sid, commits)
        latest = await ring.open(sid)  # v6, nothing fetched yet
        old = await ring.open(sid, 2, cache_bytes=0)  # no cache: every read fetches
        changed = sorted(expected[6])[:300]
        await ring.commit(sid, 7, {k: b"after" for k in changed}, [], {"src": 7}, epoch=1)
        await ring.commit(sid, 8, {}, sorted(expected[6])[300:600], {"src": 8}, epoch=1)
        assert (await ring.latest(sid)).version == 8
        assert latest.version == 6
        for key in (*changed[::10], *sorted(expected[6])[300:600:10]):
            assert await latest.get(key) == expected[6][key]
        assert await _scan(latest) == expected[6]
        assert await _scan(old) == expected[2]
        for key in sorted(expected[2])[::50]:
            assert await old.get(key) == expected[2][key]
        assert old.cache_bytes == 0
        assert await _scan(await ring.open(sid)) == {
            k: b"after" if k in changed else v
            for k, v in expected[6].items()
            if k not in set(sorted(expected[6])[300:600])
        }

        with pytest.raises(TypeError):
            await latest.get("key-00001")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await latest.has(bytearray(b"key-00001"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await latest.get_many([b"ok", 1])  # type: ignore[list-item]
        with pytest.raises(VersionNotFound):
            await ring.open(sid, 99)
        with pytest.raises(StoreNotFound):
            await ring.open(StoreId("open", 0, 3, "nothing-here"))
        with pytest.raises(InvalidRequest):
            await ring.open(sid, 0)
        with pytest.raises(ValueError):
            await ring.open(sid, cache_bytes=-1)
        async with await ring.open(sid, 6) as closing:
            assert await closing.get(changed[0]) == expected[6][changed[0]]
        with pytest.raises(RuntimeError):
            await closing.get(changed[0])


async def test_async_open_folds_deltas_cut_by_other_key_groups(tmp_path: Path) -> None:
    """A delta written by a client with another ``key_groups`` in the middle of the chain:
    its chunk ranges say nothing of the top's groups, so they are all read, and the rows
    still fold by key."""
    sid = StoreId("open", 0, 4, "default")
    commits = _versions(seed=4)[:3]
    expected = _expected(commits)
    async with (
        nodes(tmp_path, 3) as live,
        AsyncRingClient([live[0].address], chunk_size=CHUNK) as ring,
        AsyncRingClient([live[0].address], chunk_size=CHUNK, key_groups=16) as other,
    ):
        await _commit_all(ring, sid, commits[:1])
        puts, dels, _ = commits[1]
        await other.commit(sid, 2, puts, dels, {"src": 2}, epoch=1)
        puts, dels, _ = commits[2]
        await ring.commit(sid, 3, puts, dels, {"src": 3}, epoch=1)
        for version in (2, 3):
            lazy = await ring.open(sid, version)
            assert {m.key_groups for m in lazy.chain} == {16, 128}
            for key in _every_key(commits)[::3]:
                assert await lazy.get(key) == expected[version].get(key)
            assert await _scan(lazy) == expected[version]
            assert dict(await ring.restore(sid, version)) == expected[version]


# -- blocking: node processes ----------------------------------------------------------------
@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRing]:
    with local_ring(tmp_path_factory.mktemp("open"), 3) as ring:
        yield ring


def test_sync_open_is_a_mapping_of_the_version(procs: LocalRing) -> None:
    sid = StoreId("open", 1, 1, "default")
    commits = _versions(seed=5)
    expected = _expected(commits)
    every = _every_key(commits)
    with RingClient(procs.seeds, chunk_size=CHUNK) as ring:
        for v, (puts, dels, snap) in enumerate(commits, 1):
            ring.commit(sid, v, puts, dels, {"src": v}, epoch=1, snapshot=snap)
        for version in (None, 3):
            restored = ring.restore(sid, version)
            assert dict(restored) == expected[version or 6]
            with ring.open(sid, version) as st:
                assert isinstance(st, Mapping) and isinstance(st, LazyState)
                assert st.version == restored.version == (version or 6)
                assert st.head.version == st.version and st.head.epoch == restored.epoch
                assert st.positions == restored.positions
                for key in every[::3]:
                    if key in restored:
                        assert st[key] == restored[key]
                        assert key in st
                        assert st.get(key) == restored[key]
                    else:
                        with pytest.raises(KeyError):
                            st[key]
                        assert key not in st
                        assert st.get(key) is None and st.get(key, b"d") == b"d"
                assert list(st) == list(st.keys()) and len(set(st)) == len(list(st))
                assert dict(st.items()) == dict(restored)
                assert len(st.items()) == len(restored)
                assert sorted(st.values()) == sorted(restored.values())
                assert set(st) == set(restored)
                assert len(st) == len(restored)
                assert st == restored  # Mapping equality, through the streamed items
                assert st.get_many(every[::5]) == {k: restored[k] for k in every[::5] if k in st}
                with pytest.raises(TypeError):
                    st["key-00001"]  # type: ignore[index]
                with pytest.raises(TypeError):
                    "key-00001" in st  # noqa: B015
                with pytest.raises(TypeError):
                    st.get(1)  # type: ignore[arg-type]
                with pytest.raises(TypeError):
                    st[bytearray(b"key-00001")]  # type: ignore[index]
        with pytest.raises(VersionNotFound):
            ring.open(sid, 99)


def test_sync_open_fetches_little_and_stays_pinned(procs: LocalRing) -> None:
    sid = StoreId("open", 1, 2, "default")
    commits = _versions(seed=6)
    expected = _expected(commits)
    with RingClient(procs.seeds, chunk_size=CHUNK) as ring:
        for v, (puts, dels, snap) in enumerate(commits, 1):
            ring.commit(sid, v, puts, dels, {"src": v}, epoch=1, snapshot=snap)
        assert len(ring.open(sid, 5)) == len(expected[5])  # cold: counted by streaming
        st = ring.open(sid)
        key = sorted(expected[6])[123]
        ring.commit(sid, 7, {key: b"later"}, [sorted(expected[6])[124]], {"src": 7}, epoch=1)
        assert st[key] == expected[6][key]  # fetched after the commit, still v6
        chunks, size = _chunks_for(st.lazy.chain, key)
        assert chunks < st.total_chunks / 10
        # blocked chunks: an index and a block of each chunk covering the key's group, at most
        assert st.chunks_fetched == 0 and 1 <= st.stats.parts <= 2 * chunks
        assert 0 < st.bytes_fetched == st.stats.bytes <= size
        assert st[sorted(expected[6])[124]] == expected[6][sorted(expected[6])[124]]
        assert dict(st) == expected[6]
        assert ring.open(sid)[key] == b"later"
        # no cache: each read is one lookup a node process answers; the same values
        remote = ring.open(sid, 6, cache_bytes=0)
        for k in sorted(expected[6])[::97]:
            assert remote[k] == expected[6][k]
        assert remote.chunks_fetched == 0 and remote.stats.parts == len(sorted(expected[6])[::97])
        partial = iter(st)  # a scan left half way does not disturb the next one
        next(partial)
        assert dict(st.items()) == expected[6]
        kept = ring.open(sid, 6)
    st.close()  # after the client: it holds nothing of the client's
    with pytest.raises(RuntimeError):
        kept[key]  # the client that fetches for it is closed
    kept.close()
    with pytest.raises(RuntimeError):
        st[key]


# -- no cache of its own: one lookup a node answers per read ---------------------------------
def _blocked_versions(seed: int) -> tuple[list[tuple[Ref, list[bytes], bool]], Ref]:
    """A snapshot of 30,000 keys in the default 4 MiB chunks (blocked), a delta that
    overwrites and adds, one that deletes; and the state they leave."""
    rng = random.Random(seed)
    base = {f"key-{i:06d}".encode(): rng.randbytes(150) for i in range(30_000)}
    over = {k: rng.randbytes(150) for k in rng.sample(sorted(base), 300)}
    over.update({f"new-{i}".encode(): rng.randbytes(40) for i in range(200)})
    gone = [k for k in rng.sample(sorted(base), 200) if k not in over] + [b"new-7"]
    commits = [(base, [], True), (over, [], False), ({}, gone, False)]
    return commits, _expected(commits)[3]


def _anchor(lazy: AsyncLazyState, key: bytes) -> str:
    path = block_path(lazy.chain, key)
    assert path
    return f"{path[-1][0]}/{path[-1][1].name}"


async def test_async_open_without_a_cache_reads_through_one_lookup_per_key(
    tmp_path: Path,
) -> None:
    """``open(cache_bytes=0)``: a point read is one ``POST .../lookup`` to a holder of the
    key's snapshot chunk, which reads the index and one block of each chunk along the chain
    from its own storage or, for the chunks it does not hold (R=2 of 3 nodes), from a
    replica, and keeps them decoded in its cache. The client fetches no part of a chunk;
    the newest version naming a key decides (overwrites, deletes, new keys, absent keys)."""
    sid = StoreId("open", 0, 10, "lookup")
    commits, want = _blocked_versions(seed=10)
    rng = random.Random(11)
    async with nodes(tmp_path, 3) as live, AsyncRingClient([live[0].address]) as ring:
        await _commit_all(ring, sid, commits)
        over, gone = commits[1][0], commits[2][1]
        keys = [
            *rng.sample(sorted(want), 30),
            *rng.sample(sorted(over), 10),
            *gone[:10],
            b"new-7",
            b"absent",
            b"",
        ]
        cold = await ring.open(sid, cache_bytes=0)
        cached = await ring.open(sid)
        for key in keys:
            assert await cold.get(key) == want.get(key), key
            assert await cached.get(key) == want.get(key), key
        assert cold.chunks_fetched == 0
        assert cold.stats.parts == len(keys)  # one request a read
        assert cold.bytes_fetched < 200 * len(keys)  # the values, not indexes and blocks
        # a reader with a cache fetched indexes and blocks instead
        assert cached.bytes_fetched > 10 * cold.bytes_fetched
        # get_many: one lookup per snapshot chunk the keys fall in, a thousand keys at most
        parts = cold.stats.parts
        many = [*keys, *rng.sample(sorted(want), 2500)]
        assert await cold.get_many(many) == {k: want[k] for k in many if k in want}
        per_anchor = Counter(_anchor(cold, k) for k in set(many))
        assert cold.stats.parts - parts == sum(
            -(-n // MAX_LOOKUP_KEYS) for n in per_anchor.values()
        )
        assert cold.stats.parts - parts < len(per_anchor) + 4
        assert cold.chunks_fetched == 0
        assert cold.cache_bytes == 0
        # a pinned older version reads the same way
        older = await ring.open(sid, 2, cache_bytes=0)
        for key in keys[30:45]:
            assert await older.get(key) == {**commits[0][0], **over}.get(key)
        # lookups chosen either way, whatever the cache
        by_parts = await ring.open(sid, cache_bytes=0, lookups=False)
        by_node = await ring.open(sid, lookups=True)
        for key in keys[:10]:
            assert await by_parts.get(key) == await by_node.get(key) == want.get(key)
        assert by_parts.stats.parts > 2 * by_node.stats.parts == 20
        with pytest.raises(ValueError):
            await ring.open(sid, lookups="yes")  # type: ignore[arg-type]


async def test_concurrent_point_reads_share_their_lookups(tmp_path: Path) -> None:
    """Point reads asked together (``asyncio.gather``, many readers of one opened state) go
    in shared lookups, one per node their snapshot chunks are read from (64 keys at most
    each), not a request a key (the first, finding nothing under way, sends its own); each
    reader gets its own key's value (duplicates, absent keys and deleted keys included). A
    shared lookup the node refuses (its answer past 32 MiB) is asked again a key a lookup,
    not read by parts."""
    sid = StoreId("open", 0, 15, "lookup")
    commits, want = _blocked_versions(seed=15)
    rng = random.Random(16)
    async with nodes(tmp_path, 3) as live, AsyncRingClient([live[0].address]) as ring:
        await _commit_all(ring, sid, commits)
        cold = await ring.open(sid, cache_bytes=0)
        gone = commits[2][1]
        keys = [*rng.sample(sorted(want), 300), *gone[:20], b"absent", b"new-3"]
        keys += keys[:40]  # the same key asked twice at once
        values = await asyncio.gather(*(cold.get(k) for k in keys))
        assert values == [want.get(k) for k in keys]
        # the first reader's own lookup (nothing else under way), then a lookup per node
        # the others' snapshot chunks are read from, 64 keys at most each
        anchors = {_anchor(cold, k) for k in keys}
        most = 1 + -(-len(set(keys)) // SHARED_LOOKUP_KEYS) + len(anchors)
        assert cold.stats.parts <= most < len(keys) // 10
        assert cold.chunks_fetched == 0
        before = cold.stats.parts
        assert await asyncio.gather(*(cold.get(k) for k in keys[:5])) == values[:5]
        assert cold.stats.parts - before <= 1 + len(anchors)  # five at once

    sid = StoreId("open", 0, 17, "lookup")
    big = {f"big-{i:02d}".encode(): rng.randbytes(1 << 20) for i in range(36)}
    async with (
        nodes(tmp_path / "big", 2, lookup_cache=0) as live,
        AsyncRingClient([live[0].address], chunk_size=64 << 20) as ring,
    ):
        await ring.commit(sid, 1, big, [], {}, epoch=1, snapshot=True)
        lazy = await ring.open(sid, cache_bytes=0)
        assert await asyncio.gather(*(lazy.get(k) for k in big)) == list(big.values())
        assert lazy.chunks_fetched == 0
        # the first's own; the others' shared one refused (not counted), then one a key
        assert lazy.stats.parts == len(big)


async def _lookup(node: object, sid: StoreId, body: bytes) -> tuple[int, bytes]:
    address = node.address  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"http://{address}/v1/stores/{sid.path}/lookup",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as r:
            return r.status, await r.read()


async def test_lookup_refuses_bad_bodies_and_trusts_only_what_its_reader_names(
    tmp_path: Path,
) -> None:
    """``POST .../lookup`` is typed and bounded: each bad body is a 400 that changes nothing;
    an index checksum no replica's bytes have is a 422, and the node's cache, which every
    reader shares, keeps nothing of it: the next reader, naming the right one, is answered."""
    sid = StoreId("open", 0, 11, "lookup")
    commits, want = _blocked_versions(seed=12)
    async with nodes(tmp_path, 2) as live, AsyncRingClient([live[0].address]) as ring:
        await _commit_all(ring, sid, commits)
        lazy = await ring.open(sid)
        key = sorted(want)[123]
        path = block_path(lazy.chain, key)
        assert path is not None and len(path) >= 2
        parts = [[v, r.name, r.lo, r.hi, r.size, r.index_len, r.index_checksum] for v, r in path]
        good = {"groups": lazy.key_groups, "keys": [key.hex()], "parts": parts}

        def body(**kw: object) -> bytes:
            return json.dumps({**good, **kw}).encode()

        def part(i: int, **kw: object) -> list[object]:
            fields = ["version", "name", "lo", "hi", "size", "index_len", "index_checksum"]
            p = dict(zip(fields, parts[i], strict=True)) | kw
            return [p[f] for f in fields]

        before = [state_of(n) for n in live]
        bad = [
            b"not json",
            b"{}",
            body(keys=[]),
            body(keys=["00"] * 1001),
            body(keys=["zz"]),
            body(groups=0),
            body(parts=[]),
            body(parts=parts * 200),
            body(parts=[part(0, name="../../other/0/0/x/1/s1-0123456789abcdef")]),
            body(parts=[part(0, lo=5, hi=4)]),
            body(parts=[part(0, hi=lazy.key_groups)]),
            body(parts=[part(0, index_len=parts[0][4])]),
            body(parts=[part(0, index_checksum=2**64)]),
            body(parts=[part(0, index_checksum=-1)]),
            body(parts=list(reversed(parts))),  # oldest first
            body(parts=[part(0), part(0)]),  # one chunk twice
            body(parts=[part(-1, lo=part(-1)[3], hi=part(-1)[3])] * 2),  # one group, twice
            body(keys=[key.hex(), key.hex()]),  # a key twice
            body(keys=[(b"%d" % i).rjust(60 * 1024, b"k").hex() for i in range(5)]),  # > 256 KiB
            body(parts=[part(0, size=2, index_len=1)]),  # no room for the index
            body(parts=[part(0, size=2**30, index_len=5 * 2**20)]),  # an index over 4 MiB
            # indexes over 16 MiB together
            body(
                parts=[part(0, version=v, size=2**30, index_len=4 * 2**20) for v in (9, 8, 7, 6, 5)]
            ),
            # a key looking into more chunks than a lookup reads for one key
            body(parts=[part(0, version=v, hi=lazy.key_groups - 1) for v in range(200, 135, -1)]),
        ]
        for b in bad:
            status, answer = await _lookup(live[0], sid, b)
            assert status == 400, (b[:80], status, answer[:200])
        assert [state_of(n) for n in live] == before
        # a checksum no copy has: refused, and nothing of it is cached for the next reader
        status, _ = await _lookup(live[0], sid, body(parts=[part(-1, index_checksum=12345)]))
        assert status == 422
        status, answer = await _lookup(live[0], sid, body())
        assert status == 200 and msgpack.unpackb(answer) == [want[key]]
        status, answer = await _lookup(live[0], sid, body(keys=[key.hex(), b"absent".hex()]))
        assert status == 200 and msgpack.unpackb(answer) == [want[key], None]


async def test_a_lookup_reads_each_part_a_replica_holds_once_whatever_its_keys(
    tmp_path: Path,
) -> None:
    """A node asked for a chunk it does not hold (R=2 of 3) reads the part from a replica
    once per request, however many keys look into it, even with no cache to keep it in
    between the keys it answers 16 at a time: a reader naming a checksum no copy has costs
    each holder one read, not one per key (and is answered 422)."""
    sid = StoreId("open", 0, 12, "lookup")
    commits, want = _blocked_versions(seed=13)
    async with (
        nodes(tmp_path, 3, lookup_cache=0) as live,
        AsyncRingClient([live[0].address]) as ring,
    ):
        await _commit_all(ring, sid, commits)
        lazy = await ring.open(sid)
        version, ref = next(
            (m.version, r) for m in reversed(lazy.chain) for r in m.chunks if r.rows
        )
        ckey = chunk_key(sid, version, ref.name)
        asked = next(n for n in live if n.store.get_chunk_part(ckey, 0, 1) is None)
        others = [n for n in live if n is not asked]
        keys = [k for k in sorted(want) if ref.lo <= key_group(k, lazy.key_groups) <= ref.hi]
        held = others[0].store.get_chunk_part(ckey, *index_span(ref.size, ref.index_len))
        assert held is not None
        index = parse_index(held[0])
        blocks = {index.find(key_group(k, lazy.key_groups), k) for k in keys[:200]}
        part = [version, ref.name, ref.lo, ref.hi, ref.size, ref.index_len, ref.index_checksum]

        async def reads() -> float:
            samples = [await scrape(n) for n in others]
            return sum(value(s, "statestore_chunk_seconds_count", op="get") for s in samples)

        for checksum, status in ((ref.index_checksum ^ 1, 422), (ref.index_checksum, 200)):
            before = await reads()
            wanted = {"groups": lazy.key_groups, "keys": [k.hex() for k in keys[:200]]}
            body = json.dumps(wanted | {"parts": [[*part[:-1], checksum]]}).encode()
            got, answer = await _lookup(asked, sid, body)
            assert got == status, answer[:300]
            # the index from one holder (every holder when none matches), then the blocks
            # (2 to spare for a replica's own reads meanwhile: reading the blocks once a
            # window of 16 keys would read 14 here)
            assert await reads() - before <= (2 if status == 422 else 3 + len(blocks))
        assert len(blocks) < 200 // 16  # blocks shared by windows of 16 keys: read once
        assert len(keys) >= 200


async def test_lookups_past_an_answers_bound_are_read_another_way(tmp_path: Path) -> None:
    """Values past what one lookup answers (32 MiB): the node refuses with 413, and the
    client reads those keys by groups (``get_many``) or by parts (``get``), exactly."""
    sid = StoreId("open", 0, 13, "lookup")
    rng = random.Random(14)
    big = {f"big-{i:02d}".encode(): rng.randbytes(1 << 20) for i in range(36)}
    async with (
        nodes(tmp_path, 2, lookup_cache=0) as live,  # nothing kept between requests
        AsyncRingClient([live[0].address], chunk_size=64 << 20) as ring,  # one snapshot chunk
    ):
        await ring.commit(sid, 1, big, [], {}, epoch=1, snapshot=True)
        lazy = await ring.open(sid, cache_bytes=0)
        assert await lazy.get_many([*big, b"absent"]) == big
        assert lazy.chunks_fetched > 0  # the lookups were refused: groups loaded
        for key in list(big)[:3]:
            assert await lazy.get(key) == big[key]
        path = block_path(lazy.chain, b"big-00")
        assert path is not None
        parts = {
            (v, r.name): [v, r.name, r.lo, r.hi, r.size, r.index_len, r.index_checksum]
            for k in big
            for v, r in block_path(lazy.chain, k) or []
        }
        body = {
            "groups": lazy.key_groups,
            "keys": [k.hex() for k in big],
            "parts": sorted(parts.values(), key=lambda p: (-p[0], p[2], p[3])),
        }
        status, answer = await _lookup(live[0], sid, json.dumps(body).encode())
        assert status == 413, answer[:300]


async def test_a_lookup_holds_what_it_reads_within_the_nodes_memory_budget(
    tmp_path: Path,
) -> None:
    """A lookup takes the parts it reads and the values it answers from the node's
    ``--memory-budget``, as a body is: one needing more than the whole budget is refused
    with 413 (well within a lookup's own bounds), the client reads those keys another way,
    and the node holds nothing of it afterwards."""
    sid = StoreId("open", 0, 14, "lookup")
    rng = random.Random(15)
    big = {f"big-{i:02d}".encode(): rng.randbytes(512 << 10) for i in range(12)}
    async with (
        nodes(tmp_path, 2, lookup_cache=0, memory_budget=4 << 20, max_body=3 << 20) as live,
        AsyncRingClient([live[0].address], chunk_size=2 << 20) as ring,
    ):
        await ring.commit(sid, 1, big, [], {}, epoch=1, snapshot=True)
        lazy = await ring.open(sid, cache_bytes=0)
        parts = {
            (v, r.name): [v, r.name, r.lo, r.hi, r.size, r.index_len, r.index_checksum]
            for k in big
            for v, r in block_path(lazy.chain, k) or []
        }
        body = {
            "groups": lazy.key_groups,
            "keys": [k.hex() for k in big],
            "parts": sorted(parts.values(), key=lambda p: (-p[0], p[2], p[3])),
        }
        status, answer = await _lookup(live[0], sid, json.dumps(body).encode())
        assert status == 413 and b"--memory-budget" in answer, answer[:300]
        assert live[0].budget.used == 0
        # a few keys fit: answered
        body["keys"] = body["keys"][:2]
        status, answer = await _lookup(live[0], sid, json.dumps(body).encode())
        assert status == 200 and msgpack.unpackb(answer) == [big[k] for k in list(big)[:2]]
        assert await lazy.get_many(list(big)) == big
        # its lookups went over a channel, which holds the message it reads for its life
        assert live[0].budget.used <= MESSAGE_BYTES
        await ring.close()  # the channel closed: nothing held
        await eventually(lambda: live[0].budget.used == 0, "the channel's room given back")


async def test_a_failed_lookup_of_get_many_stops_the_others(tmp_path: Path) -> None:
    """``get_many`` sends its lookups at once; when one fails, the failure is raised and
    the lookups still running are cancelled, not left to run on unawaited."""
    sid = StoreId("open", 0, 15, "lookup")
    rng = random.Random(16)
    state = {f"key-{i:05d}".encode(): rng.randbytes(200) for i in range(4000)}
    async with nodes(tmp_path, 2) as live, AsyncRingClient([live[0].address]) as ring:
        small = AsyncRingClient([live[0].address], chunk_size=64 << 10)
        async with small:
            await small.commit(sid, 1, state, [], {}, epoch=1, snapshot=True)
        lazy = await ring.open(sid, cache_bytes=0)
        assert len(lazy.chain[-1].chunks) > 4  # several snapshot chunks: several lookups
        real = lazy._lookup
        assert real is not None
        calls: list[str] = []
        cancelled: list[str] = []

        async def lookup(path: Any, keys: list[bytes], stats: Any) -> list[bytes | None]:
            name = path[-1][1].name
            calls.append(name)
            if len(calls) == 1:
                await asyncio.sleep(0.05)
                raise NodeUnavailable("the first lookup's node went away")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(name)
                raise
            return await real(path, keys, stats)

        lazy._lookup = lookup
        with pytest.raises(NodeUnavailable, match="went away"):
            await asyncio.wait_for(lazy.get_many(list(state)), 10)
        await asyncio.sleep(0)
        assert len(calls) > 2 and sorted(cancelled) == sorted(calls[1:])


async def test_point_reads_keep_the_rows_they_answered(tmp_path: Path) -> None:
    """An opened store keeps the rows its point reads answered (a quarter of
    ``cache_bytes``): keys read again are answered from them, though the blocks they came
    from (about 40 rows each) no longer fit the cache; absent keys too."""
    sid = StoreId("open", 0, 16, "lookup")
    commits, want = _blocked_versions(seed=17)
    rng = random.Random(18)
    async with nodes(tmp_path, 2) as live, AsyncRingClient([live[0].address]) as ring:
        await _commit_all(ring, sid, commits)
        lazy = await ring.open(sid, cache_bytes=4 << 20)
        keys = [*rng.sample(sorted(want), 1500), b"absent-1", b"absent-2"]
        for key in keys:
            assert await lazy.get(key) == want.get(key)
        fetched, misses = lazy.bytes_fetched, lazy.cache_misses
        assert lazy._blocks.size_bytes <= 1 << 20  # far from every block read
        for key in reversed(keys):
            assert await lazy.get(key) == want.get(key)
        assert (lazy.bytes_fetched, lazy.cache_misses) == (fetched, misses)
        assert lazy.cache_bytes <= 4 << 20


async def test_an_opened_version_whose_base_the_ring_thinned_reads_the_chain_it_has_now(
    tmp_path: Path,
) -> None:
    """A node folding a snapshot every delta (``snapshot_every=1``) thins version 3's
    snapshot away once newer ones are there (version 3 still retained: its chain is the
    snapshot of version 1 and the deltas above it again). States opened on version 3 while
    its chain was that snapshot, by blocks and by lookups, failed every read of a group they
    had not cached on the build before (no live holder of the chunk); now they read the
    version's chain again, and every read, scan and count is exact. Every version is
    committed as a delta (a version committed whole is never thinned, nor anything above
    it until the floor passes it: core/retention.py)."""
    sid = StoreId("open", 0, 17, "thinned")
    commits = _versions(seed=17)
    expected = _expected(commits)
    every = _every_key(commits)
    fast = {"replicas": 1, "write_quorum": 1, "snapshot_every": 1, "compact_interval": 0.2}
    async with (
        nodes(tmp_path, 1, **fast) as live,
        AsyncRingClient([live[0].address], chunk_size=CHUNK) as ring,
    ):
        for v, (puts, dels, _) in enumerate(commits[:3], 1):
            await ring.commit(sid, v, puts, dels, {"src": v}, epoch=1)

        async def folded() -> bool:
            return [m.version for m in (await ring.open(sid, 3)).chain] == [3]

        await eventually(folded, "version 3 folded into a snapshot")
        by_blocks = await ring.open(sid, 3)
        by_lookups = await ring.open(sid, 3, cache_bytes=0)
        first = by_blocks.chain[0].chunks[0]
        for key in every[:40:4]:  # blocks and rows cached before the base goes
            assert await by_blocks.get(key) == expected[3].get(key)
        for v, (puts, dels, _) in enumerate(commits[3:], 4):
            await ring.commit(sid, v, puts, dels, {"src": v}, epoch=1)

        async def gone() -> bool:
            try:
                await by_blocks._fetch_bytes(3, first, ReadStats())
            except NodeUnavailable:
                return True
            return False

        await eventually(gone, "version 3's snapshot chunks dropped", limit=60)
        assert [m.version for m in (await ring.open(sid, 3)).chain] != [3]
        for lazy in (by_lookups, by_blocks):
            for key in every[::3]:
                assert await lazy.get(key) == expected[3].get(key), key
            half = every[1::3]
            assert await lazy.get_many(half) == {
                k: expected[3][k] for k in half if k in expected[3]
            }
            assert await _scan(lazy) == expected[3]
            assert lazy.chain[0].version < 3 and lazy.chain[-1].version == 3
            assert lazy.version == 3 and lazy.head.epoch == 1
        assert await (await ring.open(sid, 3)).count() == len(expected[3])
