"""The reading rules of ``ring.open`` (client/_open.py) without a ring: which chunks a key
group's read fetches, which groups they hold whole, how they fold, how a scan walks the
version and how the cache of decoded groups stays within its bytes.

Chains are laid out by the real commit path (core/commit.py) with small chunks; the fetch
of a chunk is replaced by a look-up in the encoded chunks (the ring tests,
tests/ring/test_open.py, fetch them from nodes).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from client._open import _ABSENT, AsyncLazyState, _decode_split, _fold, _Lru, _Rows, _Scan
from statestore.core.cache import ROW_COST
from statestore.core.chunk import EncodedChunk, key_group, verify
from statestore.core.commit import build_commit
from statestore.core.errors import NodeUnavailable, VersionNotFound
from statestore.core.fold import apply
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.net.reads import ReadStats

SID = StoreId("unit", 0, 0, "open")
Ref = dict[bytes, bytes]


def _chain(
    seed: int, versions: int, groups: int = 16, chunk_size: int = 300, mixed: bool = False
) -> tuple[list[Manifest], dict[str, bytes], dict[int, Ref]]:
    """A snapshot then deltas of puts and deletes (every third with another number of key
    groups when ``mixed``); the manifests, the chunks' bytes by name, the states."""
    rng = random.Random(seed)
    state: Ref = {}
    chain: list[Manifest] = []
    data: dict[str, bytes] = {}
    states: dict[int, Ref] = {}
    for v in range(1, versions + 1):
        puts = {
            f"k{rng.randrange(600)}".encode(): rng.randbytes(rng.randrange(0, 30))
            for _ in range(rng.randrange(0, 250))
        }
        dels = (
            []
            if v == 1
            else [k for k in rng.sample(sorted(state), min(40, len(state))) if k not in puts]
        )
        g = groups if not (mixed and v % 3 == 2) else groups // 2 + 1
        m, chunks = build_commit(
            SID,
            v,
            puts,
            dels,
            {},
            1,
            v == 1,
            key_groups=g,
            chunk_size=chunk_size,
            max_chunk=1 << 20,
        )
        m = _renamed(m, chunks, v, data)
        chain.append(m)
        state.update(puts)
        for k in dels:
            state.pop(k, None)
        states[v] = dict(state)
    return chain, data, states


def _renamed(m: Manifest, chunks: list[EncodedChunk], v: int, data: dict[str, bytes]) -> Manifest:
    for c in chunks:
        data[f"{v}/{c.name}"] = c.data
    return m


def _lazy(chain: list[Manifest], data: dict[str, bytes], cache_bytes: int) -> AsyncLazyState:
    async def fetch(version: int, ref: ChunkRef, stats: ReadStats) -> bytes:
        body = data.get(f"{version}/{ref.name}")
        if body is None:  # no holder has it
            raise NodeUnavailable(f"chunk {version}/{ref.name} could not be read")
        verify(body, ref.checksum, ref.name)
        stats.chunks += 1
        stats.bytes += len(body)
        return body

    return AsyncLazyState(SID, chain, chain[-1].version, fetch=fetch, cache_bytes=cache_bytes)


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_each_span_holds_its_groups_whole_and_folds_to_the_state(seed: int, mixed: bool) -> None:
    chain, data, states = _chain(seed, 5, mixed=mixed)
    lazy = _lazy(chain, data, 1 << 20)
    groups = lazy.key_groups
    want = states[5]
    for g in range(groups):
        span = lazy._span(g)
        assert span.lo <= g <= span.hi
        for m, refs in span.parts:
            if m.key_groups == groups:  # exactly the chunks with rows that cover g
                assert list(refs) == [c for c in m.chunks if c.rows and c.lo <= g <= c.hi]
            else:
                assert list(refs) == [c for c in m.chunks if c.rows]
        splits = [
            _decode_split(data[f"{m.version}/{r.name}"], groups, 1 << 20, r.name)[0]
            for m, r in span.chunks()
        ]
        folded = _fold(span, splits, range(span.lo, span.hi + 1))
        for h in range(span.lo, span.hi + 1):
            assert folded[h] == {k: v for k, v in want.items() if key_group(k, groups) == h}


@pytest.mark.parametrize("cache_bytes", [0, 2000, 1 << 20])
@pytest.mark.parametrize("seed", range(2))
async def test_reads_and_scans_equal_the_state(seed: int, cache_bytes: int) -> None:
    chain, data, states = _chain(seed, 6, mixed=seed % 2 == 1)
    lazy = _lazy(chain, data, cache_bytes)
    want = states[6]
    keys = [f"k{i}".encode() for i in range(650)]
    for k in keys[::5]:
        assert await lazy.get(k) == want.get(k)
    assert await lazy.get_many(keys[1::2]) == {k: want[k] for k in keys[1::2] if k in want}
    assert lazy.cache_bytes <= cache_bytes
    scanned: Ref = {}
    async for k, v in lazy.items():
        assert k not in scanned
        scanned[k] = v
    assert scanned == want
    assert await lazy.count() == len(want)
    assert await lazy.get(b"absent") is None and not await lazy.has(b"absent")


