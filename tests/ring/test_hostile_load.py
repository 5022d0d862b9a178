"""A node under a load meant to exhaust it (issue: the second hostile round, outage): the
memory budget over concurrent commits, and over the restores a node builds for its callers
(hostile review 3: eight restores of a 48 MiB state at once through one node, ``GET
.../state`` or a tree hop's fold, were held side by side whatever ``--memory-budget`` said),
on a real node process."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from statestore.cli.local import NodeProcess
from statestore.core.chunk import EncodedChunk, encode_chunks
from statestore.core.fold import TREE_ROW_HELD
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.plan import ChunkTask, Hop
from statestore.net import restorer as restorer_module
from statestore.net.restorer import FoldHold, Restorer
from statestore.node import relay
from statestore.node.budget import Lease
from statestore.node.compaction import compact_store
from statestore.node.daemon import Node
from statestore.node.request import PacedAnswer
from statestore.wire.frames import HEADER, encode_hop
from statestore.wire.manifest import decode_chain
from statestore.wire.rows import encode_puts
from tests.ringkit import nodes, peak_rss

MIB = 1 << 20


def budgeted_node(tmp_path: Path) -> NodeProcess:
    """A node process with a 64 MiB memory budget, taking bodies and commits of 16 MiB."""
    node = NodeProcess(
        str(tmp_path / "n"),
        0,
        ["--no-dht", "--storage", "memory://", "--replicas", "1", "--write-quorum", "1",
         "--max-body", str(16 * MIB), "--max-commit", str(16 * MIB),
         "--memory-budget", str(64 * MIB)],
    )  # fmt: skip
    node.start([])
    return node


async def test_concurrent_commits_are_held_to_the_memory_budget(tmp_path: Path) -> None:
    """Eight 16 MiB coordinator commits at once used to be chunked side by side (about 3.3x
    their bodies each, ~420 MiB); under a 64 MiB budget they take turns and all land."""
    node = budgeted_node(tmp_path)
    try:
        assert node.proc is not None
        # 16 MiB of rows that compress to almost nothing: memory:// holds little afterwards
        keys = [b"k%07d" % i for i in range(4096)]
        body = encode_puts(keys, [b"v" * (4 * 1024 - 64)] * len(keys))
        assert 15 * MIB < len(body) <= 16 * MIB
        async with aiohttp.ClientSession() as s:
            before = peak_rss(node.proc.pid)

            async def commit(p: int) -> int:
                url = f"http://{node.address}/v1/stores/q/0/{p}/s/commit?version=1&epoch=1"
                async with s.post(url, data=io.BytesIO(body)) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(commit(p) for p in range(8)))
            grew = peak_rss(node.proc.pid) - before
            assert statuses == [201] * 8
            # one commit at a time (3 x 16 MiB taken of 64): its body, rows and chunks
            assert grew < 160 * MIB, f"peak RSS grew {grew / MIB:.0f} MiB"
    finally:
        node.stop()


STORE = "q/0/0/s"
VERSIONS = 3
KEYS = 4096  # a version: 4,096 rows of ~4 KiB, 16 MiB, compressing to almost nothing


def _value(v: int, i: int) -> bytes:
    return b"%d:%07d:" % (v, i) + b"v" * (4 * 1024 - 80)


def _tasks(store: StoreId, chain: list[Manifest], holder: str) -> tuple[ChunkTask, ...]:
    """A restorer's tasks for ``chain``'s chunks, all held by ``holder``."""
    return tuple(
        ChunkTask(chunk_key(store, m.version, c.name), pos, m.version, c.name, c.checksum,
                  c.size, c.raw_size, c.rows, (holder,), c.lo, c.hi)
        for pos, m in enumerate(chain)
        for c in m.chunks
    )  # fmt: skip


async def _node_with_state(tmp_path: Path) -> NodeProcess:
    node = budgeted_node(tmp_path)
    async with aiohttp.ClientSession() as s:
        for v in range(1, VERSIONS + 1):  # distinct keys a version: 48 MiB of state at v3
            keys = [b"k%d-%07d" % (v, i) for i in range(KEYS)]
            body = encode_puts(keys, [_value(v, i) for i in range(KEYS)])
            url = f"http://{node.address}/v1/stores/{STORE}/commit?version={v}&epoch=1"
            async with s.post(url, data=io.BytesIO(body)) as r:
                assert r.status == 201, await r.text()
    return node


async def test_restores_through_a_node_take_turns_under_its_budget(tmp_path: Path) -> None:
    """Eight restores of a 48 MiB state at once: each now takes what its fold will hold
    (the chain's raw bytes and a per-row allowance) before it reads a chunk, so under a
    64 MiB budget they run one after another, and every one answers the whole state."""
    node = await _node_with_state(tmp_path)
    try:
        assert node.proc is not None
        async with aiohttp.ClientSession() as s:
            before = peak_rss(node.proc.pid)

            async def restore() -> tuple[int, int]:
                url = f"http://{node.address}/v1/stores/{STORE}/state?plan=star"
                async with s.get(url) as r:
                    body = await r.read()
                    return r.status, len(body)

            answers = await asyncio.gather(*(restore() for _ in range(8)))
            grew = peak_rss(node.proc.pid) - before
        assert {status for status, _ in answers} == {200}
        assert len({size for _, size in answers}) == 1
        assert answers[0][1] > VERSIONS * KEYS * 4000  # the whole state, every time
        # one restore at a time: its chunks decoded, the state and the answer's lists
        assert grew < 160 * MIB, f"peak RSS grew {grew / MIB:.0f} MiB"
    finally:
        node.stop()


async def test_tree_folds_are_held_to_the_budget(tmp_path: Path) -> None:
    """Eight tree hops at once, each folding the store's three versions held on the node
    (``POST /v1/relay`` with a folding plan, as a restorer's tree sends it): each takes what
    its rows hold before merging them, and one that finds no room fails at once (an E frame:
    its parent fetches the chunks itself) rather than folding beside the others or waiting;
    every answer is a whole stream, and the budget is all given back."""
    node = await _node_with_state(tmp_path)
    try:
        assert node.proc is not None
        store = StoreId.parse(STORE)
        async with aiohttp.ClientSession() as s:
            url = f"http://{node.address}/v1/stores/{STORE}/chain?version={VERSIONS}"
            async with s.get(url) as r:
                assert r.status == 200
                chain = decode_chain(await r.read())
            tasks = _tasks(store, chain, node.address)
            plan = encode_hop(store, Hop(node.address, tasks), True, 0, chain[-1].key_groups)
            before = peak_rss(node.proc.pid)

            async def fold() -> tuple[int, bytes]:
                url = f"http://{node.address}/v1/relay?store={STORE}"
                async with s.post(url, data=plan) as r:
                    return r.status, await r.read()

            answers = await asyncio.gather(*(fold() for _ in range(8)))
            grew = peak_rss(node.proc.pid) - before
            async with s.get(f"http://{node.address}/metrics") as r:
                metrics = await r.text()
        assert {status for status, _ in answers} == {200}
        folds = []
        for _, frames in answers:
            kinds = []
            at = 0
            while at < len(frames):  # whole frames to the end: no error answer inside
                kind, meta_len, data_len = HEADER.unpack_from(frames, at)
                kinds.append(kind)
                at += HEADER.size + meta_len + data_len
            assert at == len(frames)
            # folded (its covers, its rows, its stats), or refused
            folded = kinds[0] == b"D" and kinds[-1] == b"D" and set(kinds[1:-1]) == {b"F"}
            assert folded or kinds == [b"E"], kinds
            folds.append(folded)
        assert any(folds)
        assert "statestore_memory_budget_used_bytes 0.0" in metrics
        assert grew < 160 * MIB, f"peak RSS grew {grew / MIB:.0f} MiB"
    finally:
        node.stop()


def _restore_takes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes restores take from leases from now on, as they are taken."""
    taken: list[int] = []
    take = Lease.take

    async def recorded(self: Lease, nbytes: int, what: str, patient: bool = True) -> None:
        if "restore" in what:
            taken.append(nbytes)
        await take(self, nbytes, what, patient)

    monkeypatch.setattr(Lease, "take", recorded)
    return taken


@pytest.mark.parametrize("plan", ["star", "line", "tree"])
async def test_a_restore_takes_what_understated_chunks_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: str
) -> None:
    """A restore through a node reserves its fold from the chain's manifests, a writer's
    word. A writer whose manifests claim 10 raw bytes and 1 row for each chunk of 2,048 rows
    of 1 KiB made the node's restores of its store reserve a few hundred bytes and hold over
    2 MiB (hostile review 5, left open then). Now the rows it decodes beyond all it took are
    taken as it goes, chunks and a tree's folded rows alike (a review of the fix found the
    tree's left out), and it still answers the state whole."""
    taken = _restore_takes(monkeypatch)
    store = StoreId.parse(STORE)
    rows = {b"k%05d" % i: bytes([i % 251]) * 1024 for i in range(2048)}
    chunks = encode_chunks(rows, [], target_size=256 << 10)
    held = sum(len(k) + len(v) for k, v in rows.items())
    async with nodes(tmp_path, 3, replicas=3, write_quorum=3) as ring:
        refs = tuple(dataclasses.replace(ChunkRef.of(c), raw_size=10, rows=1) for c in chunks)
        for node in ring:
            for c in chunks:
                node.store.put_chunk(chunk_key(store, 1, c.name), c.data)
            node.store.put_manifest(Manifest(store, 1, "snapshot", 1, 128, refs, {}))
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://{ring[0].address}/v1/stores/{STORE}/state?plan={plan}") as r,
        ):
            assert r.status == 200, await r.text()
            answer = await r.read()
        assert all(k in answer and v in answer for k, v in list(rows.items())[::256])
        assert sum(taken) >= held, taken
        assert all(node.budget.used == 0 for node in ring)


