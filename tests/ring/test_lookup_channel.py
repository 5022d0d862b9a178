"""Lookups over a kept WebSocket (``GET /v1/lookups``, node/channel.py and net/channel.py):
an opened store's cold point reads go over one channel a node and answer what the request
answers; each message is judged as its request is (the token's right on the message's
query, its shape); a node without the route is sent requests; a channel whose node stops
fails over as a request does."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
from pathlib import Path

import aiohttp
import msgpack
import msgspec
import pytest
from aiohttp import web

from client import AsyncRingClient, StoreId
from statestore.core.manifest import Manifest
from statestore.net.http import HttpTransport
from statestore.net.reads import block_path
from statestore.node import channel as channel_module
from statestore.node.channel import CHANNELS, IN_FLIGHT
from statestore.node.daemon import Node
from statestore.node.server import start_node, stop_node
from statestore.wire.bodies import LookupPart, LookupRequest
from tests.ringkit import SECRET, call, config, nodes

SID = StoreId("a1", 0, 0, "default")
ROWS = {b"k%05d" % i: b"v%05d" % i for i in range(3000)}
A_READER = "a-star-reader-token-001"
TOKENS = {
    A_READER: {"queries": ["a*"], "rights": ["read", "write"]},
    "b-reader-token-00000001": {"queries": ["b*"], "rights": ["read"]},
}


async def test_cold_reads_of_an_opened_store_go_over_one_channel(tmp_path: Path) -> None:
    async with nodes(tmp_path, 1, replicas=1, write_quorum=1) as (node,):
        async with AsyncRingClient([node.address]) as ring:
            await ring.commit(SID, 1, ROWS, [], {}, epoch=1, snapshot=True)
            await ring.commit(SID, 2, {b"k00001": b"new"}, [b"k00002"], {}, epoch=1)
            view = await ring.open(SID, cache_bytes=0)
            keys = list(ROWS)[:300]
            got = await asyncio.gather(*(view.get(k) for k in keys))
            want = [ROWS[k] for k in keys]
            want[1], want[2] = b"new", None
            assert got == want
            assert await view.get(b"absent") is None
            transport = ring._transport
            assert isinstance(transport, HttpTransport)
            channel = transport._channels[node.address]
            assert channel.broken is None and next(channel._ids) >= 1
            body = _lookup_body(view.chain, b"k00001")
        # the same lookup as a request answers the same bytes
        async with aiohttp.ClientSession() as s:
            url = f"http://{node.address}/v1/stores/{SID.path}/lookup"
            async with s.post(url, data=body) as r:
                assert r.status == 200
                plain = await r.read()
            async with s.ws_connect(f"http://{node.address}/v1/lookups") as ws:
                await ws.send_bytes(msgpack.packb([7, SID.path, body]))
                mid, status, answer, epoch = msgpack.unpackb((await ws.receive()).data)
        assert (mid, status, answer) == (7, 200, plain) and epoch >= 1
        assert msgpack.unpackb(answer) == [b"new"]


def _lookup_body(chain: list[Manifest], *keys: bytes) -> bytes:
    """What a reader of ``chain`` sends to look ``keys`` up (net/reads.lookup_keys)."""
    parts: dict[tuple[int, str], LookupPart] = {}
    for key in keys:
        path = block_path(chain, key)
        assert path
        for v, r in path:
            part = LookupPart(v, r.name, r.lo, r.hi, r.size, r.index_len, r.index_checksum)
            parts[v, r.name] = part
    hexed = [k.hex() for k in keys]
    return msgspec.json.encode(LookupRequest(chain[-1].key_groups, hexed, list(parts.values())))


async def _guarded(tmp_path: Path) -> tuple[Node, web.AppRunner]:
    """One node with the tokens of :data:`TOKENS` and a cluster secret."""
    (tmp_path / "t.json").write_text(json.dumps(TOKENS))
    (tmp_path / "s").write_bytes(SECRET)
    kw = {"auth_file": str(tmp_path / "t.json"), "cluster_secret_file": str(tmp_path / "s")}
    return await start_node(config(tmp_path, "n", replicas=1, write_quorum=1, **kw))


async def test_each_message_is_judged_as_its_request(tmp_path: Path) -> None:
    node, runner = await _guarded(tmp_path)
    url = f"http://{node.address}/v1/lookups"
    try:
        async with AsyncRingClient([node.address], token=A_READER) as ring:
            await ring.commit(SID, 1, ROWS, [], {}, epoch=1, snapshot=True)
            view = await ring.open(SID, cache_bytes=0)
            assert await view.get(b"k00007") == b"v00007"  # over the token's channel
            body = _lookup_body(view.chain, b"k00007")
        async with aiohttp.ClientSession() as s:
            try:  # no token: refused at the upgrade
                await s.ws_connect(url)
                raise AssertionError("a channel opened without a token")
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 401
            headers = {"Authorization": f"Bearer {A_READER}"}
            async with s.ws_connect(url, headers=headers) as ws:
                await ws.send_bytes(msgpack.packb([1, "b1/0/0/default", body]))
                await ws.send_bytes(msgpack.packb([2, SID.path, b"{not json"]))
                await ws.send_bytes(msgpack.packb([3, SID.path, body]))
                answers = {}
                for _ in range(3):
                    mid, status, answer, _epoch = msgpack.unpackb((await ws.receive()).data)
                    answers[mid] = (status, answer)
                assert answers[1][0] == 403, answers[1]  # another tenant's query
                assert json.loads(answers[1][1])["error"]["code"] == "forbidden"
                assert 400 <= answers[2][0] < 500, answers[2]  # the body's shape
                assert answers[3] == (200, msgpack.packb([b"v00007"]))
                await ws.send_bytes(b"\xc1 not msgpack")  # no id to answer: closed
                closed = await ws.receive()
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            async with s.ws_connect(url, headers=headers) as ws:
                await ws.send_str("text")  # messages are binary: closed
                closed = await ws.receive()
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        status, _ = await call(node.address, "GET", "/v1/health/live")
        assert status == 200
    finally:
        await stop_node(node, runner)


async def test_a_node_without_channels_is_sent_requests(tmp_path: Path) -> None:
    """An older node (no /v1/lookups): the lookup goes as ``POST .../lookup``."""

    async def lookup(request: web.Request) -> web.Response:
        return web.Response(body=msgpack.packb([b"old"]), content_type="application/msgpack")

    app = web.Application()
    app.router.add_post("/v1/stores/{q}/{o}/{p}/{n}/lookup", lookup)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    address = f"127.0.0.1:{port}"
    transport = HttpTransport()
    try:
        for _ in range(2):
            resp = await transport.lookup(address, SID.path, b"{}")
            assert msgpack.unpackb(resp.body) == [b"old"]
        assert address in transport._plain and address not in transport._channels
    finally:
        await transport.close()
        await runner.cleanup()


async def test_a_channel_whose_node_stops_fails_over(tmp_path: Path) -> None:
    kw = {"replicas": 2, "write_quorum": 2}
    started = [await start_node(config(tmp_path, "n0", **kw))]
    seeds = [started[0][0].address]
    started.append(await start_node(config(tmp_path, "n1", seeds=seeds, **kw)))
    try:
        async with AsyncRingClient([n.address for n, _ in started]) as ring:
            await ring.commit(SID, 1, ROWS, [], {}, epoch=1, snapshot=True)
            view = await ring.open(SID, cache_bytes=0)
            assert await view.get(b"k00010") == b"v00010"
            transport = ring._transport
            assert isinstance(transport, HttpTransport)
            (held,) = [(n, r) for n, r in started if n.address in transport._channels]
            channel = transport._channels[held[0].address]
            await stop_node(*held)  # its channel is closed by the node's shutdown
            started.remove(held)
            got = await asyncio.gather(*(view.get(k) for k in list(ROWS)[:50]))
            assert got == [ROWS[k] for k in list(ROWS)[:50]]
            assert channel.broken is not None
    finally:
        for n, r in reversed(started):
            await stop_node(n, r)


async def _raw_channel(
    address: str, headers: dict[str, str] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket to ``/v1/lookups`` that reads nothing unless asked (a small receive
    buffer: a reader that stops reading)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    r, w = await asyncio.open_connection(sock=sock, limit=4096)
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    w.write(
        f"GET /v1/lookups HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"{extra}\r\n".encode()
    )
    head = await r.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return r, w


def _frame(payload: bytes) -> bytes:
    """A client's binary frame (masked with zeros)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x82, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x82, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x82, 0x80 | 127, n)
    return head + b"\0\0\0\0" + payload


