"""The second hostile review's findings that lost or resurrected data (docs/security.md), on
real nodes (in-process, port 0):

- 1: a drop's purge stops batched manifest copies (``POST /v1/sync/manifests``) as it stops a
  single ``?copy=1``, and repair never pushes a manifest to a target whose push of one of its
  chunks failed;
- 6: a floor carried in a peer's ``sync/have`` answer takes ``gc``'s checks (never above the
  head, at a snapshot this node holds) before it drops anything;
- 10: data written to a node that does not own it is charged to the owners' quotas when
  repair hands it to them, so no node ends up holding more than its quota.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statestore.core.chunk import EncodedChunk, encode_chunks
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Manifest
from statestore.node.daemon import Node, NodeConfig
from statestore.node.repair import ask_have, repair_pass
from statestore.node.server import start_node, stop_node
from statestore.wire.manifest import encode_copies, encode_manifest

SID = StoreId("q1", 0, 3, "default")
OTHER = StoreId("q2", 0, 0, "default")


async def call(node: Node, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"http://{node.address}{path}", **kw) as r:
            body = await r.read()
            return r.status, json.loads(body) if body.startswith(b"{") else body


def chunk(size: int = 200) -> EncodedChunk:
    (c,) = encode_chunks({b"k": os.urandom(size)}, [])
    return c


def commit_local(
    node: Node, store: StoreId, version: int, kind: str = "delta", c: EncodedChunk | None = None
) -> Manifest:
    """A version of ``store`` written straight into ``node``'s storage, with one chunk."""
    c = c or chunk()
    node.store.put_chunk(chunk_key(store, version, c.name), c.data)
    m = Manifest(store, version, kind, 1, 128, (ChunkRef.of(c),), {})
    node.store.put_manifest(m)
    return m


def item(m: Manifest) -> str:
    return f"m:{m.store.path}/{m.version}/{m.kind}/{m.epoch}"


async def ring_of(tmp_path: Path, n: int, replicas: int, **kw: Any) -> list[Node]:
    """``n`` nodes in one ring (gossip from the first), with in-memory storage and no DHT.
    Their own repair loops never run during a test (a pass is called by hand), and no node
    is declared down."""
    base: dict[str, Any] = {
        "storage": "memory://",
        "replicas": replicas,
        "write_quorum": 1,
        "dht": False,
        "gossip_interval": 0.1,
        "suspect_after": 30.0,
        "down_after": 60.0,
        "repair_interval": 3600.0,
        "compact_interval": 3600.0,
    }
    nodes: list[Node] = []
    runners = []
    for i in range(n):
        seeds = [nodes[0].address] if nodes else []
        config = NodeConfig(port=0, data_dir=str(tmp_path / f"n{i}"), seeds=seeds, **(base | kw))
        node, runner = await start_node(config)
        nodes.append(node)
        runners.append(runner)
    RUNNERS[id(nodes)] = runners
    for _ in range(300):  # every node sees every other live
        if all(len(node.view().live_addresses()) == n for node in nodes):
            return nodes
        await asyncio.sleep(0.05)
    raise AssertionError("the ring did not form")


RUNNERS: dict[int, list[Any]] = {}


async def stop_ring(nodes: list[Node]) -> None:
    for node, runner in reversed(list(zip(nodes, RUNNERS.pop(id(nodes)), strict=True))):
        await stop_node(node, runner)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[list[Node]]:
    """Two nodes, R=2: both own everything."""
    nodes = await ring_of(tmp_path, 2, 2)
    yield nodes
    await stop_ring(nodes)


# -- 1: a drop stops batched copies, and repair sends no manifest without its chunks ---------
async def test_a_batched_copy_is_refused_for_a_query_being_dropped(pair: list[Node]) -> None:
    a, b = pair
    dropped, kept = commit_local(a, SID, 1), commit_local(a, OTHER, 1)
    drop = {"id": "d1", "at": 1.0}
    status, body = await call(b, "POST", "/v1/queries/q1/purge", json={**drop, "phase": "purge"})
    assert status == 200, body
    # between purge and seal, a batch with the dropped query's manifest and another's
    raws = [encode_manifest(dropped), encode_manifest(kept)]
    headers = {"Content-Type": "application/msgpack"}
    status, body = await call(
        b, "POST", "/v1/sync/manifests", data=encode_copies(raws), headers=headers
    )
    assert status == 200, body
    assert body["stored"] == [None, True]  # the dropped query's: not taken; the other's: kept
    status, body = await call(b, "POST", "/v1/queries/q1/purge", json={**drop, "phase": "seal"})
    assert status == 200, body
    # after the seal the dropped head is not back, so a new incarnation starts at version 1
    assert b.store.head(SID) is None and b.store.stores() == [OTHER]
    fresh = Manifest(SID, 1, "delta", 0, 128, dropped.chunks, {})
    assert b.store.put_manifest(fresh)  # epoch 0: no StaleEpoch from a resurrected head


