"""A token scoped to some queries sees nothing of another tenant's: /v1/stores and
/v1/inventory filtered them out already; /v1/activity (its store names and clients'
addresses), the per-query series of /metrics and /v1/tombstones showed them to any token on
the builds before (hostile review 3). A token on every query still sees them all."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp

from client import AsyncRingClient, StoreId
from statestore.node.server import start_node, stop_node
from tests.ringkit import SECRET, call, config, nodes

A_READER = "a-star-reader-token-001"
B_WRITER = "b1-writer-token-000001"
TOKENS = {
    A_READER: {"queries": ["a*"], "rights": ["read"]},
    B_WRITER: {"queries": ["b1"], "rights": ["read", "write"]},
}
B1 = StoreId("b1", 0, 1, "secret-store-name")


async def test_a_scoped_reader_sees_no_other_query_in_activity_or_metrics(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(TOKENS))
    (tmp_path / "s").write_bytes(SECRET)
    node, runner = await start_node(
        config(
            tmp_path,
            "n",
            replicas=1,
            write_quorum=1,
            auth_file=str(tmp_path / "t.json"),
            cluster_secret_file=str(tmp_path / "s"),
        )
    )
    try:
        async with AsyncRingClient([node.address], token=B_WRITER) as ring:
            await ring.commit(B1, 1, {b"k": b"v" * 1000}, [], {}, epoch=1)
        # b1's writer has a commit in flight (its body still arriving)
        host, port = node.address.rsplit(":", 1)
        _r, w = await asyncio.open_connection(host, int(port))
        w.write(
            f"POST /v1/stores/{B1.path}/commit?version=2&epoch=1 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {B_WRITER}\r\nContent-Length: 100\r\n\r\n".encode()
        )
        await w.drain()
        await asyncio.sleep(0.3)
        # the a* reader: b1 is none of its business
        status, stores = await call(node.address, "GET", "/v1/stores", token=A_READER)
        assert status == 200 and stores["stores"] == []
        status, act = await call(node.address, "GET", "/v1/activity", token=A_READER)
        assert status == 200 and act["operations"] == []
        status, act = await call(node.address, "GET", "/v1/activity", token=B_WRITER)
        assert status == 200 and any(op["store"] == B1.path for op in act["operations"])
        seen = {}
        for token in (A_READER, B_WRITER):
            async with aiohttp.ClientSession() as s:
                async with s.get(
                    f"http://{node.address}/metrics",
                    headers={"Authorization": f"Bearer {token}"},
                ) as resp:
                    text = await resp.text()
            seen[token] = [x for x in text.splitlines() if x.startswith("statestore_query_bytes{")]
            assert "statestore_members" in text  # the rest of the metrics are there
        assert seen[A_READER] == [] and any('query="b1"' in x for x in seen[B_WRITER])
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()
    finally:
        await stop_node(node, runner)


A_ADMIN = "a-star-admin-token-0001"
RING_ADMIN = "ring-admin-token-000001"


async def test_a_scoped_admin_lists_only_its_queries_tombstones(tmp_path: Path) -> None:
    tokens = TOKENS | {
        A_ADMIN: {"queries": ["a*"], "rights": ["read", "write", "admin"]},
        RING_ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
    }
    (tmp_path / "t.json").write_text(json.dumps(tokens))
    (tmp_path / "s").write_bytes(SECRET)
    node, runner = await start_node(
        config(
            tmp_path,
            "n",
            replicas=1,
            write_quorum=1,
            auth_file=str(tmp_path / "t.json"),
            cluster_secret_file=str(tmp_path / "s"),
        )
    )
    try:
        status, _ = await call(
            node.address, "POST", "/v1/queries/b1-payroll/drop", token=RING_ADMIN
        )
        assert status == 200
        status, _ = await call(node.address, "GET", "/v1/inventory", token=A_ADMIN)
        assert status == 200
        status, body = await call(node.address, "GET", "/v1/tombstones", token=A_ADMIN)
        assert status == 200 and body["tombstones"] == []
        status, body = await call(node.address, "GET", "/v1/tombstones", token=RING_ADMIN)
        assert status == 200 and [t["query"] for t in body["tombstones"]] == ["b1-payroll"]
    finally:
        await stop_node(node, runner)


async def test_a_scoped_reader_sees_no_other_query_in_the_rings_activity(
    tmp_path: Path,
) -> None:
    """``?scope=ring``: the node asks its peers with the secret, so they answer a node,
    everything; it filters their answers by the caller's queries too (a second review of
    the filter found another tenant's operations passed through)."""
    (tmp_path / "t.json").write_text(json.dumps(TOKENS))
    (tmp_path / "s").write_bytes(SECRET)
    async with nodes(
        tmp_path,
        2,
        replicas=2,
        write_quorum=1,
        auth_file=str(tmp_path / "t.json"),
        cluster_secret_file=str(tmp_path / "s"),
    ) as (n0, n1):
        # B's commit in flight on n1 (its body still arriving)
        host, port = n1.address.rsplit(":", 1)
        _r, w = await asyncio.open_connection(host, int(port))
        w.write(
            f"POST /v1/stores/{B1.path}/commit?version=1&epoch=1 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {B_WRITER}\r\nContent-Length: 100\r\n\r\n".encode()
        )
        await w.drain()
        await asyncio.sleep(0.3)
        try:
            # on n1 itself the a* reader sees nothing of b1 (the fix)
            status, act = await call(n1.address, "GET", "/v1/activity", token=A_READER)
            assert status == 200 and act["operations"] == []
            # through n0's ring scope: n1 was asked as a node
            status, ring = await call(n0.address, "GET", "/v1/activity?scope=ring", token=A_READER)
            assert status == 200, ring
            leaked = [
                op for n in ring["nodes"] for op in n["operations"] if "b1" in str(op.get("store"))
            ]
            assert leaked == [], f"a* reader sees b1's operations via scope=ring: {leaked}"
        finally:
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()
