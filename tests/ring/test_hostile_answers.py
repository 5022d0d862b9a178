"""No answer from a seed or a peer believed without proof, on real node processes.

With the cluster secret on, a node asks every peer to prove its answer (docs/security.md,
"Proven answers"): the node's transport refuses an answer, or a refusal that states a fact
(not found, stale epoch), that is not signed with the ring's secret for its request. A
process without the secret, posing as a seed or taking over a member's address, is then
not believed:

- a ``--join`` or ``--replace`` whose seed is such a process fails, saying so, instead of
  acting on its forged ring view or sighting;
- a coordinator commit and restore through a real node ignore a forged head served at the
  address of a member that stopped;
- the node's transport itself refuses a fake's 200 and 404 and takes a real node's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from client import AsyncRingClient, StoreId
from statestore.cli.local import NodeProcess
from statestore.core.errors import NotFound, UnprovenAnswer
from statestore.net.http import HttpTransport
from statestore.node.auth import Access
from statestore.wire.rows import decode_rows, encode_rows

SECRET = b"a ring secret of thirty-two bytes"
SID = StoreId("q1", 0, 1, "default")
ROWS = {f"k{i}".encode(): f"v{i}".encode() * 20 for i in range(200)}
BASE = ["--no-dht", "--gossip-interval", "0.2"]


class Impostor:
    """A process without the secret: ``answers`` maps a path to the (status, JSON body) it
    answers; anything else gets 200 ``{}``. It can bind a given port (a member's, once the
    member stopped)."""

    def __init__(self, answers: dict[str, tuple[int, Any]], port: int = 0) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.port = port
        self.address = ""
        self._runner: web.AppRunner | None = None

    async def _any(self, request: web.Request) -> web.Response:
        await request.read()
        self.asked.append(request.path)
        status, body = self.answers.get(request.path, (200, {}))
        return web.json_response(body, status=status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
        self.port = self._runner.addresses[0][1]
        self.address = f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "cluster.secret"
    path.write_bytes(SECRET)
    return str(path)


async def start(proc: NodeProcess, seeds: list[str]) -> NodeProcess:
    await asyncio.to_thread(proc.start, seeds)
    return proc


async def get_json(address: str, path: str) -> Any:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{address}{path}") as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def until_members(address: str, n: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        ring = await get_json(address, "/v1/ring")
        up = [m for m in ring["members"] if m["status"] == "up" and m["state"] == "normal"]
        if len(up) >= n:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"never {n} members up: {ring['members']}")
        await asyncio.sleep(0.1)


async def refused_start(proc: NodeProcess, seeds: list[str]) -> str:
    """Start ``proc`` expecting it to exit; its log's tail (an AssertionError if it runs)."""
    try:
        await start(proc, seeds)
    except RuntimeError as exc:
        return str(exc)
    await asyncio.to_thread(proc.stop)
    raise AssertionError("the node started: it believed its fake seed")


async def test_a_join_against_a_fake_seed_fails_saying_so(tmp_path: Path, secret_file: str) -> None:
    args = [*BASE, "--cluster-secret-file", secret_file]
    real = await start(NodeProcess(str(tmp_path / "real"), 0, args), [])
    try:
        view = await get_json(real.address, "/v1/ring")
    finally:
        await asyncio.to_thread(real.stop)
    view["members"][0]["next_vnodes"] = 64  # forged: a member moving tokens refuses joins
    fake = Impostor({"/v1/ring": (200, view)})
    await fake.start()
    try:
        joiner = NodeProcess(str(tmp_path / "joiner"), 0, [*args, "--join"])
        log = await refused_start(joiner, [fake.address])
        # the old code believed the forged view: "member ... is moving tokens"
        assert "moving tokens" not in log, log
        assert "no seed proved it is a node of this ring" in log, log
        assert fake.address in log
    finally:
        await fake.stop()


async def test_a_replace_against_a_fake_seed_fails_saying_so(
    tmp_path: Path, secret_file: str
) -> None:
    dead = "deadbeefdeadbeef"
    sighting = {"member": {"status": "down", "state": "normal", "incarnation": 4, "zone": ""}}
    fake = Impostor({"/v1/ring": (200, {}), "/v1/handover/items": (200, sighting)})
    await fake.start()
    try:
        args = [*BASE, "--cluster-secret-file", secret_file, "--replace", dead]
        # the old code took the forged sighting: it started as node deadbeef..., incarnation 5
        log = await refused_start(NodeProcess(str(tmp_path / "r"), 0, args), [fake.address])
        assert "no seed proved it is a node of this ring" in log, log
    finally:
        await fake.stop()


