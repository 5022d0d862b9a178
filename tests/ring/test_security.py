"""Node identity, client tokens, supervised loops and honest health, on real nodes on
loopback port 0 (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import AsyncRingClient, RingClient, StoreId
from statestore.core.errors import Forbidden, RateLimited, Unauthenticated
from statestore.core.identity import NONCE_HEADER, ReplayGuard, signed_headers
from statestore.node.api import build_app
from statestore.node.daemon import Node
from statestore.node.server import start_node, stop_node
from statestore.wire.rows import encode_puts
from tests.ringkit import SECRET, call, config, eventually

SID = StoreId("q1", 0, 1, "default")
ADMIN = "admin-token-0000000001"
WRITER = "q1-writer-token-00001"
READER = "etl-reader-token-0001"
LIMITED = "q1-limited-token-00001"
SLOW_BYTES = "q1-slow-bytes-token-01"
PARALLEL = "q1-parallel-token-0001"
TOKENS = {
    ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
    WRITER: {"queries": ["q1"], "rights": ["read", "write"]},
    READER: {"queries": ["etl-*"], "rights": ["read"]},
    LIMITED: {"queries": ["q1"], "rights": ["read", "write"], "requests_per_second": 0.1},
    SLOW_BYTES: {"queries": ["q1"], "rights": ["read", "write"], "bytes_per_second": 100},
    PARALLEL: {"queries": ["q1"], "rights": ["read"], "bytes_per_second": 1000, "max_in_flight": 2},
}


# -- node identity ----------------------------------------------------------------------
@pytest.fixture
async def signed_ring(tmp_path: Path) -> AsyncIterator[list[Node]]:
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    a, ra = await start_node(config(tmp_path, "a", cluster_secret_file=str(secret)))
    b, rb = await start_node(
        config(tmp_path, "b", cluster_secret_file=str(secret), seeds=[a.address])
    )
    try:
        await eventually(
            lambda: len(a.view().live_addresses()) == 2 and len(b.view().live_addresses()) == 2,
            "two nodes with the same secret form a ring",
        )
        yield [a, b]
    finally:
        await stop_node(b, rb)
        await stop_node(a, ra)


async def test_a_relay_between_signed_nodes_keeps_its_plan(signed_ring: list[Node]) -> None:
    """A line restore over the two nodes of a ring with the cluster secret: the root hop's
    signed request to its child carries the plan, and the child streams its chunks. The
    child once read the plan from a body the auth middleware had already read (empty), and
    failed: every relay between nodes of such a ring fell back to star."""
    a, b = signed_ring
    rows = {b"k%05d" % i: b"v" * 200 for i in range(5000)}
    async with AsyncRingClient([a.address], chunk_size=32 * 1024) as client:
        await client.commit(SID, 1, rows, [], {}, epoch=1)
        st = await client.restore(SID, plan="line")
    assert dict(st) == rows
    assert st.plan == "line" and not st.stats["failed_hops"], st.stats
    assert {h["hop"] for h in st.stats["hops"]} == {a.address, b.address}, st.stats


def gossip_body(ident: str, address: str) -> dict[str, Any]:
    return {
        "epoch": 1,
        "members": [
            {"id": ident, "address": address, "zone": "", "incarnation": 1, "heartbeat": 1}
        ],
    }


async def test_internal_requests_need_a_node_signature(signed_ring: list[Node]) -> None:
    a, _ = signed_ring
    members = sorted(m.id for m in a.membership.members())  # type: ignore[union-attr]
    body = json.dumps(gossip_body("evil", "10.1.2.3:7400")).encode()
    path = "/v1/gossip"
    cases: list[tuple[dict[str, str], str]] = [
        ({}, "X-Statestore-Signature"),
        (
            signed_headers(
                b"another secret of 32 bytes......",
                "POST",
                path,
                body,
                "x",
                time.time(),
                destination=a.address,
            ),
            "does not match",
        ),
        (
            signed_headers(
                SECRET, "POST", path, body, "x", time.time() - 3600, destination=a.address
            ),
            "stale",
        ),
        (
            signed_headers(
                SECRET, "POST", path, b"other body", "x", time.time(), destination=a.address
            ),
            "does not match",
        ),
        (
            signed_headers(
                SECRET, "POST", "/v1/sync/have", body, "x", time.time(), destination=a.address
            ),
            "does not match",
        ),
        (
            {
                k: v
                for k, v in signed_headers(
                    SECRET, "POST", path, body, "x", time.time(), destination=a.address
                ).items()
                if k != NONCE_HEADER
            },
            NONCE_HEADER,
        ),
    ]
    for headers, words in cases:
        headers["Content-Type"] = "application/json"
        status, answer = await call(a.address, "POST", path, data=body, headers=headers)
        assert status == 401, answer
        assert answer["error"]["code"] == "unauthenticated"
        assert words in answer["error"]["message"], answer
    for internal, payload in [
        ("/v1/sync/have", {"chunks": []}),
        ("/v1/stores/q1/0/1/default/gc", {"floor": 1}),
    ]:
        status, answer = await call(a.address, "POST", internal, json=payload)
        assert (status, answer["error"]["code"]) == (401, "unauthenticated"), internal
    assert sorted(m.id for m in a.membership.members()) == members  # type: ignore[union-attr]
    # the same gossip, signed with the ring's secret, is taken
    headers = signed_headers(SECRET, "POST", path, body, "x", time.time(), destination=a.address)
    headers["Content-Type"] = "application/json"
    status, _ = await call(a.address, "POST", "/v1/gossip", data=body, headers=headers)
    assert status == 200
    assert a.membership.get("evil") is not None  # type: ignore[union-attr]
    # ... once: the same signed request sent again (a replay) is refused
    status, answer = await call(a.address, "POST", "/v1/gossip", data=body, headers=headers)
    assert status == 401 and "replayed" in answer["error"]["message"], answer


def test_a_nonce_is_refused_again_for_the_whole_skew_window() -> None:
    guard = ReplayGuard()
    guard.check("n1", 1000.0)
    for later in (1000.0, 1059.0, 1119.0):
        with pytest.raises(Unauthenticated, match="replayed"):
            guard.check("n1", later)
    guard.check("n2", 1125.0)  # the first generation ends: n1 is kept one more window
    with pytest.raises(Unauthenticated, match="replayed"):
        guard.check("n1", 1200.0)
    guard.check("n1", 1250.0)  # two windows on: a timestamp that old is refused as stale


async def test_a_node_with_another_secret_is_never_believed(
    signed_ring: list[Node], tmp_path: Path
) -> None:
    a, _ = signed_ring
    other = tmp_path / "other.secret"
    other.write_bytes(b"a completely different secret!!!")
    c, rc = await start_node(
        config(tmp_path, "c", cluster_secret_file=str(other), seeds=[a.address])
    )
    try:
        # c pushes its table to a (refused) and a's answers are not believed by c: after
        # c has gossiped many rounds, neither knows the other
        await eventually(lambda: c.membership.members()[0].heartbeat > 20, "c gossips")  # type: ignore[union-attr]
        assert a.membership.get(c.id) is None  # type: ignore[union-attr]
        assert c.membership.get(a.id) is None  # type: ignore[union-attr]
    finally:
        await stop_node(c, rc)


# -- client tokens ----------------------------------------------------------------------
@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Node]:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    secret = tmp_path / "cluster.secret"  # tokens need one (node/config.py)
    secret.write_bytes(SECRET)
    node, runner = await start_node(
        config(
            tmp_path,
            "g",
            replicas=1,
            write_quorum=1,
            auth_file=str(tokens),
            cluster_secret_file=str(secret),
        )
    )
    yield node
    await stop_node(node, runner)


async def test_every_route_but_health_needs_a_token(guarded: Node) -> None:
    app = build_app(guarded)
    checked = 0
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter", "")
        if not path or route.method == "HEAD":
            continue
        concrete = (
            path.replace("{query}", "q1")
            .replace("{operator}", "0")
            .replace("{partition}", "1")
            .replace("{name}", "default")
            .replace("{version}", "1")
            .replace("{kind}", "delta")
            .replace("{key:.+}", "q1/0/1/default/1/d0-0000000000000000")
        )
        if path.startswith("/dashboard"):  # static files, no data (tests/ring/test_dashboard.py)
            continue
        status, body = await call(guarded.address, route.method, concrete, data=b"{}")
        if path == "/v1/health":
            assert status == 200
            continue
        if path.startswith("/v1/health/"):  # the probes, open as health: 200, or 503 not ready
            assert status in (200, 503) and "error" not in body, (path, status, body)
            continue
        assert status == 401, (route.method, path, status, body)
        assert body["error"]["code"] == "unauthenticated"
        # node-only routes (node/policy.py) ask for a node signature, the others for a token
        assert any(w in body["error"]["message"] for w in ("token", "ring nodes only"))
        checked += 1
    assert checked >= 15
    status, body = await call(guarded.address, "GET", "/v1/ring", token="not-a-token")
    assert status == 401 and "--auth-file" in body["error"]["message"]


async def test_tokens_are_scoped_to_queries_and_rights(guarded: Node) -> None:
    base = f"/v1/stores/{SID.path}"
    rows = encode_puts([b"k"], [b"v"])
    status, _ = await call(
        guarded.address, "POST", f"{base}/commit?version=1&epoch=1", WRITER, data=rows
    )
    assert status == 201
    cases = [
        (READER, "GET", f"{base}/head", "does not cover query 'q1'"),
        (READER, "POST", "/v1/stores/etl-1/0/1/default/commit?version=1&epoch=1", "'write'"),
        (WRITER, "POST", f"{base}/gc", "'admin'"),
        (WRITER, "GET", "/v1/stores/q2/0/1/default/head", "does not cover query 'q2'"),
    ]
    for token, method, path, words in cases:
        status, body = await call(guarded.address, method, path, token, json={"floor": 1})
        assert status == 403, (path, body)
        assert body["error"]["code"] == "forbidden" and words in body["error"]["message"], body
    status, body = await call(guarded.address, "GET", f"{base}/head", WRITER)
    assert (status, body) == (200, {"version": 1, "epoch": 1})
    status, body = await call(guarded.address, "GET", "/v1/stores", READER)
    assert (status, body) == (200, {"stores": []})  # q1 is not the reader's to see


async def test_changing_the_ring_needs_an_admin_token_for_every_query(
    guarded: Node, tmp_path: Path
) -> None:
    """Decommission and token moves change where every query's data lives: an admin token
    scoped to some queries is refused (403), and nothing moves."""
    scoped = "scratch-admin-token-0001"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(TOKENS | {scoped: {"queries": ["scratch*"], "rights": ["read", "admin"]}})
    )
    for path, body in (("/v1/handover/tokens", {"vnodes": 8}), ("/v1/handover/leave", {})):
        status, answer = await call(guarded.address, "POST", path, scoped, json=body)
        for _ in range(50):  # the tokens file is re-read when it changes
            if status != 401:
                break
            await asyncio.sleep(0.1)
            status, answer = await call(guarded.address, "POST", path, scoped, json=body)
        assert status == 403 and '"*"' in answer["error"]["message"], (path, answer)
        status, _ = await call(guarded.address, "POST", path, WRITER, json=body)
        assert status == 403
    assert guarded.move is None and guarded.vnodes == 0
    status, answer = await call(
        guarded.address, "POST", "/v1/handover/tokens", ADMIN, json={"vnodes": 8}
    )
    assert status == 202 and answer["move"]["vnodes_to"] == 8, answer


async def test_sdk_sends_the_token_from_the_argument_or_the_environment(
    guarded: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Unauthenticated):
        async with AsyncRingClient([guarded.address]) as ring:
            pass
    async with AsyncRingClient([guarded.address], token=READER) as ring:
        with pytest.raises(Forbidden):
            await ring.commit(SID, 1, {b"k": b"v"}, [], {}, epoch=1)
    monkeypatch.setenv("STATESTORE_TOKEN", WRITER)
    ring2 = await asyncio.to_thread(RingClient, [guarded.address])
    try:
        await asyncio.to_thread(ring2.commit, SID, 1, {b"k": b"v"}, [], {}, 1)
        restored = await asyncio.to_thread(ring2.restore, SID, 1)
        assert dict(restored) == {b"k": b"v"}
    finally:
        await asyncio.to_thread(ring2.close)


async def test_the_tokens_file_is_reloaded_when_it_changes(guarded: Node, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    status, _ = await call(guarded.address, "GET", "/v1/ring", WRITER)
    assert status == 200
    fresh = "a-fresh-token-000000001"
    tokens.write_text(json.dumps({fresh: {"queries": ["q1"], "rights": ["read"]}}))
    os.utime(tokens, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    status, body = await call(guarded.address, "GET", "/v1/ring", WRITER)
    assert status == 401, body
    status, _ = await call(guarded.address, "GET", "/v1/ring", fresh)
    assert status == 200
    tokens.write_text("{broken")  # a bad edit keeps the last good tokens, health says so
    os.utime(tokens, ns=(time.time_ns() + 2 * 10**9, time.time_ns() + 2 * 10**9))
    status, _ = await call(guarded.address, "GET", "/v1/ring", fresh)
    assert status == 200
    status, health = await call(guarded.address, "GET", "/v1/health")
    assert health["status"] == "degraded" and "auth-file" in " ".join(health["reasons"])


async def test_parallel_requests_do_not_get_a_token_past_its_byte_rate(guarded: Node) -> None:
    """Answers are charged after they are sent: without a cap on a limited token's requests
    in flight, 20 restores sent at once were all served on one burst's credit."""
    base = f"/v1/stores/{SID.path}"
    rows = encode_puts([b"k"], [os.urandom(200_000)])  # incompressible: a 200 kB answer
    status, _ = await call(
        guarded.address, "POST", f"{base}/commit?version=1&epoch=1", ADMIN, data=rows
    )
    assert status == 201
    answers = await asyncio.gather(
        *(call(guarded.address, "GET", f"{base}/state", PARALLEL) for _ in range(20))
    )
    served = [status for status, _ in answers if status == 200]
    refused = [body for status, body in answers if status == 429]
    assert len(served) + len(refused) == 20
    assert 1 <= len(served) <= 2, f"{len(served)} restores of 200 kB at 1 kB/s"
    assert any("in flight" in b["error"]["message"] for b in refused)


