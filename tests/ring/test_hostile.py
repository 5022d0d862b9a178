"""A hostile client on the same network: every attack gets a 4xx naming the problem, and
nothing the ring holds changes (docs/security.md, Hardened endpoints). Real nodes on loopback
port 0."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import zstandard
from aiohttp import web

from client import StoreId
from statestore.core.chunk import MAX_CHUNK_ROWS, decode_chunk
from statestore.core.commit import build_commit
from statestore.core.errors import CorruptChunk, DecompressionBomb, QuorumNotReached
from statestore.core.identity import NODE_HEADER
from statestore.core.manifest import Manifest
from statestore.core.plan import Hop
from statestore.core.view import MemberInfo, RingView
from statestore.net.http import HttpTransport
from statestore.net.writes import write_commit
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node
from statestore.wire.frames import encode_hop
from statestore.wire.manifest import encode_manifest
from statestore.wire.rows import encode_puts
from tests.certs import make_tls
from tests.ringkit import assert_refused, call, state_of

SID = StoreId("q1", 0, 3, "default")
BASE = f"/v1/stores/{SID.path}"


async def commit(node: Node, version: int, epoch: int, rows: dict[bytes, bytes]) -> int:
    status, _ = await call(
        node,
        "POST",
        f"{BASE}/commit?version={version}&epoch={epoch}",
        data=encode_puts(list(rows), list(rows.values())),
    )
    return status


@pytest.fixture
async def held(solo: Node) -> Node:
    """``solo`` holding three versions of SID (v1 delta, v2 snapshot, v3 delta)."""
    assert await commit(solo, 1, 1, {b"a": b"1"}) == 201
    status, _ = await call(
        solo,
        "POST",
        f"{BASE}/commit?version=2&epoch=1&snapshot=1",
        data=encode_puts([b"a", b"b"], [b"1", b"2"]),
    )
    assert status == 201
    assert await commit(solo, 3, 1, {b"c": b"3"}) == 201
    return solo


# -- versions and epochs ----------------------------------------------------------------
@pytest.mark.parametrize("epoch", [str(2**64 - 1), str(10**30), str(2**63), "-1", "1e3", "²"])
async def test_out_of_range_epoch_is_refused_before_anything_is_written(
    held: Node, epoch: str
) -> None:
    before = state_of(held)
    status, body = await call(
        held, "POST", f"{BASE}/commit?version=4&epoch={epoch}", data=encode_puts([b"x"], [b"y"])
    )
    assert_refused(status, body, "invalid_request")
    assert state_of(held) == before


async def test_manifest_with_a_64_bit_epoch_is_refused(held: Node) -> None:
    before = state_of(held)
    m = Manifest(SID, 4, "delta", 2**63 - 1, 128, (), {})
    raw = msgpack.unpackb(encode_manifest(m))
    for epoch in (2**64 - 1, 2**63, -5):
        raw["epoch"] = epoch
        status, body = await call(
            held, "PUT", f"/v1/manifests/{SID.path}/4/delta", data=msgpack.packb(raw)
        )
        assert_refused(status, body)
    assert state_of(held) == before


async def test_a_fenced_commit_leaves_no_chunks_behind(held: Node) -> None:
    assert await commit(held, 4, 7, {b"d": b"4"}) == 201
    before = state_of(held)
    status, body = await call(
        held, "POST", f"{BASE}/commit?version=5&epoch=3", data=encode_puts([b"z"], [b"z" * 99])
    )
    assert (status, body["error"]["code"]) == (409, "stale_epoch")
    assert state_of(held) == before


# -- retention floors -------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        {"floor": True},
        {"floor": 10**30},
        {"floor": 99},  # above the head (3)
        {"floor": 3},  # a delta: versions above it would not restore
        {"floor": "2"},
        {"floor": -1},
        {"floor": 2.0},
        [2],
        "2",
    ],
)
async def test_gc_floor_is_a_version_never_above_the_head(held: Node, body: object) -> None:
    before = state_of(held)
    status, answer = await call(held, "POST", f"{BASE}/gc", json=body)
    assert_refused(status, answer)
    assert state_of(held) == before
    status, _ = await call(held, "GET", f"{BASE}/state?version=3")
    assert status == 200


async def test_gc_to_a_snapshot_floor_still_works(held: Node) -> None:
    status, answer = await call(held, "POST", f"{BASE}/gc", json={"floor": 2})
    assert status == 200 and answer["floor"] == 2
    status, _ = await call(held, "GET", f"{BASE}/state?version=3")
    assert status == 200


# -- gossip -----------------------------------------------------------------------------
def member(ident: str, address: str, inc: int = 1, hb: int = 1) -> dict[str, Any]:
    return {"id": ident, "address": address, "zone": "", "incarnation": inc, "heartbeat": hb}


async def test_gossip_bodies_are_validated(held: Node) -> None:
    before = state_of(held)
    port = held.address.rsplit(":", 1)[1]
    cases: list[Any] = [
        [1, 2],
        "x",
        {"epoch": 10**20, "members": []},
        {"epoch": 2**63 - 1, "members": []},
        {"epoch": True, "members": []},
        {"epoch": 1, "members": [member("evil", "10.0.0.9:7400", inc=10**20)]},
        {"epoch": 1, "members": [member("evil", "localhost:" + port)]},
        {"epoch": 1, "members": [member("evil", "127.0.0.2:" + port)]},
        {"epoch": 1, "members": [member("evil", "[::1]:" + port)]},
        {"epoch": 1, "members": [member("evil", held.address)]},  # the node's own address
        {"epoch": 1, "members": [member("evil", "evil.example/x?y=1:80")]},
        {"epoch": 1, "members": [member("e v i l", "10.0.0.9:7400")]},
    ]
    for case in cases:
        status, body = await call(held, "POST", "/v1/gossip", json=case)
        assert_refused(status, body)
        assert state_of(held) == before, case


async def test_a_forged_entry_for_the_node_itself_is_refuted(held: Node) -> None:
    own = held.id
    status, body = await call(
        held,
        "POST",
        "/v1/gossip",
        json={"epoch": 1, "members": [member(own, held.address, inc=500, hb=10**9)]},
    )
    assert status == 200
    mine = next(m for m in body["members"] if m["id"] == own)
    assert mine["incarnation"] == 501  # a newer life than the forged one: it still wins


async def test_repair_never_asks_itself(held: Node) -> None:
    """A node asked by itself (an alias of its address in some view) answers no have, so
    it can never confirm its own copies and drop them as handed off."""
    status, body = await call(
        held,
        "POST",
        "/v1/sync/have",
        json={"chunks": held.store.chunk_keys()},
        headers={NODE_HEADER: held.id},
    )
    assert_refused(status, body)
    status, body = await call(held, "POST", "/v1/sync/have", json=[1])
    assert_refused(status, body, "malformed_data")
    # nor range digests (node/digests.py): an asker's own digests would always match
    digests = {"seed": 1, "ranges": [[0, 2**64 - 1, 0, "0"]]}
    status, body = await call(
        held, "POST", "/v1/sync/digest", json=digests, headers={NODE_HEADER: held.id}
    )
    assert_refused(status, body)
    for bad in ([1], {"seed": 1, "ranges": [[9, 1, 0, "0"]]}, {"seed": 2**64, "ranges": []}):
        status, body = await call(held, "POST", "/v1/sync/digest", json=bad)
        assert_refused(status, body)


# -- replica acknowledgements -----------------------------------------------------------
@pytest.fixture
async def liar() -> AsyncIterator[str]:
    """A server that answers every request with an empty 200."""

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_an_empty_200_is_not_an_acknowledgement(solo: Node, liar: str) -> None:
    view = RingView(1, (MemberInfo("real", solo.address), MemberInfo("liar", liar)), 2, 2)
    manifest, chunks = build_commit(
        SID,
        1,
        {b"k": b"v"},
        [],
        {},
        1,
        False,
        key_groups=128,
        chunk_size=1 << 20,
        max_chunk=1 << 22,
    )
    transport = HttpTransport(timeout=5.0)
    try:
        with pytest.raises(QuorumNotReached):
            await write_commit(transport, view, manifest, chunks)
    finally:
        await transport.close()
    assert solo.store.head(SID) is None  # no manifest: the commit was never acknowledged


# -- relay ------------------------------------------------------------------------------
async def test_relay_only_follows_live_ring_members(held: Node) -> None:
    hits: list[str] = []
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    probe.listen(8)
    probe.setblocking(False)
    target = f"127.0.0.1:{probe.getsockname()[1]}"
    try:
        plans = [
            Hop(held.address, (), (Hop(target, ()),)),  # not a member: SSRF
            Hop(held.address, (), (Hop(held.address, ()),)),  # itself
            Hop(held.address, (), tuple(Hop(f"10.0.0.{i}:7400", ()) for i in range(100))),
        ]
        for plan in plans:
            status, body = await call(held, "POST", "/v1/relay", data=encode_hop(SID, plan, False))
            assert_refused(status, body, "invalid_request")
        status, body = await call(
            held, "POST", "/v1/relay", data=encode_hop(SID, Hop(held.address, ()), False, 10**6)
        )
        assert_refused(status, body)
        try:
            conn, _ = probe.accept()
            hits.append("connected")
            conn.close()
        except BlockingIOError:
            pass
    finally:
        probe.close()
    assert hits == []


# -- decoding ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method, path, kw",
    [
        (
            "POST",
            "/v1/gossip",
            {"data": b"{}", "headers": {"Content-Type": "application/json; charset=utf-99"}},
        ),
        ("POST", "/v1/sync/have", {"data": b"[" * 5000 + b"]" * 5000}),
        ("POST", "/v1/heads", {"data": b'{"stores": ' + b"[" * 5000 + b"]" * 5000 + b"}"}),
        ("POST", "/v1/chunks", {"data": b'{"keys": ["\xff\xfe"]}'}),
        ("POST", "/v1/sync/have", {"data": b"3"}),
        ("POST", "/v1/sync/have", {"json": {"manifests": [["q1/0/3/default", 10**30, "delta"]]}}),
        ("GET", "/v1/stores/q1/\u00b2/3/default/head", {}),
        ("GET", "/v1/stores/q1/0/\u0663/default/head", {}),
        ("GET", f"{BASE}/chain?version=\u00b9", {}),
        ("GET", "/v1/chunks/q1/0/3/default/\u00b2/d0-0000000000000000", {}),
        (
            "POST",
            f"{BASE}/commit?version=1&epoch=1",
            {"headers": {"X-Statestore-Positions": "[" * 4000 + "]" * 4000}},
        ),
        (
            "POST",
            "/v1/relay",
            {"data": msgpack.packb({"v": 1, "store": SID.path, "depth": "x", "hop": {}})},
        ),
        (
            "POST",
            "/v1/relay",
            {
                "data": msgpack.packb(
                    {
                        "v": 1,
                        "store": SID.path,
                        "hop": {
                            "a": "x",
                            "c": [[0, 2**64 - 1, "d0-0000000000000000", 0, 0, 0, 0]],
                            "k": [],
                        },
                    }
                )
            },
        ),
    ],
)
async def test_undecodable_input_is_4xx_never_500(
    held: Node, method: str, path: str, kw: dict[str, Any]
) -> None:
    before = state_of(held)
    status, body = await call(held, method, path, **kw)
    assert_refused(status, body)
    assert state_of(held) == before


def test_a_chunk_of_nils_is_bounded_by_rows() -> None:
    n = MAX_CHUNK_ROWS * 2 + 2
    raw = b"\x01" + b"\xdd" + n.to_bytes(4, "big") + b"\xc0" * n
    data = zstandard.ZstdCompressor(level=19).compress(raw)
    assert len(data) < 2000
    with pytest.raises(DecompressionBomb):
        decode_chunk(data, max_raw=len(raw) + 1)
    nil_keys = zstandard.ZstdCompressor().compress(b"\x01" + msgpack.packb([None, b"v"]))
    with pytest.raises(CorruptChunk):
        decode_chunk(nil_keys)


# -- slow clients -----------------------------------------------------------------------
@pytest.fixture
async def impatient(tmp_path: Path) -> AsyncIterator[Node]:
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "impatient"),
        storage="memory://",
        replicas=1,
        write_quorum=1,
        dht=False,
        header_timeout=0.5,
        body_timeout=0.5,
    )
    node, runner = await start_node(config)
    yield node
    await stop_node(node, runner)


async def test_a_connection_that_never_finishes_its_headers_is_closed(impatient: Node) -> None:
    host, port = impatient.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /v1/ring HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
    await writer.drain()
    async with asyncio.timeout(30):
        rest = await reader.read()  # the server closes the connection
    assert b"200 OK" not in rest
    writer.close()


async def test_a_tls_handshake_that_never_finishes_is_closed_at_the_header_timeout(
    tmp_path: Path,
) -> None:
    """A connection to a TLS node that never sends its ClientHello is closed once the
    node's header timeout passes (2 s here), where asyncio's own limit held it 60 s: a
    peer opening many such connections held as many file descriptors that long. A real
    client's handshake still succeeds."""
    tls = make_tls(tmp_path / "tls")
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "n"),
        storage="memory://",
        replicas=1,
        write_quorum=1,
        dht=False,
        header_timeout=2.0,
        tls_cert=str(tls.cert),
        tls_key=str(tls.key),
    )
    node, runner = await start_node(config)
    try:
        host, port = node.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        async with asyncio.timeout(30):  # asyncio's own limit: 60 s
            assert await reader.read() == b""  # closed by the node, nothing sent
        writer.close()
        context = ssl.create_default_context(cafile=str(tls.ca))
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://{node.address}/v1/health", ssl=context) as r:
                assert r.status == 200
    finally:
        await stop_node(node, runner)


@pytest.mark.parametrize("path", ["/v1/gossip", "/v1/handover/items", "/v1/handover/tokens"])
async def test_a_stalled_body_is_refused(impatient: Node, path: str) -> None:
    host, port = impatient.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        + b'Content-Length: 1000\r\n\r\n{"epoch": 1, '
    )
    await writer.drain()
    async with asyncio.timeout(30):
        head = await reader.readline()
    assert b" 408 " in head, head
    writer.close()
