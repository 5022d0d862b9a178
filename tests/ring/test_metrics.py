"""``GET /metrics``: real nodes on port 0, real commits and reads; the text is parsed with
``prometheus_client``'s own parser and the figures must move with what was done."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from client import AsyncRingClient, StoreId
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node
from statestore.wire.rows import encode_rows
from tests.ringkit import scrape, value

SID = StoreId("q1", 0, 3, "default")


async def get(node: Node, path: str) -> int:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.address}{path}") as r:
            await r.read()
            return r.status


@pytest.fixture
async def other(tmp_path: Path) -> AsyncIterator[Node]:
    """A second node in the same process: its registry must not see the first one's work."""
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "other"),
        storage="memory://",
        replicas=1,
        write_quorum=1,
        dht=False,
    )
    node, runner = await start_node(config)
    yield node
    await stop_node(node, runner)


async def test_commits_and_reads_move_the_metrics(solo: Node, other: Node) -> None:
    before = await scrape(solo)
    assert value(before, "statestore_commit_seconds_count") == 0
    assert value(before, "statestore_stores_held") == 0
    assert value(before, "statestore_members", status="up") == 1
    assert value(before, "statestore_ring_epoch") >= 1

    async with AsyncRingClient([solo.address]) as ring:
        for v in range(1, 4):  # the client writes chunks and manifests itself
            await ring.commit(SID, v, {b"k%d" % v: b"x" * 100}, [], {"src": v}, epoch=1)
        assert await ring.get(SID, b"k1") == b"x" * 100
    rows = b"".join(encode_rows([(b"a", b"1"), (b"b", b"2")]))
    async with aiohttp.ClientSession() as s:  # the coordinator path: commit, state, point read
        url = f"http://{solo.address}/v1/stores/{SID.path}"
        async with s.post(f"{url}/commit?version=4&epoch=1", data=rows) as r:
            assert r.status == 201, await r.text()
        async with s.get(f"{url}/state") as r:
            assert r.status == 200
            await r.read()
        async with s.get(f"{url}/key?key={b'a'.hex()}") as r:
            assert r.status == 200 and await r.read() == b"1"
    assert await get(solo, "/v1/stores/q!/0/0/default/head") == 400
    assert await get(solo, "/v1/stores/q1/0/0/none/head") == 404

    after = await scrape(solo)
    assert value(after, "statestore_commit_seconds_count") == 1
    assert value(after, "statestore_restore_seconds_count", path="state") == 1
    assert value(after, "statestore_point_read_seconds_count") == 1
    assert value(after, "statestore_chunk_seconds_count", op="put") >= 4
    assert value(after, "statestore_chunk_seconds_count", op="get") >= 1
    assert (
        value(after, "statestore_http_bytes_total", direction="in")
        > value(before, "statestore_http_bytes_total", direction="in") + 4 * 100
    )
    assert value(after, "statestore_http_bytes_total", direction="out") > 0
    assert value(after, "statestore_stores_held") == 1
    assert value(after, "statestore_manifests_held") >= 4
    assert value(after, "statestore_chunks_held") >= 4
    assert value(after, "statestore_refusals_total", status="400", code="invalid_store_id") == 1
    assert value(after, "statestore_refusals_total", status="404", code="store_not_found") >= 1
    assert value(after, "statestore_disk_used_bytes") > 0
    assert value(after, "statestore_disk_total_bytes") > 0
    assert value(after, "statestore_repair_backlog") == 0
    assert value(after, "statestore_in_flight", kind="restore") == 0

    mine = await scrape(other)  # one registry per node
    assert value(mine, "statestore_commit_seconds_count") == 0
    assert value(mine, "statestore_chunk_seconds_count", op="put") == 0
    assert value(mine, "statestore_stores_held") == 0
