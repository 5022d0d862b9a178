"""Manifests copied in batches between nodes (node/moves/copies.py, ``/v1/sync/manifests``): the
batching is pure and covers every item once; a batch lands as one-at-a-time copies would;
bad, oversized or unauthorized batches are refused whole with a 4xx and change nothing. Real
nodes on loopback port 0."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp import web

from statestore.core.handover import batches
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.node.backends import MemoryBackend
from statestore.node.daemon import Node, NodeConfig
from statestore.node.moves.copies import Unsupported, fetch_manifests, push_manifests
from statestore.node.replica import NodeStore
from statestore.node.server import start_node, stop_node
from statestore.wire.bodies import MAX_COPIES
from statestore.wire.manifest import encode_copies, encode_manifest

SID = StoreId("q1", 0, 3, "default")
OTHER = StoreId("q2", 1, 0, "default")


def manifest(store: StoreId, version: int, epoch: int = 1, kind: str = "delta") -> Manifest:
    refs = (ChunkRef(f"d0-{version:016x}", 0, 9, 10, 10, 1, version),)
    return Manifest(store, version, kind, epoch, 128, refs, {})


def item(m: Manifest) -> str:
    return f"m:{m.store.path}/{m.version}/{m.kind}/{m.epoch}"


def held(node: Node) -> dict[str, Any]:
    """Every manifest and head a node holds (compared before and after a refused batch)."""
    return {
        "items": sorted(node.store.manifest_items(), key=str),
        "heads": {s.path: node.store.head(s) for s in node.store.stores()},
    }


async def call(
    node: Node, path: str, data: bytes, token: str | None = None, **headers: str
) -> tuple[int, Any]:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{node.address}{path}", data=data, headers=headers) as r:
            body = await r.read()
            return r.status, json.loads(body) if body.startswith(b"{") else body


# -- batching (pure) ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "keys, size, expected",
    [
        ("", 4, []),
        ("aaaa", 2, [[0, 1], [2, 3]]),
        ("abab", 2, [[0, 2], [1, 3]]),
        ("aabba", 2, [[0, 1], [2, 3], [4]]),
        ("abcab", 2, [[0, 3], [1, 4], [2]]),
        ("abcba", 4, [[2], [1, 3], [0, 4]]),  # partial ones by their last position
        ("aaa", 1, [[0], [1], [2]]),
    ],
)
def test_batches_table(keys: str, size: int, expected: list[list[int]]) -> None:
    assert batches(list(keys), size) == expected


def test_batches_cover_every_position_once_one_key_each() -> None:
    keys = [f"t{(i * 7919) % 5}" for i in range(1000)]
    out = batches(keys, 64)
    assert sorted(p for b in out for p in b) == list(range(1000))
    for b in out:
        assert 1 <= len(b) <= 64 and b == sorted(b) and len({keys[p] for p in b}) == 1
    with pytest.raises(ValueError):
        batches(keys, 0)


# -- one write for many ------------------------------------------------------------------
def test_a_batch_lands_as_one_at_a_time_copies_would() -> None:
    """Epochs of one version in any order, a repeat, two stores: the batch's keys and
    answers are those of copying the same manifests one by one."""
    ms = [
        manifest(SID, 1, 1),
        manifest(SID, 1, 3),  # a higher epoch: the main key, epoch 1 a side key
        manifest(SID, 1, 2),  # between: a side key
        manifest(SID, 1, 3),  # already held
        manifest(SID, 2, 1, "snapshot"),
        manifest(OTHER, 5, 2),
    ]
    one, many = NodeStore(MemoryBackend()), NodeStore(MemoryBackend())
    answers = [one.copy_manifest(m) for m in ms]
    assert answers == [True, True, True, False, True, True]
    assert many.copy_manifests(ms) == answers
    assert list(many.backend.scan(b"")) == list(one.backend.scan(b""))
    assert many.query_bytes("q1") == one.query_bytes("q1") > 0
    assert many.copy_manifests(ms) == [False] * len(ms)


# -- the node's side: real nodes -----------------------------------------------------------
def config(tmp_path: Path, name: str, **kw: Any) -> NodeConfig:
    """A node on port 0 with in-memory storage, R=W=1, no DHT."""
    base = {"storage": "memory://", "replicas": 1, "write_quorum": 1, "dht": False}
    return NodeConfig(port=0, data_dir=str(tmp_path / name), **(base | kw))


async def test_push_and_fetch_between_nodes(tmp_path: Path) -> None:
    a, ra = await start_node(config(tmp_path, "a"))
    b, rb = await start_node(config(tmp_path, "b"))
    c, rc = await start_node(config(tmp_path, "c"))
    try:
        ms = [manifest(SID, v, 1 + v % 3) for v in range(1, MAX_COPIES + 40)]
        ms.append(manifest(OTHER, 1, 1))
        a.store.copy_manifests(ms)
        items = [item(m) for m in ms] + ["m:q1/0/3/default/9999/delta/1"]  # a is missing one
        pushed = await push_manifests(a, b.address, items)  # two requests: over MAX_COPIES
        assert pushed[:-1] == [len(a.store.raw_manifest(m.store, m.version, m.kind)) for m in ms]  # type: ignore[arg-type]
        assert pushed[-1] is None
        # a name in a listing that is not a manifest's lands nothing and stops nothing
        fetched = await fetch_manifests(c, b.address, [*items, "m:not-a-name"])
        assert fetched == [*pushed, None]
        for node in (b, c):
            assert held(node) == held(a)
        # a source that lacks them answers nil: nothing landed, nothing written
        assert await fetch_manifests(c, a.address, ["m:q9/0/0/default/1/delta/1"]) == [None]
    finally:
        for node, runner in ((c, rc), (b, rb), (a, ra)):
            await stop_node(node, runner)


async def test_a_manifest_larger_than_a_batch_goes_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender keeps a batch to MAX_COPIES_BYTES; one manifest over it is sent alone, and
    the target takes it (bounded by --max-body, as a single copy), not refused every round."""
    monkeypatch.setattr("statestore.node.moves.copies.MAX_COPIES_BYTES", 4096)
    a, ra = await start_node(config(tmp_path, "a"))
    b, rb = await start_node(config(tmp_path, "b"))
    try:
        big = [
            Manifest(SID, v, "delta", 1, 128, manifest(SID, v).chunks, {"p": "x" * 5000})
            for v in (1, 2)
        ]
        ms = [*big, manifest(SID, 3), manifest(SID, 4)]
        a.store.copy_manifests(ms)
        pushed = await push_manifests(a, b.address, [item(m) for m in ms])
        assert None not in pushed and pushed[0] > 5000  # type: ignore[operator]
        assert held(b) == held(a)
    finally:
        for node, runner in ((b, rb), (a, ra)):
            await stop_node(node, runner)