async def test_a_scan_holds_only_the_chunks_that_reach_past_its_step() -> None:
    chain, data, states = _chain(11, 4, groups=64, chunk_size=200)
    lazy = _lazy(chain, data, 0)
    scan = _Scan(lazy)
    got: Ref = {}
    steps = 0
    while (rows := await scan.next()) is not None:
        steps += 1
        got.update(rows)
        for ref, _split in (scan.held or {}).values():
            assert ref.hi >= scan.next_group, "a chunk the scan is past is still held"
    assert got == states[4] and steps > 4
    # each chunk fetched once: those held across steps are not fetched again
    assert lazy.chunks_fetched == sum(1 for m in chain for c in m.chunks if c.rows)


def test_lru_keeps_within_its_bytes_and_evicts_the_least_recent() -> None:
    lru = _Lru(100)
    lru.put("a", 1, 40)
    lru.put("b", 2, 40)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3, 40)
    assert lru.get("b") is None and lru.get("a") == 1 and lru.get("c") == 3
    assert lru.bytes == 80 and len(lru) == 2
    lru.put("big", 4, 101)  # larger than the whole cache: not kept
    assert lru.get("big") is None and lru.bytes == 80
    lru.put("a", 5, 10)  # replaced, not counted twice
    assert lru.get("a") == 5 and lru.bytes == 50


def test_apply_rule_is_the_restores() -> None:
    state: Ref = {b"a": b"1", b"b": b"2"}
    apply(state, [(b"a", None), (b"c", b"3")])
    assert state == {b"b": b"2", b"c": b"3"}


def test_the_rows_point_reads_answered_stay_within_their_bytes() -> None:
    rows = _Rows(10 * (ROW_COST + 20))
    for i in range(30):
        rows.put(f"key-{i:04d}".encode(), None if i % 3 == 0 else b"v" * 12)
        assert rows.bytes <= rows.max_bytes
    # the least recently used went first; an absent key is remembered as absent
    assert rows.get(b"key-0000") is None and rows.get(b"key-0029") == b"v" * 12
    assert rows.get(b"key-0027") is _ABSENT
    rows.get(b"key-0022")  # used again: outlives the ones after it
    for i in range(30, 39):
        rows.put(f"key-{i:04d}".encode(), b"v" * 12)
    assert rows.get(b"key-0022") == b"v" * 12 and rows.get(b"key-0023") is None
    rows.put(b"big", b"x" * rows.max_bytes)  # larger than the whole: not kept
    assert rows.get(b"big") is None and rows.bytes <= rows.max_bytes
    rows.clear()
    assert rows.bytes == 0 and rows.get(b"key-0022") is None


def _folded(states: dict[int, Ref], v: int, data: dict[str, bytes], epoch: int = 1) -> Manifest:
    """A snapshot of version ``v`` (what compaction folds), its chunks added to ``data``."""
    m, chunks = build_commit(
        SID, v, states[v], [], {}, epoch, True, key_groups=16, chunk_size=300, max_chunk=1 << 20
    )
    assert not any(f"{v}/{c.name}" in data for c in chunks)
    return _renamed(m, chunks, v, data)


async def test_a_read_no_holder_answers_reads_the_versions_chain_again() -> None:
    """Opened on a snapshot of version 5 that goes (the nodes thinned it), every read (point
    reads, ``get_many``, a scan begun before it went) reads the chain the version has now,
    read again once for readers that failed together; what was cached stays."""
    chain, data, states = _chain(7, 5)
    snap = _folded(states, 5, data)
    rechains: list[int] = []

    async def rechain() -> list[Manifest]:
        rechains.append(1)
        await asyncio.sleep(0.01)
        return chain

    base = _lazy([snap], data, 1 << 20)
    lazy = AsyncLazyState(
        SID, [snap], 5, fetch=base._fetch_bytes, rechain=rechain, cache_bytes=1 << 20
    )
    keys = sorted({f"k{i}".encode() for i in range(620)})
    want = states[5]
    scan = lazy.spans()
    first = await anext(scan)
    assert await lazy.get(keys[0]) == want.get(keys[0])
    for c in snap.chunks:  # the snapshot goes
        del data[f"5/{c.name}"]
    got = await asyncio.gather(*(lazy.get(k) for k in keys))
    assert got == [want.get(k) for k in keys]
    assert len(rechains) == 1 and lazy.chain == tuple(chain) and lazy.stats.chain == 5
    assert await lazy.get_many(keys) == {k: v for k, v in want.items() if k in set(keys)}
    rest = [rows async for rows in scan]
    assert {k: v for rows in [first, *rest] for k, v in rows.items()} == want
    assert len(rechains) == 1