async def test_a_reader_that_stops_reading_holds_neither_memory_nor_the_stop(
    tmp_path: Path,
) -> None:
    """150 lookups of ~0.8 MB answers sent, none read (hostile review 66): the node answers
    at most IN_FLIGHT at once, each held to the budget until sent (the build before queued
    every answer, 112 MiB past an 8 MiB budget), and its stop drops the connection a close
    cannot finish on (the build before's stop hung for ever)."""
    kw = {"replicas": 1, "write_quorum": 1, "memory_budget": 8 << 20, "max_body": 1 << 20}
    node, runner = await start_node(config(tmp_path, "n", **kw))
    stopped = False
    try:
        rows = {b"k%d" % i: os.urandom(200_000) for i in range(4)}
        async with AsyncRingClient([node.address]) as ring:
            await ring.commit(SID, 1, rows, [], {}, epoch=1, snapshot=True)
            view = await ring.open(SID, cache_bytes=0)
            body = _lookup_body(view.chain, *rows)
        _r, w = await _raw_channel(node.address)
        for i in range(150):
            w.write(_frame(msgpack.packb([i, SID.path, body])))
        await w.drain()
        (ws,) = runner.app[CHANNELS]
        buffered = 0
        for _ in range(8):
            await asyncio.sleep(0.25)
            buffered = max(buffered, ws._writer.transport.get_write_buffer_size())
        assert buffered <= IN_FLIGHT * 1_000_000, buffered
        await asyncio.wait_for(stop_node(node, runner), 60)
        stopped = True
        w.close()
    finally:
        if not stopped:
            await stop_node(node, runner)


