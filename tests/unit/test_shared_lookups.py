"""Point reads of an opened state that share lookups (client/_open.py, ``_looked_up``),
without a ring: the lookup a node would answer is a function here, so that it can be slow,
fail for one key, or answer wrongly (tests/ring/test_open.py runs them against nodes).

What a reader must be able to count on: its own key's value; its own key's error (one
key's corrupt chunk or refused value is not every reader's); a reader that gives up takes
its lookup with it when nobody else waits on it (a slow node does not pile up abandoned
lookups ahead of new reads); and no reader waits forever, whatever the lookup does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from client._open import SHARED_LOOKUP_KEYS, AsyncLazyState, lookup_batches
from statestore.core.chunk import key_group
from statestore.core.errors import CorruptChunk, InvalidRequest, NodeUnavailable
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.net.reads import BlockPath, ReadStats

SID = StoreId("unit", 0, 1, "lookups")
# one blocked snapshot chunk over all 16 groups: every key's path is this chunk
REF = ChunkRef("s0-00000000000000aa", 0, 15, 1000, 1000, 10, 0xAA, 100, 0)
CHAIN = [Manifest(SID, 1, "snapshot", 1, 16, (REF,))]
Values = list[bytes | None]
Lookup = Callable[[BlockPath, Sequence[bytes], ReadStats], Awaitable[Values]]


def _opened(
    lookup: Lookup,
    concurrency: int = 16,
    chain: list[Manifest] = CHAIN,
    route: Callable[[int, ChunkRef], str] | None = None,
) -> AsyncLazyState:
    async def no_fetch(*_: object) -> bytes:
        raise AssertionError("a read by chunks or parts where a lookup was expected")

    return AsyncLazyState(
        SID,
        chain,
        1,
        fetch=no_fetch,
        fetch_part=no_fetch,
        lookup=lookup,
        route=route,
        concurrency=concurrency,
        cache_bytes=0,
    )


async def test_readers_asked_together_share_a_lookup_and_get_their_own_values() -> None:
    sent: list[list[bytes]] = []

    async def lookup(
        path: BlockPath, keys: Sequence[bytes], stats: ReadStats
    ) -> list[bytes | None]:
        sent.append(list(keys))
        await asyncio.sleep(0)
        return [None if k == b"absent" else b"v:" + k for k in keys]

    st = _opened(lookup)
    keys = [b"k%d" % i for i in range(100)] + [b"absent", b"k3", b"k3"]
    got = await asyncio.gather(*(st.get(k) for k in keys))
    assert got == [None if k == b"absent" else b"v:" + k for k in keys]
    # the first finds no lookup under way and sends its own; the 100 other distinct keys
    # asked meanwhile go in lookups of at most 64; each key asked once
    assert [len(s) for s in sent] == [1, SHARED_LOOKUP_KEYS, 100 - SHARED_LOOKUP_KEYS]
    assert sorted(k for s in sent for k in s) == sorted(set(keys))
    assert await st.get(b"k7") == b"v:k7"  # a lone reader: its own lookup
    assert sent[-1] == [b"k7"]


async def test_one_keys_error_is_its_own_and_a_lookups_error_is_shared() -> None:
    async def lookup(
        path: BlockPath, keys: Sequence[bytes], stats: ReadStats
    ) -> list[bytes | None]:
        await asyncio.sleep(0)
        if b"bad" in keys:
            raise CorruptChunk("a block of s0 is corrupt on every holder")
        if b"down" in keys:
            raise NodeUnavailable("no holder of s0 answers")
        return [b"v:" + k for k in keys]

    st = _opened(lookup)
    # (the first of each gather finds nothing under way: its own lookup; the rest share one)
    asked = [b"first", b"a", b"bad", b"b"]
    got = await asyncio.gather(*(st.get(k) for k in asked), return_exceptions=True)
    assert got[:2] == [b"v:first", b"v:a"] and got[3] == b"v:b"
    assert isinstance(got[2], CorruptChunk)
    # a lookup no holder answers fails every reader of it, as it would each of them alone
    asked = [b"first", b"c", b"down"]
    got = await asyncio.gather(*(st.get(k) for k in asked), return_exceptions=True)
    assert got[0] == b"v:first"
    assert all(isinstance(g, NodeUnavailable) for g in got[1:])


async def test_a_key_refused_alone_is_read_by_parts() -> None:
    parts: list[object] = []

    async def lookup(
        path: BlockPath, keys: Sequence[bytes], stats: ReadStats
    ) -> list[bytes | None]:
        if b"huge" in keys:
            raise InvalidRequest("lookup: its answer would be over 32 MiB")
        return [b"v:" + k for k in keys]

    async def part(*args: object) -> bytes:
        parts.append(args)
        raise NodeUnavailable("the parts' holder is down")

    async def no_fetch(*_: object) -> bytes:
        raise AssertionError("no chunk fetch")

    st = AsyncLazyState(
        SID, CHAIN, 1, fetch=no_fetch, fetch_part=part, lookup=lookup, cache_bytes=0
    )
    got = await asyncio.gather(*(st.get(k) for k in [b"a", b"huge"]), return_exceptions=True)
    assert got[0] == b"v:a"
    assert isinstance(got[1], NodeUnavailable) and parts  # it went on to read by parts


async def test_readers_that_give_up_take_their_lookup_with_them() -> None:
    """A slow node, readers each giving up after 50 ms: their lookups are cancelled (or
    never sent), so a new read waits for one lookup, not for the abandoned ones queued
    before it on the client's concurrency."""
    sent: list[bytes] = []
    running = 0

    async def lookup(
        path: BlockPath, keys: Sequence[bytes], stats: ReadStats
    ) -> list[bytes | None]:
        nonlocal running
        sent.extend(keys)
        running += 1
        try:
            await asyncio.sleep(0.5 if keys != [b"fresh"] else 0)
        finally:
            running -= 1
        return [b"v:" + k for k in keys]

    st = _opened(lookup, concurrency=2)
    for i in range(20):  # two at once: the second shares a lookup (the first sends its own)
        got = await asyncio.gather(
            *(asyncio.wait_for(st.get(b"k%d-%d" % (i, j)), 0.05) for j in range(2)),
            return_exceptions=True,
        )
        assert all(isinstance(g, TimeoutError) for g in got)
    await asyncio.sleep(0)
    assert running == 0  # every abandoned lookup was cancelled
    assert await st.get(b"fresh") == b"v:fresh"  # nothing abandoned holds a slot ahead of it

    # one of two readers gives up: the other still gets its value
    slow = asyncio.ensure_future(st.get(b"x"))
    kept = asyncio.ensure_future(st.get(b"y"))
    await asyncio.sleep(0.01)
    slow.cancel()
    assert await kept == b"v:y"


