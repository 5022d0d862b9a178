"""Peers that hold a node's memory by going slow or quiet.

A coordinator commit takes 3x its declared length of ``--memory-budget`` before its body
is read, and its body may pause up to the body timeout between two pieces. A client
trickling one byte a second against a 2 s body timeout held that share for as long as
it liked on the builds before (hostile review 3: 12 s later it still held 63 of 64 MiB, and
an honest commit got 429). Now the whole body must come within the body timeout plus its
length at ``MIN_RATE`` (128 KiB/s): then it is cut off, its share given back, and
the honest commit goes through. An answer built in memory must be read at the same pace,
and a relay hop whose child stalls gives up once its requester has left."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import StoreId
from statestore.core.ids import chunk_key
from statestore.core.manifest import Manifest
from statestore.core.plan import ChunkTask, Hop
from statestore.net.inproc import Answer, exchange
from statestore.net.streams import read_frames
from statestore.node import request as request_module
from statestore.node.api import build_app
from statestore.node.daemon import Node
from statestore.node.server import start_node, stop_node
from statestore.wire.frames import encode_hop
from statestore.wire.manifest import decode_chain
from statestore.wire.rows import encode_puts
from tests.ringkit import call, config, eventually, nodes

SID = StoreId("q1", 0, 1, "default")


async def test_a_trickled_commit_gives_its_budget_back(tmp_path: Path) -> None:
    declared = 1 << 20  # 3 MiB of the 4 MiB budget, for at most 2 + 8 s
    cfg = config(
        tmp_path,
        "n",
        replicas=1,
        write_quorum=1,
        memory_budget=4 << 20,
        max_body=1 << 20,
        max_commit=declared,
        body_timeout=2.0,
    )
    node, runner = await start_node(cfg)
    try:
        host, port = node.address.rsplit(":", 1)
        reader, w = await asyncio.open_connection(host, int(port))
        w.write(
            f"POST /v1/stores/{SID.path}/commit?version=1&epoch=1 HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {declared}\r\n\r\n".encode()
        )
        await w.drain()

        async def trickle() -> None:
            with contextlib.suppress(OSError):
                while True:
                    await asyncio.sleep(1.0)
                    w.write(b"\0")
                    await w.drain()

        t = asyncio.create_task(trickle())
        await eventually(lambda: node.budget.used >= 3 * declared, "the trickled share taken")
        rows = encode_puts([b"k%d" % i for i in range(256)], [b"v" * 1800] * 256)  # 0.45 MiB
        status, _ = await call(
            node.address, "POST", f"/v1/stores/{SID.path}/commit?version=1&epoch=1", data=rows
        )
        assert status == 429  # no room while the trickled commit holds its share
        # the trickled commit is cut off and answered (408), its share given back
        answer = await asyncio.wait_for(reader.read(4096), 30)
        assert b" 408 " in answer.split(b"\r\n", 1)[0], answer[:200]
        await eventually(lambda: node.budget.used < 3 * declared, "the share given back")
        status, body = await call(
            node.address, "POST", f"/v1/stores/{SID.path}/commit?version=1&epoch=1", data=rows
        )
        assert status == 201, body
        t.cancel()
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()
    finally:
        await stop_node(node, runner)


async def test_a_body_declared_past_max_body_is_refused_at_once_and_holds_nothing(
    tmp_path: Path,
) -> None:
    """A body declared over --max-body can never be read (aiohttp refuses it past it): it
    held its declared bytes of the budget for the body timeout, so one connection sending
    ``Content-Length: 1 GiB`` and nothing else kept every other body out (hostile review
    87). Now it gets 413 at once and takes nothing."""
    cfg = config(
        tmp_path, "n", replicas=1, write_quorum=1, memory_budget=4 << 20, max_body=1 << 20,
        body_timeout=5.0,
    )  # fmt: skip
    node, runner = await start_node(cfg)
    try:
        host, port = node.address.rsplit(":", 1)
        reader, w = await asyncio.open_connection(host, int(port))
        w.write(
            b"POST /v1/heads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4194304\r\n\r\n"
        )
        await w.drain()
        answer = await asyncio.wait_for(reader.read(4096), 3)
        assert b" 413 " in answer.split(b"\r\n", 1)[0], answer[:200]
        assert node.budget.used == 0
        status, _ = await call(node.address, "POST", "/v1/heads", json={"stores": []})
        assert status == 200
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()
    finally:
        await stop_node(node, runner)


async def test_a_restore_answer_left_unread_gives_its_budget_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore through a node reserves its state's memory until the answer is sent; a
    reader that asks and never reads held that reservation (and the state) for as long as
    it liked (hostile review 5). Now the answer must be read within the body timeout plus
    its length at ``MIN_RATE`` (set high here, 16 MiB/s, to keep the test short):
    the connection is cut and the reservation given back."""
    monkeypatch.setattr(request_module, "MIN_RATE", 16 << 20)
    cfg = config(
        tmp_path, "n", replicas=1, write_quorum=1, memory_budget=64 << 20, body_timeout=1.0
    )
    node, runner = await start_node(cfg)
    try:
        keys = [b"k%06d" % i for i in range(16384)]
        rows = encode_puts(keys, [b"%06d" % i + b"v" * 994 for i in range(len(keys))])  # 16 MiB
        path = f"/v1/stores/{SID.path}/commit?version=1&epoch=1"
        status, body = await call(node.address, "POST", path, data=io.BytesIO(rows))
        assert status == 201, body
        host, port = node.address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET /v1/stores/{SID.path}/state HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await eventually(lambda: node.budget.used > 16 << 20, "the restore's reservation taken")
        # never read: cut once its deadline passes, and the reservation given back
        await eventually(lambda: node.budget.used == 0, "the reservation given back")
        sock.close()
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://{node.address}/v1/stores/{SID.path}/state") as r,
        ):
            assert r.status == 200 and len(await r.read()) > 16_000_000
    finally:
        await stop_node(node, runner)