async def test_repair_sends_no_manifest_whose_chunk_did_not_land(pair: list[Node]) -> None:
    a, b = pair
    good = commit_local(a, SID, 1)
    bad = commit_local(a, SID, 2)
    rotten = chunk_key(SID, 2, bad.chunks[0].name)
    a.store.backend.write({b"c:" + rotten.encode(): b"rotten bytes"}, [])  # its push fails
    await repair_pass(a, a.view(), allow_handoff=True)
    # version 1 went with its chunk; version 2's chunk failed, so its manifest stayed behind
    assert b.store.raw_manifest(SID, 1, "delta") == a.store.raw_manifest(SID, 1, "delta")
    assert b.store.raw_manifest(SID, 2, "delta") is None
    assert b.store.head(SID) is not None and b.store.head(SID).version == 1  # type: ignore[union-attr]
    assert b.store.has_chunks([chunk_key(SID, 1, good.chunks[0].name), rotten]) == [True, False]


# -- 6: floors in sync/have answers take gc's checks ------------------------------------------
@pytest.mark.parametrize(
    "floor, applied",
    [
        (9, False),  # above a's head (version 3): it would erase the store
        (2, False),  # a's version 2 is a delta: versions 3 and up would not restore
        (3, True),  # a snapshot a holds, at the head: applied, as gc would
    ],
)
async def test_a_floor_from_a_have_answer_takes_the_gc_checks(
    pair: list[Node], floor: int, applied: bool
) -> None:
    a, b = pair
    for version, kind in ((1, "delta"), (2, "delta"), (3, "snapshot")):
        commit_local(a, SID, version, kind)
        commit_local(b, SID, version, kind)  # b, the other home, holds them too
    a.store.set_retain(SID, 1)  # its writer keeps the head only: a floor at 3 keeps that
    held = sorted(a.store.chunk_keys())
    b.store.apply_floor(SID, floor)  # what b answers about SID (a gc b took, or a lie)
    items = [f"m:{SID.path}/1/delta/1", *(f"c:{k}" for k in held)]
    await ask_have(a, {b.address: items})
    assert a.store.floor(SID) == (floor if applied else 0)
    versions = a.store.versions(SID)
    assert versions == ([3] if applied else [1, 2, 3]), versions
    # the gc route gives the same answer, from the same check
    status, body = await call(a, "POST", f"/v1/stores/{SID.path}/gc", json={"floor": 9})
    assert status == 400 and "above the head" in body["error"]["message"], body


# -- 10: quotas hold against writes to a node that does not own the data -----------------------
async def test_data_written_to_a_non_owner_is_charged_where_repair_hands_it(
    tmp_path: Path,
) -> None:
    quota = 100_000
    qfile = tmp_path / "quotas.json"
    qfile.write_text(json.dumps({"q1": {"max_bytes": quota}}))
    nodes = await ring_of(tmp_path, 3, 2, quota_file=str(qfile))
    try:
        x = nodes[2]  # writes go here, for chunks x does not own
        view = x.view()

        def foreign_chunk() -> tuple[str, bytes]:
            while True:
                c = chunk(40_000)
                key = chunk_key(SID, 1, c.name)
                if x.address not in view.replicas_of(key):
                    return key, c.data

        sent = 0
        for _ in range(4):  # each round: fill x, then let repair hand it to the owners
            while True:
                key, data = foreign_chunk()
                status, body = await call(x, "PUT", f"/v1/chunks/{key}", data=data)
                if status != 201:
                    assert (status, body["error"]["code"]) == (507, "quota_exceeded"), body
                    break
                sent += len(data)
            for _ in range(2):  # a pass pushes; the next drops what every owner confirmed
                await repair_pass(x, x.view(), allow_handoff=True)
        held = {n.address: n.store.query_bytes("q1") for n in nodes}
        assert sent > quota  # the attack wrote more than one node's quota in all
        assert all(used <= quota for used in held.values()), held
        # nothing written was lost: every chunk taken is on some node still
        assert sum(held.values()) >= sent
    finally:
        await stop_ring(nodes)
