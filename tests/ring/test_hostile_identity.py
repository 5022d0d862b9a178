"""Node identity under attack (docs/security.md, Node identity), on real node processes.

- A fake seed's unsigned ``GET /v1/tombstones`` answer purges nothing: with the cluster
  secret on, a node believes a peer's answer only when it is signed for its request.
- A signed request captured on its way to one node is refused by every other node: the
  signature names its destination.
- Stalled uploads with forged signature headers cost the node no body memory: the signature
  is checked on the headers before any body is read (RSS measured in /proc).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from client import AsyncRingClient, StoreId
from statestore.cli.local import NodeProcess
from statestore.core.identity import signed_headers
from tests.ringkit import eventually, peak_rss

SECRET = b"a ring secret of thirty-two bytes"
SID = StoreId("q1", 0, 1, "default")
ROWS = {f"k{i}".encode(): f"v{i}".encode() * 20 for i in range(200)}
BASE = ["--no-dht", "--replicas", "1", "--write-quorum", "1", "--gossip-interval", "0.2"]


class FakeSeed:
    """A process on the network that holds no secret: it answers every request 200 and
    ``GET /v1/tombstones`` with a sealed tombstone of ``q1``, and records what nodes send."""

    def __init__(self) -> None:
        self.tombstone_asks = 0
        self.gossip: list[tuple[dict[str, str], bytes]] = []
        self.address = ""
        self._runner: web.AppRunner | None = None

    async def _tombstones(self, request: web.Request) -> web.Response:
        self.tombstone_asks += 1
        forged = {"query": SID.query, "id": "forged", "at": time.time(), "state": "sealed"}
        return web.json_response({"tombstones": [forged]})

    async def _any(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/v1/gossip":
            self.gossip.append((dict(request.headers), body))
        return web.json_response({})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/tombstones", self._tombstones)
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def fake_seed() -> AsyncIterator[FakeSeed]:
    seed = FakeSeed()
    await seed.start()
    yield seed
    await seed.stop()


@pytest.fixture
def secret_args(tmp_path: Path) -> list[str]:
    path = tmp_path / "cluster.secret"
    path.write_bytes(SECRET)
    return [*BASE, "--cluster-secret-file", str(path)]


async def start(proc: NodeProcess, seeds: list[str]) -> NodeProcess:
    await asyncio.to_thread(proc.start, seeds)
    return proc


async def holdings(address: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{address}/v1/queries/{SID.query}") as r:
            assert r.status == 200, await r.text()
            body: dict[str, Any] = await r.json()
            return body


async def commit(address: str) -> None:
    async with AsyncRingClient([address]) as ring:
        await ring.commit(SID, 1, ROWS, epoch=1)


async def test_a_fake_seeds_unsigned_tombstones_purge_nothing(
    tmp_path: Path, secret_args: list[str], fake_seed: FakeSeed
) -> None:
    node = await start(NodeProcess(str(tmp_path / "a"), 0, secret_args), [])
    try:
        await commit(node.address)
        held = (await holdings(node.address))["held"]
        assert sum(held.values()) > 0
        await asyncio.to_thread(node.stop)
        # restarted with a seed that is not a node of the ring: its first exchange of
        # tombstones, then a second one (so the first answer was taken in full)
        await start(node, [fake_seed.address])
        await eventually(lambda: fake_seed.tombstone_asks >= 2, "the node asked its seed twice", 60)
        after = await holdings(node.address)
        assert after["tombstone"] is None, after
        assert after["held"] == held
        async with AsyncRingClient([node.address]) as ring:
            assert dict((await ring.restore(SID, 1)).items()) == ROWS
    finally:
        await asyncio.to_thread(node.stop)


async def post(address: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{address}{path}", data=body, headers=headers) as r:
            return r.status, json.loads(await r.read() or b"{}")


async def test_a_signed_request_is_refused_by_every_node_but_its_destination(
    tmp_path: Path, secret_args: list[str], fake_seed: FakeSeed
) -> None:
    # a: a node whose seed is an eavesdropper; b: another node of a ring with the same secret
    a = await start(NodeProcess(str(tmp_path / "a"), 0, secret_args), [fake_seed.address])
    b = await start(NodeProcess(str(tmp_path / "b"), 0, secret_args), [])
    try:
        await eventually(lambda: bool(fake_seed.gossip), "node a pushed its table to its seed", 60)
        captured, body = fake_seed.gossip[0]
        keep = {k: v for k, v in captured.items() if k.lower().startswith("x-statestore-")}
        keep["Content-Type"] = "application/json"
        status, answer = await post(b.address, "/v1/gossip", keep, body)
        assert status == 401, answer
        assert "not for this node" in answer["error"]["message"]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{b.address}/v1/ring") as r:
                members = {m["id"] for m in (await r.json())["members"]}
        assert a.id not in members

        # a purge signed for a (as a's drop would send it) deletes at a, and nowhere else
        await commit(a.address)
        await commit(b.address)
        path = f"/v1/queries/{SID.query}/purge"
        purge = json.dumps({"id": secrets.token_hex(8), "at": time.time(), "phase": "purge"})
        headers = signed_headers(
            SECRET, "POST", path, purge.encode(), a.id, time.time(), destination=a.address
        )
        headers["Content-Type"] = "application/json"
        status, answer = await post(a.address, path, headers, purge.encode())
        assert status == 200, answer
        status, answer = await post(b.address, path, headers, purge.encode())
        assert status == 401 and "not for this node" in answer["error"]["message"], answer
        assert sum((await holdings(b.address))["held"].values()) > 0
        assert sum((await holdings(a.address))["held"].values()) == 0
    finally:
        await asyncio.to_thread(b.stop)
        await asyncio.to_thread(a.stop)


UPLOADS = 8
DECLARED = 60 << 20  # under --max-body (64 MiB)
SENT = 24 << 20  # what each upload sends before it stalls


def stalled_upload(address: str, out: list[socket.socket]) -> None:
    """Send a chunk upload with forged signature headers, SENT bytes of its body, and stall
    (the socket stays open). A node that refuses at once may reset the connection."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10.0)
    out.append(sock)
    forged = {
        "X-Statestore-Node": "intruder",
        "X-Statestore-Timestamp": str(int(time.time())),
        "X-Statestore-Nonce": secrets.token_hex(16),
        "X-Statestore-Destination": address,
        "X-Statestore-Body-SHA256": "0" * 64,
        "X-Statestore-Signature": secrets.token_hex(32),
    }
    head = f"PUT /v1/chunks/{SID.path}/1/d0-{secrets.token_hex(8)} HTTP/1.1\r\n"
    head += f"Host: {address}\r\nContent-Length: {DECLARED}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in forged.items()) + "\r\n"
    piece = os.urandom(1 << 20)
    try:
        sock.sendall(head.encode())
        for _ in range(SENT >> 20):
            sock.sendall(piece)
    except OSError:
        pass  # refused and closed (or the buffers are full): the node took no more