async def _commit(s: aiohttp.ClientSession, node: Node, v: int, n: int, store: str = STORE) -> int:
    """Version ``v`` of ``store``: ``n`` rows of 1,000 random bytes; the bytes written."""
    keys = [b"k%d-%05d" % (v, i) for i in range(n)]
    body = encode_puts(keys, [os.urandom(1000) for _ in keys])
    url = f"http://{node.address}/v1/stores/{store}/commit?version={v}&epoch=1"
    async with s.post(url, data=io.BytesIO(body)) as r:
        assert r.status == 201, await r.text()
    return sum(len(k) + 1000 for k in keys)


async def test_compaction_folds_within_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's compaction restores a store's head to write it back as a snapshot: that fold
    held the whole state outside ``--memory-budget`` (hostile review 5, left open then).
    Now it takes what it holds, as far as there is room (up to half the budget), and gives
    it back before the snapshot's chunks are written."""
    taken = _restore_takes(monkeypatch)
    store = StoreId.parse(STORE)
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1, snapshot_every=2, compact_interval=3600) as (
            node,
        ),
        aiohttp.ClientSession() as s,
    ):
        written = sum([await _commit(s, node, v, 2000) for v in (1, 2, 3)])
        assert not node.store.manifests(store)[1]  # no snapshot yet
        assert await compact_store(node, node.view(), store)
        assert node.store.manifests(store)[1]  # folded
        assert sum(taken) >= written, taken
        assert node.budget.used == 0


