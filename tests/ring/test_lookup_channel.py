"""Lookups over a kept WebSocket (``GET /v1/lookups``, node/channel.py and net/channel.py):
an opened store's cold point reads go over one channel a node and answer what the request
answers; each message is judged as its request is (the token's right on the message's
query, its shape); a node without the route is sent requests; a channel whose node stops
fails over as a request does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import msgpack
import msgspec
from aiohttp import web

from client import AsyncRingClient, StoreId
from statestore.core.manifest import Manifest
from statestore.net.http import HttpTransport
from statestore.net.reads import block_path
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


def _lookup_body(chain: list[Manifest], key: bytes) -> bytes:
    """What a reader of ``chain`` sends to look ``key`` up (net/reads.lookup_keys)."""
    path = block_path(chain, key)
    assert path
    parts = [
        LookupPart(v, r.name, r.lo, r.hi, r.size, r.index_len, r.index_checksum) for v, r in path
    ]
    return msgspec.json.encode(LookupRequest(chain[-1].key_groups, [key.hex()], parts))


async def test_each_message_is_judged_as_its_request(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(TOKENS))
    (tmp_path / "s").write_bytes(SECRET)
    kw = {"auth_file": str(tmp_path / "t.json"), "cluster_secret_file": str(tmp_path / "s")}
    node, runner = await start_node(config(tmp_path, "n", replicas=1, write_quorum=1, **kw))
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