async def test_a_revoked_token_and_a_giant_name_close_the_channel(tmp_path: Path) -> None:
    node, runner = await _guarded(tmp_path)
    url = f"http://{node.address}/v1/lookups"
    headers = {"Authorization": f"Bearer {A_READER}"}
    try:
        async with AsyncRingClient([node.address], token=A_READER) as ring:
            await ring.commit(SID, 1, ROWS, [], {}, epoch=1, snapshot=True)
            view = await ring.open(SID, cache_bytes=0)
            body = _lookup_body(view.chain, b"k00007")
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(url, headers=headers) as ws:
                await ws.send_bytes(msgpack.packb([1, "x" * 100_000, body]))
                closed = await ws.receive()
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
            async with s.ws_connect(url, headers=headers) as ws:
                await ws.send_bytes(msgpack.packb([1, SID.path, body]))
                assert msgpack.unpackb((await ws.receive()).data)[1] == 200
                tokens = {k: v for k, v in TOKENS.items() if k != A_READER}
                (tmp_path / "t.json").write_text(json.dumps(tokens))
                later = time.time_ns() + 10**9
                os.utime(tmp_path / "t.json", ns=(later, later))
                await ws.send_bytes(msgpack.packb([2, SID.path, body]))
                assert msgpack.unpackb((await ws.receive()).data)[1] == 401
                closed = await ws.receive()
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    finally:
        await stop_node(node, runner)


async def test_pings_do_not_keep_an_idle_channel_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "IDLE", 1.0)
    async with nodes(tmp_path, 1, replicas=1, write_quorum=1) as (node,):
        async with aiohttp.ClientSession() as s:
            url = f"http://{node.address}/v1/lookups"
            async with s.ws_connect(url, heartbeat=0.2) as ws:  # pings every 0.2 s
                closed = await asyncio.wait_for(ws.receive(), 30)
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


async def test_channels_hold_at_most_a_quarter_of_the_budget(tmp_path: Path) -> None:
    """Each channel holds a message's room (1 MiB) for its life, and a message every few
    minutes keeps one open: 1,024 idle channels held a 1 GiB budget (hostile review 87).
    Channels now take at most a quarter of it (here 8 MiB: two); past it a channel is
    refused (429) and the SDK sends its lookups as requests, which still answer."""
    kw = {"replicas": 1, "write_quorum": 1, "memory_budget": 8 << 20, "max_body": 1 << 20}
    async with nodes(tmp_path, 1, **kw) as (node,):
        async with AsyncRingClient([node.address]) as ring:
            await ring.commit(SID, 1, ROWS, [], {}, epoch=1, snapshot=True)
        url = f"http://{node.address}/v1/lookups"
        async with aiohttp.ClientSession() as s:
            first = await s.ws_connect(url)
            second = await s.ws_connect(url)
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await s.ws_connect(url)
            assert refused.value.status == 429
            assert node.budget.used == 2 * channel_module.MESSAGE_BYTES
            async with AsyncRingClient([node.address]) as ring:
                view = await ring.open(SID, cache_bytes=0)
                assert await view.get(b"k00007") == b"v00007"  # as a request
            await first.close()
            for _ in range(100):  # the closed channel's room comes back
                if node.budget.used <= channel_module.MESSAGE_BYTES:
                    break
                await asyncio.sleep(0.05)
            third = await s.ws_connect(url)
            await third.close()
            await second.close()