async def _committed(node: Node, n: int) -> list[Manifest]:
    """Version 1 of SID, ``n`` rows of 200 bytes, committed through ``node``: its chain."""
    rows = encode_puts([b"k%04d" % i for i in range(n)], [b"v" * 200] * n)
    path = f"/v1/stores/{SID.path}/commit?version=1&epoch=1"
    status, body = await call(node, "POST", path, data=rows)
    assert status == 201, body
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://{node.address}/v1/stores/{SID.path}/chain?version=1") as r,
    ):
        assert r.status == 200
        return decode_chain(await r.read())


def _tasks(chain: list[Manifest], holders: tuple[str, ...]) -> tuple[ChunkTask, ...]:
    """A restorer's tasks for the chunks of ``chain`` (of SID), held by ``holders``."""
    return tuple(
        ChunkTask(chunk_key(SID, m.version, c.name), pos, m.version, c.name, c.checksum,
                  c.size, c.raw_size, c.rows, holders, c.lo, c.hi)
        for pos, m in enumerate(chain)
        for c in m.chunks
    )  # fmt: skip


class _Stalled:
    """A child's stream that answered its headers and then says nothing (a paused node)."""

    def __init__(self, closed: list[str]) -> None:
        self._closed = closed

    async def readexactly(self, n: int) -> bytes:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._closed.append("closed")


async def test_a_relay_hop_gives_up_on_a_stalled_child_once_its_requester_leaves(
    tmp_path: Path,
) -> None:
    """A tree hop folds its own chunks (taking their rows from its budget), then waits on
    its children, with no bound of its own: a child sends nothing until its subtree is
    folded. A child that answered its headers and then stalled held every hop above it,
    their budget shares and connections, for ever, even after the restorer at the top gave
    up (aiohttp does not cancel a handler whose client left). Here node B's child (node C,
    as B sees it) never speaks, node A relays B, and the requester of A leaves: both hops
    must end and give back what they took."""
    async with nodes(tmp_path, 3, replicas=3, write_quorum=3) as (a, b, c):
        chain = await _committed(a, 2000)
        tasks = _tasks(chain, (a.address, b.address))
        leaf = Hop(c.address, ())
        plan = encode_hop(
            SID, Hop(a.address, tasks, (Hop(b.address, tasks, (leaf,)),)), True, 0,
            chain[-1].key_groups,
        )  # fmt: skip
        asked: list[str] = []
        closed: list[str] = []

        async def stalled(address: str, path: str, body: bytes, **kw: Any) -> _Stalled:
            asked.append(address)
            return _Stalled(closed)

        b.transport.open_stream = stalled  # type: ignore[method-assign]
        host, port = a.address.rsplit(":", 1)
        reader, w = await asyncio.open_connection(host, int(port))
        w.write(
            f"POST /v1/relay?store={SID.path} HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(plan)}\r\n\r\n".encode()
            + plan
        )
        await w.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert b" 200 " in head.split(b"\r\n", 1)[0], head
        await eventually(
            lambda: asked and a.budget.used > 0 and b.budget.used > 0,
            "both hops folded their own chunks and wait on their children",
        )
        w.close()  # the requester gives up
        with contextlib.suppress(OSError):
            await w.wait_closed()
        await eventually(
            lambda: a.budget.used == 0 and b.budget.used == 0 and closed,
            "both hops ended, their shares given back and the stalled stream closed",
        )


class _SlowEmpty:
    """A child's stream that ends cleanly, with no frame, after its subtree took 1.5 s."""

    async def readexactly(self, n: int) -> bytes:
        raise asyncio.IncompleteReadError(b"", n)

    def close(self) -> None:
        pass