async def test_no_reader_waits_forever_on_a_lookup_that_answers_wrongly() -> None:
    async def lookup(
        path: BlockPath, keys: Sequence[bytes], stats: ReadStats
    ) -> list[bytes | None]:
        return [b"x"] * (len(keys) - 1)  # one value short

    st = _opened(lookup)
    got = await asyncio.wait_for(
        asyncio.gather(st.get(b"a"), st.get(b"b"), return_exceptions=True), 5
    )
    # a wrong answer is a refused one: each key asked alone, then read by parts (here failing)
    assert all(isinstance(g, Exception) for g in got), got


def test_lookups_are_cut_by_the_node_their_anchors_are_read_from() -> None:
    """Keys of several snapshot chunks go in one lookup when those chunks are read from the
    same node first, in lookup order (newest version first, groups in order)."""
    a = ChunkRef("s0-00000000000000aa", 0, 7, 1000, 1000, 10, 0xAA, 100, 0)
    b = ChunkRef("s1-00000000000000bb", 8, 15, 1000, 1000, 10, 0xBB, 100, 0)
    c = ChunkRef("s2-00000000000000cc", 16, 23, 1000, 1000, 10, 0xCC, 100, 0)
    d = ChunkRef("d0-00000000000000dd", 0, 23, 500, 500, 5, 0xDD, 50, 0)
    items = [(b"1", [(2, d), (1, b)]), (b"2", [(2, d), (1, a)]), (b"3", [(2, d), (1, c)])]
    by_anchor = lookup_batches(items)
    assert [keys for keys, _ in by_anchor] == [[b"1"], [b"2"], [b"3"]]
    node = {"s0-00000000000000aa": "n1", "s1-00000000000000bb": "n1", "s2-00000000000000cc": "n2"}
    routed = lookup_batches(items, route=lambda v, ref: node[ref.name])
    assert routed == [([b"1", b"2"], [(2, d), (1, a), (1, b)]), ([b"3"], [(2, d), (1, c)])]
    assert lookup_batches(items, most_keys=1, route=lambda v, ref: "n1") == [
        ([k], path) for k, path in items
    ]


# two snapshot chunks, groups 0-7 and 8-15, read first from the same node
LOW = ChunkRef("s0-00000000000000aa", 0, 7, 1000, 1000, 10, 0xAA, 100, 0)
HIGH = ChunkRef("s1-00000000000000bb", 8, 15, 1000, 1000, 10, 0xBB, 100, 0)
TWO = [Manifest(SID, 1, "snapshot", 1, 16, (LOW, HIGH))]


def _keys_in(lo: int, hi: int, n: int) -> list[bytes]:
    keys = (b"key-%d" % i for i in range(10_000))
    return [k for k in keys if lo <= key_group(k, 16) <= hi][:n]


async def test_a_snapshot_chunk_no_holder_answers_fails_its_keys_not_the_others() -> None:
    """Keys of two snapshot chunks share a lookup (one node reads both first); every holder
    of one is down: its keys get NodeUnavailable, the other's keys their values."""

    async def lookup(path: BlockPath, keys: Sequence[bytes], stats: ReadStats) -> Values:
        await asyncio.sleep(0)
        if any(ref.name == HIGH.name for _, ref in path):
            raise NodeUnavailable("no holder of s1 answers")
        return [b"v:" + k for k in keys]

    st = _opened(lookup, chain=TWO, route=lambda v, ref: "n1")
    low, high = _keys_in(0, 7, 3), _keys_in(8, 15, 2)
    asked = [low[0], low[1], high[0], low[2], high[1]]  # the first sends its own
    got = await asyncio.gather(*(st.get(k) for k in asked), return_exceptions=True)
    assert got[0] == b"v:" + low[0] and got[1] == b"v:" + low[1] and got[3] == b"v:" + low[2]
    assert isinstance(got[2], NodeUnavailable) and isinstance(got[4], NodeUnavailable)


async def test_a_route_that_fails_fails_its_readers_instead_of_hanging_them() -> None:
    async def lookup(path: BlockPath, keys: Sequence[bytes], stats: ReadStats) -> Values:
        await asyncio.sleep(0)
        return [b"v:" + k for k in keys]

    def route(v: int, ref: ChunkRef) -> str:
        raise LookupError("no ring view")

    st = _opened(lookup, route=route)
    got = await asyncio.wait_for(
        asyncio.gather(st.get(b"a"), st.get(b"b"), return_exceptions=True), 5
    )
    assert got[0] == b"v:a" and isinstance(got[1], LookupError)
