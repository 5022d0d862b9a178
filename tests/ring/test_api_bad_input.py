"""Bad input at the HTTP boundary: a clear 4xx naming the problem, and committed data intact."""

from __future__ import annotations

import io
import json

import aiohttp
import pytest
import zstandard

from client import (
    AsyncRingClient,
    DecompressionBomb,
    InvalidRequest,
    NodeUnavailable,
    StaleEpoch,
    StoreId,
    StoreNotFound,
    VersionConflict,
    VersionNotFound,
)
from statestore.core.chunk import checksum
from statestore.core.ids import chunk_key
from statestore.core.manifest import ChunkRef, Manifest
from statestore.node.daemon import Node
from statestore.wire.manifest import encode_manifest

SID = StoreId("q1", 0, 3, "default")


async def call(node: Node, method: str, path: str, **kw: object) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"http://{node.address}{path}", **kw) as r:  # type: ignore[arg-type]
            body = await r.read()
            assert r.headers["X-Statestore-Epoch"].isdigit()
            return r.status, json.loads(body) if body.startswith(b"{") else {}


@pytest.mark.parametrize(
    "path, status, code",
    [
        ("/v1/stores/q!/0/0/default/head", 400, "invalid_store_id"),
        ("/v1/stores/q/x/0/default/head", 400, "invalid_request"),
        ("/v1/stores/q/0/0/..%2F..%2Fetc/head", 400, "invalid_store_id"),
        ("/v1/stores/q/0/0/" + "n" * 200 + "/head", 400, "invalid_store_id"),
        ("/v1/stores/q/0/0/default/head", 404, "store_not_found"),
        ("/v1/stores/q/0/0/default/chain?version=abc", 400, "invalid_request"),
        ("/v1/chunks/q/0/0/default/1/d0-0000000000000000", 404, "not_found"),
        ("/v1/chunks/q/0/0/default/1/..%2F..%2Fx", 400, "invalid_store_id"),
        ("/v1/chunks/q/0/0/default/1", 400, "invalid_store_id"),
        ("/v1/nothing", 404, "http_error"),
    ],
)
async def test_bad_paths(solo: Node, path: str, status: int, code: str) -> None:
    got, body = await call(solo, "GET", path)
    assert got == status
    assert body["error"]["code"] == code  # type: ignore[index]
    assert body["error"]["message"]  # type: ignore[index]


async def test_oversized_body_is_413_with_a_hint(solo: Node) -> None:
    status, body = await call(
        solo,
        "PUT",
        "/v1/chunks/q/0/0/default/1/d0-0000000000000000",
        data=io.BytesIO(b"x" * (2 << 20)),
    )
    assert status == 413
    assert "--max-body" in body["error"]["message"]  # type: ignore[index]


async def test_wrong_checksum_and_malformed_wire_data(solo: Node) -> None:
    status, body = await call(
        solo, "PUT", "/v1/chunks/q/0/0/default/1/d0-0000000000000001", data=b"abc"
    )
    assert (status, body["error"]["code"]) == (422, "corrupt_chunk")  # type: ignore[index]
    status, body = await call(solo, "PUT", "/v1/manifests/q/0/0/default/1/delta", data=b"\xc1")
    assert (status, body["error"]["code"]) == (400, "malformed_data")  # type: ignore[index]
    m = Manifest(SID, 1, "delta", 1, 128, (), {})
    status, body = await call(
        solo, "PUT", "/v1/manifests/q/0/0/default/2/delta", data=encode_manifest(m)
    )
    assert status == 400 and "was sent to" in body["error"]["message"]  # type: ignore[index]
    status, body = await call(solo, "POST", "/v1/gossip", data=b"{not json")
    assert (status, body["error"]["code"]) == (400, "malformed_data")  # type: ignore[index]
    status, body = await call(
        solo, "POST", "/v1/stores/q/0/0/default/commit?version=1", data=b"\x00\x00\x00\x09ab"
    )
    assert (status, body["error"]["code"]) == (400, "malformed_data")  # type: ignore[index]


async def test_a_part_of_a_chunk_is_answered_and_bad_ranges_are_400s(solo: Node) -> None:
    """``GET /v1/chunks/{key}?offset=&length=``: the bytes asked for, and a clear 400 for a
    range that is malformed, empty or past the chunk's end (never a 5xx, never a short read)."""
    async with AsyncRingClient([solo.address]) as ring:
        await ring.commit(SID, 1, {b"k%d" % i: b"v" * 100 for i in range(500)}, [], {}, epoch=1)
        (ref,) = (await ring.open(SID)).chain[0].chunks
    key = chunk_key(SID, 1, ref.name)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{solo.address}/v1/chunks/{key}") as r:
            whole = await r.read()
        async with s.get(f"http://{solo.address}/v1/chunks/{key}?offset=3&length=40") as r:
            assert r.status == 200 and await r.read() == whole[3:43]
        end = f"offset={len(whole) - 1}&length=1"
        async with s.get(f"http://{solo.address}/v1/chunks/{key}?{end}") as r:
            assert r.status == 200 and await r.read() == whole[-1:]
    for query, words in [
        (f"offset={len(whole) - 1}&length=2", "past its end"),
        (f"offset={len(whole)}&length=1", "past its end"),
        ("offset=0&length=0", "at least 1 byte"),
        ("offset=-1&length=5", "offset is '-1'"),
        ("offset=1", "length is None"),
        ("length=1", "offset is None"),
        ("offset=1e3&length=1", "offset"),
        ("offset=0&length=" + "9" * 40, "length"),
    ]:
        got, body = await call(solo, "GET", f"/v1/chunks/{key}?{query}")
        assert got == 400 and body["error"]["code"] == "invalid_request", (query, body)  # type: ignore[index]
        assert words in body["error"]["message"], (query, body)  # type: ignore[index]
    got, _ = await call(solo, "GET", f"/v1/chunks/{key[:-1]}0?offset=0&length=1")
    assert got == 404


