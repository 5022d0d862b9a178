"""An opened version whose history is rewritten under it: a newer writer commits a version
under it again, or its query is dropped and written anew from version 1. When a read fails
(a chunk's only holder busy once, or the chunks purged) the state reads its chain again:
a chain whose newest manifest, or any version both name, is another commit is not the same
state, and the version is gone (VersionNotFound, then on every read). The builds before
took any chain with the same newest version and epoch, and answered values of two states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import AsyncRingClient, NodeUnavailable, StoreId, StoreNotFound, VersionNotFound
from tests.ringkit import eventually, nodes


def _fail_next_chunk_read(ring: AsyncRingClient) -> dict[str, int]:
    """Once armed, every GET of a chunk (or a part of one) fails, as a busy holder's would,
    until the client reads a chain again (what a failed read of an opened state does)."""
    state = {"armed": 0, "failed": 0}
    real = ring._transport.request

    async def request(method: str, address: str, path: str, **kw: Any) -> Any:
        if state["armed"] and method == "GET" and "/chain?" in path:
            state["armed"] = 0
        if state["armed"] and method == "GET" and path.startswith("/v1/chunks/"):
            state["failed"] += 1
            raise NodeUnavailable(f"{address}: busy (injected)")
        return await real(method, address, path, **kw)

    ring._transport.request = request  # type: ignore[method-assign]
    return state


async def test_reads_after_version_not_found_fail_too(tmp_path: Path) -> None:
    """docs/client.md: a version that is gone "fails its next uncached read with
    VersionNotFound ..., and every read after it too". After the state said the version is
    gone (rewritten at epoch 2), reads go on answering the epoch-1 values."""
    sid = StoreId("r3", 0, 0, "default")
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1) as live,
        AsyncRingClient([live[0].address]) as ring,
        AsyncRingClient([live[0].address]) as newer,
    ):
        await ring.commit(
            sid, 1, {b"a": b"a1", b"b": b"b1", b"c": b"c1"}, [], {}, epoch=1, snapshot=True
        )
        await ring.commit(sid, 2, {b"a": b"a2", b"b": b"b2", b"c": b"c2"}, [], {}, epoch=1)
        st = await ring.open(sid, 2)
        assert await st.get(b"a") == b"a2"  # cached (rows, blocks)
        # a newer writer takes over from version 1 and commits version 2 again
        await newer.commit(
            sid, 2, {b"a": b"NEW", b"b": b"NEW", b"c": b"NEW"}, [], {}, epoch=2, base_epoch=1
        )
        st._blocks.clear()  # so that b's read fetches (its block was cached with a's)
        inj = _fail_next_chunk_read(ring)
        inj["armed"] = 1
        with pytest.raises(VersionNotFound):
            await st.get(b"b")
        assert inj["failed"] >= 1
        # "and every read after it too"
        problems = []
        for key in (b"a", b"c"):
            try:
                got = await st.get(key)
                problems.append((key, got))
            except VersionNotFound:
                pass
        assert not problems, f"reads after VersionNotFound answered: {problems}"


async def test_a_rewritten_base_is_not_mixed_into_an_opened_version(tmp_path: Path) -> None:
    """Version 3 (epoch 1) written by a client that names no base (a restarted writer:
    docs/client.md, Lineage). A newer writer (epoch 2) then commits version 2 again. After
    one transient failure the opened version-3 state reads its chain again: same top
    (version 3, epoch 1), so it takes the new chain, whose version 2 is epoch 2's, and
    answers epoch 2's values beside the epoch-1 values it cached: two states in one."""
    sid = StoreId("r3", 0, 1, "default")
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1) as live,
        AsyncRingClient([live[0].address]) as ring,
        AsyncRingClient([live[0].address]) as restarted,
        AsyncRingClient([live[0].address]) as newer,
        AsyncRingClient([live[0].address]) as reader,
    ):
        await ring.commit(sid, 1, {b"a": b"a1", b"b": b"b1"}, [], {}, epoch=1, snapshot=True)
        await ring.commit(sid, 2, {b"a": b"a2", b"b": b"b2"}, [], {}, epoch=1)
        await restarted.commit(sid, 3, {b"c": b"c3"}, [], {}, epoch=1)  # names no base
        st = await reader.open(sid, 3)
        assert [(m.version, m.epoch) for m in st.chain] == [(1, 1), (2, 1), (3, 1)]
        assert await st.get(b"a") == b"a2"
        await newer.commit(sid, 2, {b"a": b"NEW", b"b": b"NEW"}, [], {}, epoch=2, base_epoch=1)
        st._blocks.clear()
        inj = _fail_next_chunk_read(reader)
        inj["armed"] = 1
        # what the opened version held was a2 and b2; epoch 2's rewrite of version 2 is not
        # its state: gone, for every read
        with pytest.raises(VersionNotFound):
            await st.get(b"b")
        assert inj["failed"] >= 1
        with pytest.raises(VersionNotFound):
            await st.get(b"a")
        assert [(m.version, m.epoch) for m in st.chain] == [(1, 1), (2, 1), (3, 1)]