async def test_a_read_no_holder_answers_fails_when_the_chain_is_the_same_or_gone() -> None:
    """The read's own failure when the chain read again is the same or cannot be read;
    VersionNotFound when the version is no longer held or another writer committed it
    again."""
    chain, data, states = _chain(8, 4)
    answers: list[object] = []

    async def rechain() -> list[Manifest]:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, list)
        return answer

    base = _lazy(chain, data, 0)
    for c in chain[0].chunks:
        del data[f"1/{c.name}"]
    other = _folded(states, 4, data, epoch=2)
    cases: list[tuple[object, type[Exception], str]] = [
        (list(chain), NodeUnavailable, "could not be read"),  # the same chain
        (NodeUnavailable("no seed answered"), NodeUnavailable, "could not be read"),
        (VersionNotFound("below the floor"), VersionNotFound, "no longer held"),
        ([other], VersionNotFound, "committed it, or a version under it, again"),
    ]
    for answer, raised, says in cases:
        lazy = AsyncLazyState(
            SID, chain, 4, fetch=base._fetch_bytes, rechain=rechain, cache_bytes=0
        )
        answers.append(answer)
        with pytest.raises(raised, match=says):
            await lazy.get(b"k1")
        assert not answers and lazy.chain == tuple(chain)


async def test_readers_that_failed_together_share_one_read_of_the_chain() -> None:
    """Sixteen readers of groups no holder serves, the chain unchanged: one chain read for
    all of them (not one each, one after another), each given the read's own failure; and
    a version found gone fails the next reads without reading the chain again."""
    chain, _data, _states = _chain(7, 5)
    answers: list[object] = []

    async def rechain() -> list[Manifest]:
        answer = answers.pop(0)
        await asyncio.sleep(0.01)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, list)
        return answer

    async def fetch(version: int, ref: ChunkRef, stats: ReadStats) -> bytes:
        raise NodeUnavailable("every holder is down")

    lazy = AsyncLazyState(SID, chain, 5, fetch=fetch, rechain=rechain, cache_bytes=0)
    by_group = {key_group(f"k{i}".encode(), lazy.key_groups): f"k{i}".encode() for i in range(600)}
    assert len(by_group) == 16
    answers.append(list(chain))
    got = await asyncio.gather(*(lazy.get(k) for k in by_group.values()), return_exceptions=True)
    assert all(isinstance(e, NodeUnavailable) for e in got), got
    assert not answers  # one chain read
    answers.append(VersionNotFound("below the floor"))
    for _ in range(3):
        with pytest.raises(VersionNotFound, match="no longer held"):
            await lazy.get(b"k1")
    assert not answers  # gone once, gone for good: no more chain reads


async def test_a_read_after_the_chain_moved_does_not_wait_on_a_load_along_the_old_one() -> None:
    """Reader A's group load fails on the snapshot the nodes dropped; while A reads the
    chain again, reader B starts a load of the same span along the old chain (slow: its
    fetches fail over). A's read along the new chain loads on its own: on the build
    before it joined B's load and failed with it."""
    chain, data, states = _chain(7, 5)
    snap = _folded(states, 5, data)
    base = _lazy([snap], data, 1 << 20)
    slow: set[tuple[int, str]] = set()

    async def fetch(version: int, ref: ChunkRef, stats: ReadStats) -> bytes:
        if (version, ref.name) in slow:
            await asyncio.sleep(0.3)  # a failover, a refresh of the view, a retry
        return await base._fetch_bytes(version, ref, stats)

    async def rechain() -> list[Manifest]:
        await asyncio.sleep(0.05)
        return chain

    lazy = AsyncLazyState(SID, [snap], 5, fetch=fetch, rechain=rechain, cache_bytes=1 << 20)
    for c in snap.chunks:
        del data[f"5/{c.name}"]
    key = b"k1"
    span = lazy._span(key_group(key, lazy.key_groups))
    a = asyncio.ensure_future(lazy.get(key))
    await asyncio.sleep(0.01)  # A failed and reads the chain again
    slow.update((m.version, ref.name) for m, ref in span.chunks())
    other = next(
        k
        for k in (f"k{i}".encode() for i in range(600))
        if k != key and span.lo <= key_group(k, lazy.key_groups) <= span.hi
    )
    b = asyncio.ensure_future(lazy.get(other))
    assert list(await asyncio.gather(a, b)) == [states[5].get(key), states[5].get(other)]