async def test_chunk_batch_names_bad_requests_and_skips_missing_chunks(solo: Node) -> None:
    async with AsyncRingClient([solo.address]) as ring:
        await ring.commit(SID, 1, {b"a": b"1"}, [], {}, epoch=1)
        (st,) = await ring.restore_many([SID], plan="star")
        assert dict(st) == {b"a": b"1"} and st.stats["batched"] == st.stats["chunks"] == 1
    cases = [
        (b"[1, 2]", 400, "malformed_data", '{"keys"'),
        (b'{"keys": "x"}', 400, "malformed_data", '{"keys"'),
        (b"{nope", 400, "malformed_data", "not JSON"),
        (json.dumps({"keys": ["q/0/0/default/1/x"] * 10_001}).encode(), 400, "", "split it"),
        (b'{"keys": ["q/0/0/../1/x"]}', 400, "invalid_store_id", ""),
    ]
    for data, status, code, words in cases:
        got, body = await call(solo, "POST", "/v1/chunks", data=data)
        err = body["error"]
        assert got == status and code in err["code"] and words in err["message"], body  # type: ignore[index]
    # batched heads and chains: clear 400s, and null where the node has no such store
    for path, data, words in [
        ("/v1/heads", b'{"stores": 3}', '{"stores"'),
        ("/v1/heads", b'{"stores": [7]}', "QUERY/OPERATOR"),
        ("/v1/chains", b'{"stores": [["q/0/3/default"]]}', "[QUERY/OPERATOR"),
        ("/v1/chains", b'{"stores": [["q/0/3/default", "x"]]}', "positive integer"),
        ("/v1/chains", json.dumps({"stores": [[SID.path, 1]] * 1001}).encode(), "split it"),
    ]:
        got, body = await call(solo, "POST", path, data=data)
        assert got == 400 and words in body["error"]["message"], body  # type: ignore[index]
    got, body = await call(
        solo, "POST", "/v1/heads", data=json.dumps({"stores": [SID.path, "n/0/0/x"]})
    )
    assert (got, body) == (200, {"heads": [{"version": 1, "epoch": 1}, None]})
    async with AsyncRingClient([solo.address]) as ring:
        with pytest.raises(StoreNotFound):
            await ring.restore_many([SID, StoreId("nothing", 0, 0)])
        with pytest.raises(VersionNotFound):
            await ring.restore_many([(SID, 5)])
        with pytest.raises(InvalidRequest, match="version"):
            await ring.restore_many([(SID, 0)])
    # a batch asking for chunks this node does not hold answers with what it does hold
    async with aiohttp.ClientSession() as s:
        missing = chunk_key(SID, 9, "d0-0000000000000000")
        async with s.post(
            f"http://{solo.address}/v1/chunks", data=json.dumps({"keys": [missing]})
        ) as r:
            assert r.status == 200 and await r.read() == b""


async def test_client_round_trip_and_typed_errors(solo: Node) -> None:
    async with AsyncRingClient([solo.address]) as ring:
        await ring.commit(SID, 1, {b"a": b"1", b"b": b"2"}, [], {"src": 1}, epoch=3)
        await ring.commit(SID, 2, {b"c": b"3"}, [b"a"], {"src": 2}, epoch=3)
        st = await ring.restore(SID, 2)
        assert dict(st) == {b"b": b"2", b"c": b"3"}
        assert (st.version, st.epoch, st.positions, st.plan) == (2, 3, {"src": 2}, "star")
        assert dict(await ring.restore(SID, 1)) == {b"a": b"1", b"b": b"2"}
        assert await ring.get(SID, b"c") == b"3"
        assert await ring.get(SID, b"a") is None
        assert await ring.get(SID, b"a", version=1) == b"1"
        assert (await ring.latest(SID)).version == 2
        assert await ring.versions(SID) == [1, 2]
        # idempotent re-commit, conflicting content, zombie writer
        await ring.commit(SID, 2, {b"c": b"3"}, [b"a"], {"src": 2}, epoch=3)
        with pytest.raises(VersionConflict):
            await ring.commit(SID, 2, {b"c": b"other"}, [], {}, epoch=3)
        with pytest.raises(StaleEpoch):
            await ring.commit(SID, 3, {b"z": b"z"}, [], {}, epoch=2)
        with pytest.raises(StoreNotFound):
            await ring.restore(StoreId("nope", 0, 0))
        with pytest.raises(VersionNotFound, match="no version 7"):
            await ring.restore(SID, 7)
        # nothing above touched what was committed
        assert dict(await ring.restore(SID)) == {b"b": b"2", b"c": b"3"}