@pytest.mark.parametrize("cache_bytes", [64 << 20])
async def test_a_state_of_a_dropped_query_does_not_read_its_new_incarnation(
    tmp_path: Path, cache_bytes: int
) -> None:
    sid = StoreId("r4", 0, 0, "default")
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1) as live,
        AsyncRingClient([live[0].address]) as ring,
    ):
        await ring.commit(
            sid, 1, {b"a": b"old-a1", b"b": b"old-b1"}, [], {}, epoch=1, snapshot=True
        )
        await ring.commit(sid, 2, {b"a": b"old-a2", b"b": b"old-b2"}, [], {}, epoch=1)
        st = await ring.open(sid, 2, cache_bytes=cache_bytes)
        assert await st.get(b"a") == b"old-a2"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{live[0].address}/v1/queries/r4/drop") as r:
                assert r.status == 200, await r.text()
        async with AsyncRingClient([live[0].address]) as anew:
            await anew.commit(
                sid, 1, {b"a": b"NEW-a1", b"b": b"NEW-b1"}, [], {}, epoch=1, snapshot=True
            )
            await anew.commit(sid, 2, {b"a": b"NEW-a2", b"b": b"NEW-b2"}, [], {}, epoch=1)
        st._blocks.clear()  # b's block was read with a's
        with pytest.raises(VersionNotFound):
            await st.get(b"b")
        with pytest.raises(VersionNotFound):
            await st.get(b"a")


async def test_a_lookup_of_a_version_retention_dropped_is_refused(tmp_path: Path) -> None:
    """Lookups (``open(cache_bytes=0)``: the client keeps nothing) of a version retention
    dropped: the node's lookup cache still held its index and block, and the builds before
    answered from them. Now a lookup naming a version below the node's floor is refused, and
    the state finds the version gone."""
    sid = StoreId("r5", 0, 0, "default")
    fast = {
        "replicas": 1,
        "write_quorum": 1,
        "retain_versions": 2,
        "compact_interval": 0.2,
        "snapshot_every": 1,
    }
    async with (
        nodes(tmp_path, 1, **fast) as live,
        AsyncRingClient([live[0].address]) as ring,
    ):
        await ring.commit(sid, 1, {b"a": b"a1", b"b": b"b1"}, [], {}, epoch=1, snapshot=True)
        await ring.commit(sid, 2, {b"a": b"a2"}, [], {}, epoch=1)
        st = await ring.open(sid, 2, cache_bytes=0)  # lookups: the client keeps nothing
        assert await st.get(b"a") == b"a2"  # the node caches the index and block
        for v in range(3, 12):
            await ring.commit(sid, v, {b"a": f"a{v}".encode()}, [], {}, epoch=1)

        async def dropped() -> bool:
            try:
                await ring.open(sid, 2)
            except VersionNotFound:
                return True
            return False

        await eventually(dropped, "version 2 dropped by retention", limit=30)
        # every client cache is empty (cache_bytes=0): this read is uncached
        assert st.cache_bytes == 0
        with pytest.raises(VersionNotFound):
            await st.get(b"a")


async def test_a_lookup_of_a_dropped_query_is_not_answered_from_the_cache(
    tmp_path: Path,
) -> None:
    """A dropped query's values stayed in the node's lookup cache, and lookups naming its
    chunks were answered from it after the purge. Now the purge makes the cache forget the
    query."""
    sid = StoreId("r5", 0, 1, "default")
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1) as live,
        AsyncRingClient([live[0].address]) as ring,
    ):
        await ring.commit(sid, 1, {b"secret": b"s1"}, [], {}, epoch=1, snapshot=True)
        st = await ring.open(sid, 1, cache_bytes=0)
        assert await st.get(b"secret") == b"s1"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{live[0].address}/v1/queries/r5/drop") as r:
                assert r.status == 200
        with pytest.raises(StoreNotFound):
            await st.get(b"secret")