async def test_an_in_process_relay_hop_slower_than_a_second_answers_whole(
    tmp_path: Path,
) -> None:
    """The in-process network (net/inproc.py: the simulator's, the fuzzers') serves requests
    with no transport. A first build of the stop on a leaving requester read that as "left"
    and cut every hop still working after a second, so slow line and tree hops fell back to
    star unseen (a review of it found it). A hop served in process answers whole."""
    async with nodes(tmp_path, 2, replicas=2, write_quorum=2) as (a, b):
        chain = await _committed(a, 200)
        tasks = _tasks(chain, (a.address, b.address))
        hop = Hop(a.address, tasks, (Hop(b.address, ()),))
        plan = encode_hop(SID, hop, True, 0, chain[-1].key_groups)

        async def slow(address: str, path: str, body: bytes, **kw: Any) -> _SlowEmpty:
            await asyncio.sleep(1.5)
            return _SlowEmpty()

        a.transport.open_stream = slow  # type: ignore[method-assign]
        app = build_app(a)
        app.freeze()
        answer = Answer(a.address)
        served = asyncio.create_task(
            exchange(
                app, answer, method="POST", address=a.address,
                path=f"/v1/relay?store={SID.path}", body=plan, headers={}, peer="client:1",
                client_max_size=1 << 20,
            )
        )  # fmt: skip
        assert (await answer.status)[0] == 200
        frames = [(kind, meta) async for kind, meta, _data, _raw in read_frames(answer, 1 << 28)]
        await served
        assert any(kind == b"D" and "out" in meta for kind, meta in frames), frames


async def test_a_slow_body_begun_before_a_drop_s_purge_is_not_written_after_it(
    tmp_path: Path,
) -> None:
    """A client's chunk ``PUT`` whose headers passed the drop check before the purge, and
    whose body arrived after it, was written between the purge and the seal: the drop left
    that chunk behind (hostile review 87). The check runs again once the body is read."""
    from statestore.core.chunk import encode_chunks
    from statestore.node.tombstones import DROPPING

    cfg = config(tmp_path, "n", replicas=1, write_quorum=1, body_timeout=10.0)
    node, runner = await start_node(cfg)
    try:
        (c,) = encode_chunks({b"k": b"v" * 1000}, [])
        key = chunk_key(SID, 1, c.name)
        host, port = node.address.rsplit(":", 1)
        reader, w = await asyncio.open_connection(host, int(port))
        w.write(
            f"PUT /v1/chunks/{key} HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(c.data)}\r\n\r\n".encode()
            + c.data[:10]
        )
        await w.drain()
        await asyncio.sleep(0.3)  # the request is in its handler, reading the body
        runner.app[DROPPING].queries.add(SID.query)  # a drop's purge ran: not sealed yet
        w.write(c.data[10:])
        await w.drain()
        answer = await asyncio.wait_for(reader.read(4096), 10)
        status = answer.split(b"\r\n", 1)[0]
        assert b" 201 " not in status and b" 409 " in status, answer[:300]
        assert node.store.has_chunks([key]) == [False]
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()
    finally:
        await stop_node(node, runner)


async def test_a_commit_of_tiny_rows_takes_what_its_rows_hold(tmp_path: Path) -> None:
    """A commit is charged 3x its body; a body of 11-byte records decodes to ~8x its size
    in Python objects, so a commit within its charge held several times it (hostile review
    87). Its rows are now taken too: 1 MiB of 6-byte keys (74,898 rows, ~7.5 MB as objects)
    does not fit a 4 MiB budget and is refused, with nothing stored; a commit of the same
    size in a hundred rows lands."""
    cfg = config(
        tmp_path, "n", replicas=1, write_quorum=1, memory_budget=4 << 20, max_body=1 << 20,
        max_commit=1 << 20,
    )  # fmt: skip
    node, runner = await start_node(cfg)
    try:
        n = (1 << 20) // 14  # 8 bytes of framing and a 6-byte key a row
        tiny = encode_puts([b"%03d" % (i % 1000) + i.to_bytes(3, "big") for i in range(n)],
                           [b""] * n)  # fmt: skip
        assert len(tiny) <= 1 << 20
        url = f"/v1/stores/{SID.path}/commit?version=1&epoch=1"
        status, body = await call(node.address, "POST", url, data=tiny)
        assert status in (413, 429), body
        assert node.store.head(SID) is None
        assert node.budget.used == 0
        large = encode_puts([b"k%d" % i for i in range(100)], [b"v" * 9000] * 100)
        status, body = await call(node.address, "POST", url, data=large)
        assert status == 201, body
        # rows of 60 bytes: 3 MiB for the body and 0.5 MB past it for the rows fit (a first
        # build of the charge took 100 bytes a row on top of the 3x and refused it)
        n = (1 << 20) // 68
        rows = encode_puts([b"r%07d" % i for i in range(n)], [b"x" * 52] * n)
        url2 = f"/v1/stores/{SID.path}/commit?version=2&epoch=1"
        status, body = await call(node.address, "POST", url2, data=rows)
        assert status == 201, body
        assert node.budget.used == 0
    finally:
        await stop_node(node, runner)