async def test_a_token_over_its_rate_is_refused_with_429_and_nothing_changes(
    guarded: Node,
) -> None:
    base = f"/v1/stores/{SID.path}"
    rows = encode_puts([b"k"], [b"v"])
    # 0.1 requests/s with a 2 s burst: one request, then the bucket is empty for 10 s
    status, _ = await call(guarded.address, "GET", "/v1/ring", LIMITED)
    assert status == 200
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"http://{guarded.address}{base}/commit?version=1&epoch=1",
            data=rows,
            headers={"Authorization": f"Bearer {LIMITED}"},
        ) as r:
            body = json.loads(await r.read())
            assert r.status == 429, body
            assert int(r.headers["Retry-After"]) >= 1
    assert body["error"]["code"] == "rate_limited"
    assert "requests/s" in body["error"]["message"]
    status, body = await call(guarded.address, "GET", f"{base}/head", ADMIN)
    assert status == 404, body  # the refused commit left nothing
    # other tokens keep their own rates
    status, _ = await call(guarded.address, "GET", "/v1/ring", WRITER)
    assert status == 200
    # bytes: a body larger than the burst goes through once, then the token is in debt
    big = encode_puts([b"k"], [b"v" * 5000])
    status, _ = await call(
        guarded.address, "POST", f"{base}/commit?version=1&epoch=1", SLOW_BYTES, data=big
    )
    assert status == 201
    status, body = await call(guarded.address, "GET", f"{base}/head", SLOW_BYTES)
    assert status == 429 and "bytes/s" in body["error"]["message"], body
    with pytest.raises(RateLimited, match="over its rate"):  # the SDK: the node's error, typed
        async with AsyncRingClient([guarded.address], token=LIMITED) as ring:
            await ring.head(SID)