def answer_status(sock: socket.socket) -> int | None:
    try:
        line = sock.recv(64).split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) >= 2 else None
    except OSError:
        return None


async def test_stalled_uploads_with_forged_signatures_cost_no_body_memory(
    tmp_path: Path, secret_args: list[str]
) -> None:
    node = await start(NodeProcess(str(tmp_path / "a"), 0, secret_args), [])
    sockets: list[socket.socket] = []
    try:
        assert node.proc is not None
        await commit(node.address)  # warm: the node has served a write
        before = peak_rss(node.proc.pid)
        threads = [
            threading.Thread(target=stalled_upload, args=(node.address, sockets))
            for _ in range(UPLOADS)
        ]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        await asyncio.sleep(1.0)  # let the node take in whatever it will
        grew = peak_rss(node.proc.pid) - before
        print(f"peak RSS {before / 2**20:.0f} MiB, +{grew / 2**20:.1f} MiB under {UPLOADS} uploads")
        assert grew < 64 << 20, f"{UPLOADS} stalled uploads took {grew / 2**20:.0f} MiB"
        statuses = [answer_status(s) for s in sockets]
        assert all(s in (401, None) for s in statuses), statuses
        # the node still serves
        assert sum((await holdings(node.address))["held"].values()) > 0
    finally:
        for s in sockets:
            s.close()
        await asyncio.to_thread(node.stop)
