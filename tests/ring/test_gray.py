"""Gray failures on real node processes: a node paused with SIGSTOP is alive to the kernel
(its sockets accept connections) and answers nothing. Requests route around it within their
deadline, and a pause shorter than ``--down-after`` does not move the ring's epoch."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, cast

import pytest

from client import DelayBoundExceeded, RingClient, StoreId
from statestore.core.chunk import EncodedChunk
from statestore.core.errors import NodeUnavailable, StaleEpoch, StoreNotFound
from statestore.core.ids import chunk_key
from statestore.core.manifest import Manifest
from statestore.core.view import MemberInfo, RingView
from statestore.net.quorate import GRACE, Rest, finish_left, until_enough
from statestore.net.transport import Response, Transport
from statestore.net.writes import check_fence, put_chunks, put_manifest
from tests.ringkit import local_ring

ARGS = ["--gossip-interval", "0.2", "--suspect-after", "1", "--down-after", "6"]


def test_a_paused_node_is_routed_around_and_a_short_pause_moves_no_epoch(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, ARGS) as ring:
        sid = StoreId("gray", 0, 1)
        acked: dict[int, dict[bytes, bytes]] = {}
        state: dict[bytes, bytes] = {}

        def commit(client: RingClient, v: int) -> None:
            puts = {f"k{v}-{i}".encode(): f"v{v}".encode() * 10 for i in range(40)}
            client.commit(sid, v, puts, [], {"offset": v}, epoch=1)
            state.update(puts)
            acked[v] = dict(state)

        with RingClient(ring.seeds, timeout=2.0) as client:
            for v in (1, 2, 3):
                commit(client, v)
            ring.wait_ring(3)
            epoch = ring.ring()["epoch"]

            # a short pause, well under --down-after: nobody declares the node down
            ring.pause(2)
            time.sleep(1.5)
            ring.resume(2)
            time.sleep(1.0)  # a few gossip rounds after it came back
            assert {ring.ring(a)["epoch"] for a in ring.seeds} == {epoch}

            # a long pause: commits and restores go on against the two that answer, both
            # while the node is only silent and after the ring declared it down
            ring.pause(2)
            for v in (4, 5, 6):
                commit(client, v)
                assert dict(client.restore(sid, v)) == acked[v]
            ring.wait_ring(2)
            for v in (7, 8):
                commit(client, v)
                assert dict(client.restore(sid, v)) == acked[v]

            ring.resume(2)
            ring.wait_ring(3)
            for v, expected in acked.items():
                assert dict(client.restore(sid, v)) == expected, v


def test_a_silent_replica_costs_a_grace_period_not_a_request_timeout(tmp_path: Path) -> None:
    """A replica paused before the failure detector says anything (``--down-after 60``) and
    a client whose per-request timeout is 30 s: commits and star restores bounded to 6 s go
    on with the two replicas that answer. Writes and quorum reads wait on a silent replica
    only a grace period once W (or the read quorum) answered (net/quorate.py), and a chunk
    read asks the next holder when the first one is slow (net/failover.py hedging); before,
    every call waited out the 30 s on the paused node and broke its bound. ``all`` still
    needs the silent one, so it cannot finish within its bound."""
    args = ["--no-dht", "--gossip-interval", "0.2", "--suspect-after", "30",
            "--down-after", "60"]  # fmt: skip
    with local_ring(tmp_path, 3, args) as ring:
        try:
            sid = StoreId("gray", 0, 2)
            state: dict[bytes, bytes] = {}
            with RingClient(ring.seeds, timeout=30.0) as client:
                for v in (1, 2):
                    puts = {f"k{v}-{i}".encode(): f"v{v}".encode() * 30 for i in range(60)}
                    client.commit(sid, v, puts, epoch=1)
                    state |= puts
                ring.pause(2)
                for v in (3, 4, 5):
                    puts = {f"k{v}-{i}".encode(): f"v{v}".encode() * 30 for i in range(60)}
                    client.commit(sid, v, puts, epoch=1, delay_bound=6.0)
                    state |= puts
                    st = client.restore(sid, plan="star", delay_bound=6.0)
                    assert (st.version, dict(st)) == (v, state)
                with pytest.raises(DelayBoundExceeded):
                    client.commit(sid, 6, {b"x": b"y"}, epoch=1, consistency="all", delay_bound=3.0)
                ring.resume(2)
        finally:
            ring.resume(2)


async def test_a_read_returns_at_its_quorum_and_leaves_the_slower_replica_running() -> None:
    """``rest="run"`` (quorum reads, the fencing check): the answer comes once enough
    answered; the slower call is neither waited for nor cut off. ``"wait"`` waits a grace
    period for it and then cancels it; ``"behind"`` (writes) returns at once and gives it
    its grace period behind the caller."""
    gate = asyncio.Event()
    finished: list[int] = []

    async def call(i: int) -> int:
        if i == 2:
            await gate.wait()
        finished.append(i)
        return i

    def two(done: dict[int, int | BaseException]) -> bool:
        return len(done) >= 2

    # the caller has its answer while the slower call still runs, which finishes (run; or
    # behind, within its grace), or is cancelled once its grace is over (behind); a grace
    # of an hour is one the caller must not wait out
    cases: list[tuple[Rest, float, bool]] = [
        ("run", 3600.0, True),
        ("behind", 3600.0, True),
        ("behind", 0.05, False),
    ]
    for rest, grace, lands in cases:
        gate.clear()
        finished.clear()
        token = GRACE.set(grace)
        try:
            ask = until_enough([call(i) for i in range(3)], two, "PUT", rest=rest)
            results = await asyncio.wait_for(ask, 60)
        finally:
            GRACE.reset(token)
        assert results[:2] == [0, 1] and isinstance(results[2], NodeUnavailable)
        assert finished == [0, 1]
        if not lands:
            await asyncio.sleep(0.2)  # past its grace
        gate.set()
        await finish_left()
        assert finished == ([0, 1, 2] if lands else [0, 1])

    gate.clear()
    finished.clear()
    token = GRACE.set(0.01)
    try:
        results = await until_enough([call(i) for i in range(3)], two, "PUT", rest="wait")
    finally:
        GRACE.reset(token)
    assert isinstance(results[2], NodeUnavailable)
    gate.set()
    await asyncio.sleep(0)
    await finish_left()
    assert finished == [0, 1]  # cancelled once its grace was over

    # a caller cancelled while waiting leaves nothing running, whatever ``rest`` says
    rests: tuple[Rest, ...] = ("run", "behind")
    for rest in rests:
        gate.clear()
        finished.clear()
        waiting = asyncio.ensure_future(until_enough([call(2), call(2)], two, "GET", rest=rest))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gate.set()
        await finish_left()  # waits for any call left running: none may be
        assert finished == []


async def test_the_fencing_check_hears_w_of_the_future_owners_during_a_move() -> None:
    """While ``d`` joins, a store's heads are asked of its current owners and of ``d``. The
    owner that is leaving the store's replica set and ``d`` answer first, with no head; the
    two that stay hold a newer writer's head and answer later. Two answers are not enough:
    a commit is acknowledged by W current and W future owners, so the check waits for one
    of the two that stay and is fenced."""
    members = tuple(
        MemberInfo(n, f"{n}:1", "up", "", s)
        for n, s in {"a": "normal", "b": "normal", "c": "normal", "d": "joining"}.items()
    )
    view = RingView(3, members, 3, 2, 16)
    store = next(
        s
        for s in (StoreId("fence", 0, i) for i in range(1000))
        if "d:1" in view.future_replicas_of(s.path)
    )
    stay = set(view.future_replicas_of(store.path)) - {"d:1"}

    class Heads:
        async def request(self, method: str, address: str, path: str, **_: Any) -> Response:
            if address not in stay:
                raise StoreNotFound(f"{store} has no version on {address}")
            await asyncio.sleep(0.05)  # after the two that hold nothing
            return Response(200, json.dumps({"version": 7, "epoch": 5}).encode(), 3)

    m = Manifest(store, 8, "delta", 4, 16, ())
    with pytest.raises(StaleEpoch):
        await check_fence(cast(Transport, Heads()), view, m)


async def test_a_chunk_returns_at_w_and_its_last_copy_lands_behind_it() -> None:
    """A chunk's write goes on once W replicas stored it; the slowest replica's request runs
    on behind it and lands (net/writes.REST). A manifest's write waits for every replica's
    answer: a replica's refusal of a manifest is what fences a writer."""
    members = tuple(MemberInfo(n, f"{n}:1", "up", "", "normal") for n in "abc")
    view = RingView(3, members, 3, 2, 16)
    store = StoreId("behind", 0, 0)
    chunk = EncodedChunk("d0-00000000000000ff", 0, 0, b"x" * 10, 0xFF, 10, 1)
    slow = view.replicas_of(chunk_key(store, 1, chunk.name))[-1]
    gate = asyncio.Event()
    landed: list[tuple[str, str]] = []

    class Replicas:
        async def request(self, method: str, address: str, path: str, **_: Any) -> Response:
            if address == slow:
                await gate.wait()
            landed.append((address, path.split("/")[2]))
            if path.startswith("/v1/chunks/"):
                body = json.dumps({"stored": path.removeprefix("/v1/chunks/")})
            else:
                body = json.dumps({"stored": True})
            return Response(201, body.encode(), 3)

    transport = cast(Transport, Replicas())
    token = GRACE.set(3600.0)  # a grace it must not wait out
    try:
        await asyncio.wait_for(put_chunks(transport, view, store, 1, [chunk]), 60)
        assert (slow, "chunks") not in landed and len(landed) == 2
        m = Manifest(store, 1, "delta", 1, 16, ())
        manifest = asyncio.ensure_future(put_manifest(transport, view, m))
        await asyncio.sleep(0.2)
        assert not manifest.done()  # the slow replica's manifest answer is waited for
        gate.set()
        assert await asyncio.wait_for(manifest, 60) == 3
        await finish_left()
        assert (slow, "chunks") in landed  # the chunk's last copy landed behind the write
    finally:
        GRACE.reset(token)
        gate.set()
        await finish_left()