async def test_a_peer_that_predates_the_routes_is_unsupported(solo: Node) -> None:
    """A node of an older version answers 404: the round copies one at a time instead."""
    app = web.Application()  # no routes: what a node that predates them answers
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        m = manifest(SID, 1)
        solo.store.copy_manifest(m)
        with pytest.raises(Unsupported):
            await push_manifests(solo, f"127.0.0.1:{port}", [item(m)])
        with pytest.raises(Unsupported):
            await fetch_manifests(solo, f"127.0.0.1:{port}", [item(m)])
    finally:
        await runner.cleanup()


async def test_below_the_floor_is_refused_per_manifest(solo: Node) -> None:
    solo.store.apply_floor(SID, 3)
    # a delta at the floor with no snapshot there of its epoch: its base is gone
    ms = [manifest(SID, 2), manifest(SID, 3), manifest(SID, 4), manifest(OTHER, 1)]
    raws = [encode_manifest(m) for m in ms]
    status, body = await call(solo, "/v1/sync/manifests", encode_copies(raws))
    assert (status, body) == (200, {"stored": [None, None, True, True]})
    assert solo.store.raw_manifest(SID, 2, "delta") is None
    assert solo.store.raw_manifest(SID, 3, "delta") is None
    status, body = await call(solo, "/v1/sync/manifests", encode_copies(raws))
    assert (status, body) == (200, {"stored": [None, None, False, False]})