async def test_decompression_bomb_is_refused_on_restore(solo: Node) -> None:
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\x01" + b"\x00" * (16 << 20))
    digest = checksum(bomb)
    name = f"d0-{digest:016x}"
    bomb_sid = StoreId("bomb", 0, 0)
    async with aiohttp.ClientSession() as s:
        r = await s.put(
            f"http://{solo.address}/v1/chunks/{chunk_key(bomb_sid, 1, name)}", data=bomb
        )
        assert r.status == 201
        m = Manifest(
            bomb_sid,
            1,
            "delta",
            1,
            128,
            (ChunkRef(name, 0, 127, len(bomb), 16 << 20, 1, digest),),
            {},
        )
        r = await s.put(
            f"http://{solo.address}/v1/manifests/bomb/0/0/default/1/delta", data=encode_manifest(m)
        )
        assert r.status == 201
    async with AsyncRingClient([solo.address], max_chunk=1 << 20) as ring:
        with pytest.raises(DecompressionBomb, match="past the 1048576-byte limit"):
            await ring.restore(bomb_sid, 1)


async def test_unreachable_seed_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ring = AsyncRingClient([f"127.0.0.1:{port}"], timeout=2.0)
    with pytest.raises(NodeUnavailable, match="no node of the ring answered"):
        await ring.connect()
    await ring.close()


def test_bad_seeds_are_refused() -> None:
    for bad in ([], ["nohost"], ["h:99999"], "h:x"):
        with pytest.raises(ValueError, match=r"seed|HOST:PORT"):
            AsyncRingClient(bad)


async def test_coordinator_commit_and_state_round_trip(solo: Node) -> None:
    from statestore.wire.rows import decode_rows, encode_rows

    base = f"http://{solo.address}/v1/stores/coord/1/2/default"
    async with aiohttp.ClientSession() as s:
        for v, rows in ((1, [(b"a", b"1"), (b"b", b"2")]), (2, [(b"a", None), (b"c", b"3")])):
            body = b"".join(encode_rows(rows))
            r = await s.post(
                f"{base}/commit?version={v}&epoch=4",
                data=body,
                headers={"X-Statestore-Positions": json.dumps({"off": v})},
            )
            assert r.status == 201, await r.text()
        for plan in ("star", "line", "tree", "auto"):
            r = await s.get(f"{base}/state?plan={plan}")
            assert r.status == 200
            assert r.headers["X-Statestore-Version"] == "2"
            assert json.loads(r.headers["X-Statestore-Positions"]) == {"off": 2}
            assert decode_rows(await r.read()) == ({b"b": b"2", b"c": b"3"}, [])
        r = await s.get(f"{base}/state?version=1")
        assert decode_rows(await r.read())[0] == {b"a": b"1", b"b": b"2"}
        r = await s.get(f"{base}/state?version=9")
        assert r.status == 404 and (await r.json())["error"]["code"] == "version_not_found"
        r = await s.post(f"{base}/commit?version=3&epoch=1", data=b"")
        assert r.status == 409 and (await r.json())["error"]["code"] == "stale_epoch"
        r = await s.post(
            f"{base}/commit?version=3&epoch=4", data=b"", headers={"X-Statestore-Positions": "[1]"}
        )
        assert r.status == 400 and "JSON object" in (await r.json())["error"]["message"]


async def test_batched_reads_from_a_node_without_them_are_unavailable() -> None:
    """A node older than POST /v1/heads and /v1/chains answers 404 http_error: that is not
    an answer about any store (no StoreNotFound), so restore_many can fall back."""
    from aiohttp import web

    from client import Unavailable
    from statestore.core.view import RingView
    from statestore.net.http import HttpTransport
    from statestore.net.reads import read_chains, read_heads

    async def old_node(request: web.Request) -> web.Response:
        err = {"error": {"code": "http_error", "message": "Not Found: " + request.path}}
        return web.json_response(err, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", old_node)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        member = {"id": "a", "address": f"127.0.0.1:{port}", "status": "up"}
        view = RingView.from_json(
            {"epoch": 1, "replicas": 1, "write_quorum": 1, "vnodes": 8, "members": [member]}
        )
        transport = HttpTransport(timeout=5.0)
        try:
            with pytest.raises(Unavailable, match="does not serve /v1/heads"):
                await read_heads(transport, view, [SID])
            with pytest.raises(Unavailable, match="does not serve /v1/chains"):
                await read_chains(transport, view, [(SID, 1)])
        finally:
            await transport.close()
    finally:
        await runner.cleanup()