@pytest.fixture
async def ring_with_impostor(
    tmp_path: Path, secret_file: str
) -> AsyncIterator[tuple[NodeProcess, Impostor, dict[str, Any]]]:
    """Three real nodes (R=3, W=2) holding SID v1; then the third stops and an impostor
    takes its port while the others still count it up. Yields the first node, the impostor
    (its answers to set) and the real head JSON of SID."""
    args = [*BASE, "--down-after", "120", "--cluster-secret-file", secret_file]
    a = await start(NodeProcess(str(tmp_path / "a"), 0, args), [])
    b = await start(NodeProcess(str(tmp_path / "b"), 0, args), [a.address])
    c = await start(NodeProcess(str(tmp_path / "c"), 0, args), [a.address])
    fake: Impostor | None = None
    try:
        await until_members(a.address, 3)
        async with AsyncRingClient([a.address]) as ring:
            await ring.commit(SID, 1, ROWS, epoch=1)
        head = await get_json(c.address, f"/v1/stores/{SID.path}/head")
        await asyncio.to_thread(c.stop)
        fake = Impostor({}, port=c.port)
        await fake.start()
        yield a, fake, head
    finally:
        if fake is not None:
            await fake.stop()
        for p in (c, b, a):
            await asyncio.to_thread(p.stop)


async def test_a_coordinator_commit_ignores_an_impostors_forged_head(
    ring_with_impostor: tuple[NodeProcess, Impostor, dict[str, Any]],
) -> None:
    a, fake, head = ring_with_impostor
    # a head of a newer writer: believed, it fences this commit off (409 stale_epoch)
    fake.answers[f"/v1/stores/{SID.path}/head"] = (200, {**head, "epoch": 9})
    body = b"".join(encode_rows([(b"k0", b"new")]))
    url = f"http://{a.address}/v1/stores/{SID.path}/commit?version=2&epoch=1"
    async with aiohttp.ClientSession() as s:
        async with s.post(url, data=body) as r:
            answer = await r.text()
            assert r.status == 201, answer
    assert f"/v1/stores/{SID.path}/head" in fake.asked  # it was asked, and not believed
    # (asked of node a's own replica: the SDK has no secret, and would ask the impostor too)
    assert (await get_json(a.address, f"/v1/stores/{SID.path}/head"))["version"] == 2


async def test_a_coordinator_restore_ignores_an_impostors_forged_head(
    ring_with_impostor: tuple[NodeProcess, Impostor, dict[str, Any]],
) -> None:
    a, fake, head = ring_with_impostor
    # a head of a version nobody wrote: believed, the restore looks for v7 and fails
    fake.answers[f"/v1/stores/{SID.path}/head"] = (200, {**head, "version": 7})
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{a.address}/v1/stores/{SID.path}/state") as r:
            data = await r.read()
            assert r.status == 200, data[:300]
            assert r.headers["X-Statestore-Version"] == "1"
    assert decode_rows(data)[0] == ROWS
    assert f"/v1/stores/{SID.path}/head" in fake.asked


async def test_the_nodes_transport_believes_only_proven_answers(
    tmp_path: Path, secret_file: str
) -> None:
    """The one rule at the seam, for every call site: a node's transport (as node/daemon.py
    builds it) refuses a fake's 200 and 404 and takes a real node's."""
    args = [*BASE, "--cluster-secret-file", secret_file]
    real = await start(NodeProcess(str(tmp_path / "real"), 0, args), [])
    missing = {"error": {"code": "store_not_found", "message": "no such store"}}
    fake = Impostor({"/v1/stores/q1/0/9/default/head": (404, missing)})
    await fake.start()
    access = Access("asker0000000000", secret_file, None)
    transport = HttpTransport(auth=access.outbound, prove=access.check_answer)
    try:
        for path in ("/v1/ring", "/v1/load", "/v1/handover", "/v1/sync/digest"):
            with pytest.raises(UnprovenAnswer):  # to the node: a peer that did not answer
                await transport.request("GET", fake.address, path)
        with pytest.raises(UnprovenAnswer):
            await transport.request("GET", fake.address, "/v1/stores/q1/0/9/default/head")
        ring = (await transport.request("GET", real.address, "/v1/ring")).json()
        assert ring["self"] == real.id
        with pytest.raises(NotFound):  # a real node's "not found" is proven, and believed
            await transport.request("GET", real.address, "/v1/stores/q1/0/9/default/head")
        # /v1/health is open and only a hint (a seed's DHT port): never asked to be proven
        health = await transport.request("GET", fake.address, "/v1/health")
        assert json.loads(health.body) == {}
    finally:
        await transport.close()
        await fake.stop()
        await asyncio.to_thread(real.stop)