def _bad_bodies() -> list[tuple[str, bytes, str]]:
    good = encode_manifest(manifest(SID, 1))
    bad_chunk = msgpack.unpackb(good)
    bad_chunk["chunks"][0][0] = "../../x"
    return [
        ("not msgpack", b"\xc1", "malformed_data"),
        ("a map", msgpack.packb({"a": good}), "malformed_data"),
        ("trailing bytes", encode_copies([good]) + b"\x00", "malformed_data"),
        ("a number", msgpack.packb([good, 5]), "malformed_data"),
        ("a nil", encode_copies([good, None]), "invalid_request"),
        ("a bad manifest", encode_copies([good, b"\x81\xa1a\x01"]), "malformed_data"),
        ("a bad chunk name", encode_copies([good, msgpack.packb(bad_chunk)]), "malformed_data"),
        ("too many", encode_copies([good] * (MAX_COPIES + 1)), "invalid_request"),
        ("a huge array header", b"\xdd\xff\xff\xff\xff", "invalid_request"),
    ]


@pytest.mark.parametrize("what, body, code", _bad_bodies(), ids=[b[0] for b in _bad_bodies()])
async def test_a_bad_batch_is_refused_whole(solo: Node, what: str, body: bytes, code: str) -> None:
    solo.store.copy_manifest(manifest(SID, 7))
    before = held(solo)
    status, answer = await call(solo, "/v1/sync/manifests", body)
    assert status == 400, (what, answer)
    assert answer["error"]["code"] == code, (what, answer)
    assert held(solo) == before  # the good manifest before the bad one was not kept


@pytest.mark.parametrize(
    "body, code",
    [
        (b"[]", "malformed_data"),
        (b'{"manifests": [["q1/0/3/default", 0, "delta", 1]]}', "malformed_data"),
        (b'{"manifests": [["q1/0/3/default", 1, "delta", -1]]}', "malformed_data"),
        (b'{"manifests": [["q!/0/3/default", 1, "delta", 1]]}', "invalid_store_id"),
        (b'{"manifests": [["q1/0/3/default", 1, "delta/../x", 1]]}', "malformed_data"),
        (
            json.dumps({"manifests": [["q1/0/3/default", 1, "delta", 1]] * (MAX_COPIES + 1)}),
            "invalid_request",
        ),
    ],
)
async def test_a_bad_read_is_refused(solo: Node, body: bytes | str, code: str) -> None:
    data = body.encode() if isinstance(body, str) else body
    status, answer = await call(solo, "/v1/sync/manifests/read", data)
    assert (status, answer["error"]["code"]) == (400, code), answer


ADMIN = "admin-token-0000000001"
WRITER = "q1-writer-token-00001"
Q2_ADMIN = "q2-admin-token-000001"


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    """A node with tokens and the cluster secret, and a peer holding the same secret."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
                WRITER: {"queries": ["q1"], "rights": ["read", "write"]},
                Q2_ADMIN: {"queries": ["q2"], "rights": ["read", "write", "admin"]},
            }
        )
    )
    secret = tmp_path / "cluster.secret"  # tokens need one (node/config.py)
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    node, runner = await start_node(
        config(tmp_path, "g", auth_file=str(tokens), cluster_secret_file=str(secret))
    )
    peer, peer_runner = await start_node(config(tmp_path, "p", cluster_secret_file=str(secret)))
    yield node, peer
    await stop_node(peer, peer_runner)
    await stop_node(node, runner)


async def test_copies_are_for_the_ring_not_for_clients(guarded: tuple[Node, Node]) -> None:
    """Copies are node-only (node/policy.py): any client token, the ring admin's included,
    is refused (401), and nothing is written; a ring node's signed batch lands."""
    node, peer = guarded
    body = encode_copies([encode_manifest(manifest(OTHER, 1)), encode_manifest(manifest(SID, 1))])
    read = json.dumps({"manifests": [[SID.path, 1, "delta", 1]]}).encode()
    for token in (None, WRITER, Q2_ADMIN, ADMIN):
        got, answer = await call(node, "/v1/sync/manifests", body, token)
        assert got == 401, (token, answer)
        got, answer = await call(node, "/v1/sync/manifests/read", read, token)
        assert got == 401, (token, answer)
    assert held(node)["items"] == []
    answer = await peer.transport.request("POST", node.address, "/v1/sync/manifests", body=body)
    assert answer.json() == {"stored": [True, True]}
    answer = await peer.transport.request(
        "POST", node.address, "/v1/sync/manifests/read", body=read
    )
    assert msgpack.unpackb(answer.body) == [encode_manifest(manifest(SID, 1))]