@pytest.mark.parametrize("n", [1, 2])
async def test_compaction_near_the_budget_writes_its_snapshot(tmp_path: Path, n: int) -> None:
    """A first build of the fix above held the fold while the snapshot's chunks were
    written, and each write takes its chunk from the budget of the node it goes to, this
    one's too: with the fold and a chunk over the budget, the node refused its own
    snapshot's chunks (429 after the body timeout), every pass, wherever its copy was
    needed for the write quorum (a review of the fix found it)."""
    store = StoreId.parse(STORE)
    async with (
        nodes(tmp_path, n, replicas=n, write_quorum=n, snapshot_every=2, compact_interval=3600,
              memory_budget=8 * MIB, max_body=5 * MIB, body_timeout=2.0) as ring,
        aiohttp.ClientSession() as s,
    ):  # fmt: skip
        for v in range(1, 5):  # 6 MB of state
            await _commit(s, ring[0], v, 1500)
        leader = next(x for x in ring if x.view().store_replicas(store)[0] == x.address)
        assert await compact_store(leader, leader.view(), store)
        assert leader.store.manifests(store)[1]


async def _slow_commit(address: str, store: str, version: int, seconds: float) -> None:
    """One honest commit whose body takes ``seconds`` to arrive (a writer on a busy link)."""
    body = encode_puts([b"x%04d" % i for i in range(100)], [b"y" * 200] * 100)
    host, port = address.rsplit(":", 1)
    reader, w = await asyncio.open_connection(host, int(port))
    w.write(
        f"POST /v1/stores/{store}/commit?version={version}&epoch=1 HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    step = len(body) // 6 + 1
    for i in range(0, len(body), step):
        w.write(body[i : i + step])
        await w.drain()
        await asyncio.sleep(seconds / 6)
    await reader.read()
    w.close()


async def test_compaction_runs_under_steady_load(tmp_path: Path) -> None:
    """A first build of the fix above reserved the fold (its whole size, or the whole
    budget for a fold larger than it) and waited for room: two writers whose slow commits
    overlap never left the budget empty, so a fold larger than it never ran and the store's
    chain grew without bound (a review of the fix found it). Compaction never waits now."""
    store = StoreId.parse(STORE)
    async with (
        nodes(tmp_path, 1, replicas=1, write_quorum=1, snapshot_every=2, compact_interval=3600,
              memory_budget=16 * MIB, max_body=5 * MIB, body_timeout=2.0) as (node,),
        aiohttp.ClientSession() as s,
    ):  # fmt: skip
        for v in range(1, 7):  # 18 MB of state, over the budget
            await _commit(s, node, v, 3000)
        stop = asyncio.Event()

        async def writer(name: str, offset: float) -> None:
            await asyncio.sleep(offset)
            v = 1
            while not stop.is_set():
                await _slow_commit(node.address, f"q1/0/1/{name}", v, 1.5)
                v += 1

        load = [asyncio.create_task(writer("w1", 0)), asyncio.create_task(writer("w2", 0.75))]
        try:
            await asyncio.sleep(0.3)
            assert await compact_store(node, node.view(), store)
            assert node.store.manifests(store)[1]
        finally:
            stop.set()
            await asyncio.gather(*load, return_exceptions=True)


async def test_a_tree_hop_takes_a_chunk_before_it_decodes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree hop took each chunk's rows from the budget once it had decoded them, so each
    hop could hold a decoded chunk it was then refused room for (hostile review 5). Now it
    takes what the plan says its own chunks hold (their manifests' raw sizes and rows)
    before it reads the first, and trues each up once decoded."""
    seen: list[tuple[int, int]] = []  # (the budget's use when a chunk is decoded, its claim)
    decode = relay.decode_chunk
    store = StoreId.parse(STORE)
    async with nodes(tmp_path, 1, replicas=1, write_quorum=1) as (node,):
        claims: dict[int, int] = {}

        def recorded(data: bytes, **kw: object) -> object:
            seen.append((node.budget.used, claims[len(data)]))
            return decode(data, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(relay, "decode_chunk", recorded)
        async with aiohttp.ClientSession() as s:
            for v in (1, 2):
                keys = [b"k%d-%05d" % (v, i) for i in range(3000)]
                body = encode_puts(keys, [bytes([v]) * 500] * len(keys))
                url = f"http://{node.address}/v1/stores/{STORE}/commit?version={v}&epoch=1"
                async with s.post(url, data=io.BytesIO(body)) as r:
                    assert r.status == 201, await r.text()
            url = f"http://{node.address}/v1/stores/{STORE}/chain?version=2"
            async with s.get(url) as r:
                chain = decode_chain(await r.read())
            tasks = _tasks(store, chain, node.address)
            claims.update({t.size: t.raw_size + t.rows * TREE_ROW_HELD for t in tasks})
            plan = encode_hop(store, Hop(node.address, tasks), True, 0, chain[-1].key_groups)
            async with s.post(f"http://{node.address}/v1/relay?store={STORE}", data=plan) as r:
                assert r.status == 200
                frames = await r.read()
        assert HEADER.unpack_from(frames, 0)[0] == b"D"  # folded, not refused
        assert len(seen) == len(tasks) >= 2
        left = sum(claim for _, claim in seen)
        for used, claim in seen:  # the claims of the chunks not yet decoded are held
            assert used >= left, seen
            left -= claim
        assert node.budget.used == 0


def _kib_rows(version: int, n: int) -> list[EncodedChunk]:
    """``n`` rows of 1 KiB (distinct per version), chunked as a writer chunks them."""
    rows = {b"v%d-%06d" % (version, i): bytes([i % 251]) * 1024 for i in range(n)}
    return encode_chunks(rows, [], target_size=1 << 20)


def _honest(
    version: int, chunks: list[EncodedChunk], holders: tuple[str, ...]
) -> tuple[ChunkTask, ...]:
    """Tasks for ``chunks`` of STORE, their claims the chunks' true raw sizes and rows."""
    store = StoreId.parse(STORE)
    return tuple(
        ChunkTask(chunk_key(store, version, c.name), version - 1, version, c.name, c.checksum,
                  len(c.data), c.raw_size, c.rows, holders, c.lo, c.hi)
        for c in chunks
    )  # fmt: skip


def _absent(store: StoreId, holder: str) -> tuple[ChunkTask, ...]:
    """Four tasks for chunks no node holds, each claimed at 3 MiB, said held by ``holder``."""
    names = [f"d{i}-{i + 1:016x}" for i in range(4)]
    return tuple(
        ChunkTask(chunk_key(store, 1, name), 0, 1, name, i + 1, 100, 3 * MIB, 1, (holder,), 0, 0)
        for i, name in enumerate(names)
    )


async def _relay_frames(address: str, plan: bytes) -> list[tuple[bytes, dict[str, object]]]:
    """The frames (kind, meta) a hop answers ``plan`` with."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://{address}/v1/relay?store={STORE}", data=plan) as r,
    ):
        assert r.status == 200, await r.text()
        body = await r.read()
    frames, at = [], 0
    while at < len(body):
        kind, meta_len, data_len = HEADER.unpack_from(body, at)
        meta = msgpack.unpackb(body[at + HEADER.size : at + HEADER.size + meta_len])
        frames.append((kind, meta))
        at += HEADER.size + meta_len + data_len
    return frames


async def test_a_tree_hop_gives_back_the_claims_of_chunks_it_lacks(tmp_path: Path) -> None:
    """A first build of the up-front claims (above) kept the claims of the hop's chunks it
    did not hold (a replaced disk not yet repaired: the restorer fetches them elsewhere)
    until the request ended: hop A, planned 9 MiB it had lost, had no room left for its
    child's 5 MiB fold under a 16 MiB budget, and refused it (a review found it)."""
    store = StoreId.parse(STORE)
    async with nodes(
        tmp_path, 2, replicas=2, write_quorum=2, memory_budget=16 * MIB, max_body=4 * MIB
    ) as (a, b):
        lost, theirs = _kib_rows(1, 9 * 1024), _kib_rows(2, 5 * 1024)
        for c in theirs:
            b.store.put_chunk(chunk_key(store, 2, c.name), c.data)
        child = _honest(2, theirs, (b.address,))
        hop = Hop(a.address, _honest(1, lost, (a.address, b.address)), (Hop(b.address, child),))
        frames = await _relay_frames(a.address, encode_hop(store, hop, True, 0, 0))
        assert not [m for k, m in frames if k == b"E"], frames
        covers = next(m["covers"] for k, m in frames if k == b"D" and "covers" in m)
        assert set(covers) == {t.key for t in child}  # type: ignore[union-attr]
        assert a.budget.used == 0 and b.budget.used == 0


async def test_a_plan_naming_chunks_a_hop_lacks_holds_nothing(tmp_path: Path) -> None:
    """A requester with read rights named four chunks node A does not hold, each claimed at
    3 MiB, and A held 12 of its 16 MiB with nothing behind it for as long as the hop ran
    (its child here takes 2 s), on the same first build (the review above)."""
    store = StoreId.parse(STORE)
    async with nodes(
        tmp_path, 2, replicas=2, write_quorum=2, memory_budget=16 * MIB, max_body=4 * MIB
    ) as (a, b):
        fake = _absent(store, a.address)

        class SlowEmpty:  # a child that ends cleanly, with no frame, after 2 s
            async def readexactly(self, n: int) -> bytes:
                raise asyncio.IncompleteReadError(b"", n)

            def close(self) -> None:
                pass

        async def slow(address: str, path: str, body: bytes, **kw: object) -> SlowEmpty:
            await asyncio.sleep(2)
            return SlowEmpty()

        a.transport.open_stream = slow  # type: ignore[method-assign]
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, a.budget.used)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            hop = Hop(a.address, fake, (Hop(b.address, ()),))
            await _relay_frames(a.address, encode_hop(store, hop, True, 0, 0))
        finally:
            watcher.cancel()
        assert peak < MIB, f"A held {peak / MIB:.1f} MiB for chunks it does not have"


async def test_restores_of_an_understated_store_stay_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's manifests claim 10 bytes and 1 row for each chunk of a 2 MiB state: a
    restore of it reserves a few hundred bytes, so a reader could start eight at once, and
    a first build took their rows beyond the claims only as far as there was room: all
    eight answered at once, 19 MiB of folds under a 4 MiB budget (a review found it). Now
    a restore's rows beyond its claims are taken at once or it is refused (429): the folds
    whose answers are held open together fit the budget."""
    store = StoreId.parse(STORE)
    rows = {b"k%05d" % i: bytes([i % 251]) * 1024 for i in range(2048)}
    chunks = encode_chunks(rows, [], target_size=256 << 10)
    n = 8
    folds: dict[object, FoldHold] = {}  # each restore's fold, by its task
    answering: list[FoldHold] = []
    ended = [0]  # restores answered or refused
    all_in = asyncio.Event()
    hold_fold, run, write = restorer_module.hold_fold, Restorer.run, PacedAnswer.write

    async def tracked_hold_fold(*a: Any) -> FoldHold | None:
        fold = await hold_fold(*a)
        if fold is not None:
            folds[asyncio.current_task()] = fold
        return fold

    async def tracked_run(self: Restorer, *a: Any, **kw: Any) -> Any:
        try:
            return await run(self, *a, **kw)
        except BaseException:
            ended[0] += 1
            if ended[0] == n:
                all_in.set()
            raise

    async def gated(self: PacedAnswer, data: bytes) -> bool:
        fold = folds.pop(asyncio.current_task(), None)
        if fold is not None:  # this answer's first write: its fold is done and held
            answering.append(fold)
            ended[0] += 1
            if ended[0] == n:
                all_in.set()
            await all_in.wait()  # every restore answered or refused: the answers overlap
        return await write(self, data)

    monkeypatch.setattr(restorer_module, "hold_fold", tracked_hold_fold)
    monkeypatch.setattr(Restorer, "run", tracked_run)
    monkeypatch.setattr(PacedAnswer, "write", gated)
    async with nodes(
        tmp_path, 1, replicas=1, write_quorum=1, memory_budget=4 * MIB, max_body=MIB
    ) as (node,):
        refs = tuple(dataclasses.replace(ChunkRef.of(c), raw_size=10, rows=1) for c in chunks)
        for c in chunks:
            node.store.put_chunk(chunk_key(store, 1, c.name), c.data)
        node.store.put_manifest(Manifest(store, 1, "snapshot", 1, 128, refs, {}))

        async def restore(s: aiohttp.ClientSession) -> int:
            url = f"http://{node.address}/v1/stores/{STORE}/state?plan=star"
            async with s.get(url) as r:
                await r.read()
                return r.status

        async with aiohttp.ClientSession() as s:
            statuses = await asyncio.wait_for(asyncio.gather(*(restore(s) for _ in range(n))), 60)
        assert set(statuses) <= {200, 429} and 200 in statuses, statuses
        assert node.budget.used == 0
        held = sum(f.decoded for f in answering)
        assert held <= node.budget.limit, f"{held / MIB:.1f} MiB of folds answered at once"


async def test_a_tree_hop_claims_only_the_chunks_it_holds(tmp_path: Path) -> None:
    """A plan naming the hop's two real chunks first and then four it does not hold, each
    claimed at 3 MiB: a first build gave those claims back only when its loop came to them,
    so the node held 12 MiB of a 16 MiB budget with nothing behind it while it folded the
    real ones (a review found it). It claims only the chunks it holds now."""
    store = StoreId.parse(STORE)
    async with nodes(
        tmp_path, 1, replicas=1, write_quorum=1, memory_budget=16 * MIB, max_body=MIB
    ) as (a,):
        real = _kib_rows(1, 2 * 1024)  # 2 MiB of rows, two chunks
        for c in real:
            a.store.put_chunk(chunk_key(store, 1, c.name), c.data)
        fake = _absent(store, a.address)
        seen: list[int] = []
        decode = relay.decode_chunk

        def watched(data: bytes, **kw: Any) -> Any:
            seen.append(a.budget.used)
            return decode(data, **kw)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(relay, "decode_chunk", watched)
            hop = Hop(a.address, _honest(1, real, (a.address,)) + fake, ())
            frames = await _relay_frames(a.address, encode_hop(store, hop, True, 0, 0))
        assert not [meta for kind, meta in frames if kind == b"E"], frames
        assert len(seen) == len(real) and max(seen) < 4 * MIB, seen
        assert a.budget.used == 0