# -- supervised loops and honest health -------------------------------------------------
async def test_a_failing_loop_is_restarted_and_health_says_so(tmp_path: Path) -> None:
    runs: list[int] = []

    async def flaky(node: Node) -> None:
        runs.append(1)
        raise RuntimeError("injected failure")

    node = Node(config(tmp_path, "f", replicas=1, write_quorum=1))
    await node.start(0, [("flaky", flaky)])
    try:
        assert node.health()["status"] == "ok" or runs
        await eventually(lambda: len(runs) >= 3, "the failed loop is started again")
        health = node.health()
        assert health["status"] == "degraded"
        assert any("flaky" in r and "injected failure" in r for r in health["reasons"])
    finally:
        await node.stop()


async def test_a_full_disk_makes_the_node_read_only_until_space_returns(solo: Node) -> None:
    base = f"/v1/stores/{SID.path}"
    rows = encode_puts([b"k"], [b"v"])
    status, health = await call(solo.address, "GET", "/v1/health")
    assert health["status"] == "ok"
    solo.config.min_free_bytes = 2**62  # more than any disk has: "nearly full"
    status, body = await call(solo.address, "POST", f"{base}/commit?version=1&epoch=1", data=rows)
    assert (status, body["error"]["code"]) == (507, "insufficient_storage")
    assert "read-only" in body["error"]["message"]
    status, health = await call(solo.address, "GET", "/v1/health")
    assert health["status"] == "degraded" and "disk nearly full" in " ".join(health["reasons"])
    assert solo.store.stores() == []
    solo.config.min_free_bytes = 0  # space returned
    status, _ = await call(solo.address, "POST", f"{base}/commit?version=1&epoch=1", data=rows)
    assert status == 201
    status, health = await call(solo.address, "GET", "/v1/health")
    assert health["status"] == "ok"


def test_node_identity_is_on_in_the_compose_file() -> None:
    import yaml

    compose = yaml.safe_load((Path(__file__).parents[2] / "docker/docker-compose.yml").read_text())
    for name in ("node1", "node2", "node3"):
        svc = compose["services"][name]
        cmd = svc["command"]
        secret = cmd[cmd.index("--cluster-secret-file") + 1]
        assert secret == "/run/statestore/cluster.secret"
        assert "cluster-secret:/run/statestore:ro" in svc["volumes"]
        assert "secret-init" in svc["depends_on"]
    init = compose["services"]["secret-init"]  # writes the secret once into the volume
    assert "cluster-secret:/secret" in init["volumes"]
