"""Access policy against a hostile client or process, on real
nodes on loopback port 0 (docs/security.md, Trust model):

- 7: tokens need the cluster secret, even on the first node of a ring, so a process that
  announces itself in the DHT and answers gossip never becomes a member, and a client's token
  never reaches it.
- 8: with the secret, every node-only route and request (``?copy=1``, manifest copies,
  hand-over listings, outcomes, purges, gossip, anti-entropy) wants a node signature, with
  or without a tokens file; a ring node's signed copy still lands.
- 9: an admin token scoped to some queries lists no items through ``/v1/handover/items``.
- The one route table (node/policy.py) names every route the router registers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp import web

from client import AsyncRingClient, StoreId
from statestore.cli.main import main as cli_main
from statestore.core.chunk import encode_chunks
from statestore.core.errors import StateStoreError
from statestore.core.ids import chunk_key
from statestore.core.manifest import ChunkRef, Manifest
from statestore.node.api import build_app
from statestore.node.daemon import Node
from statestore.node.discovery import DIRECTORY_KEY, SIGNED_DIRECTORY_KEY, Discovery, sign_entry
from statestore.node.policy import ROUTES, route_key, routes_table
from statestore.node.server import start_node, stop_node
from statestore.wire.manifest import encode_copies, encode_manifest
from statestore.wire.rows import encode_puts
from tests.ringkit import SECRET, call, config, eventually, nodes

ADMIN = "ring-admin-token-000001"  # admin on every query
A_ADMIN = "a-star-admin-token-0001"  # admin on a* only
B_WRITER = "b1-writer-token-000001"
TOKENS = {
    ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
    A_ADMIN: {"queries": ["a*"], "rights": ["read", "write", "admin"]},
    B_WRITER: {"queries": ["b1"], "rights": ["read", "write"]},
}
B1 = StoreId("b1", 0, 1, "default")


def _files(tmp_path: Path, tokens: bool, secret: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if tokens:
        path = tmp_path / "tokens.json"
        path.write_text(json.dumps(TOKENS))
        kw["auth_file"] = str(path)
    if secret:
        path = tmp_path / "cluster.secret"
        path.write_bytes(SECRET)
        kw["cluster_secret_file"] = str(path)
    return kw


async def _node(tmp_path: Path, name: str, tokens: bool, secret: bool, **kw: Any) -> Any:
    kw = {"replicas": 2, "write_quorum": 1} | _files(tmp_path, tokens, secret) | kw
    return await start_node(config(tmp_path, name, **kw))


@pytest.fixture
async def secret_only(tmp_path: Path) -> AsyncIterator[Node]:
    """The compose default: a cluster secret, no tokens file."""
    node, runner = await _node(tmp_path, "s", tokens=False, secret=True)
    yield node
    await stop_node(node, runner)


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Node]:
    """A cluster secret and a tokens file."""
    node, runner = await _node(tmp_path, "t", tokens=True, secret=True)
    yield node
    await stop_node(node, runner)


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[Node]:
    """Another node holding the same secret (its own one-node ring): it signs its calls."""
    node, runner = await _node(tmp_path, "p", tokens=False, secret=True)
    yield node
    await stop_node(node, runner)


def _manifest(store: StoreId, version: int) -> Manifest:
    refs = (ChunkRef(f"d0-{version:016x}", 0, 9, 10, 10, 1, version),)
    return Manifest(store, version, "delta", 1, 128, refs, {})


def _concrete(template: str) -> str:
    return (
        template.replace("{query}", "b1")
        .replace("{operator}", "0")
        .replace("{partition}", "1")
        .replace("{name}", "default")
        .replace("{version}", "1")
        .replace("{kind}", "delta")
        .replace("{key}", "b1/0/1/default/1/d0-0000000000000000")
    )


def _holdings(node: Node) -> tuple[list[Any], list[str], list[Any]]:
    return (
        sorted(map(str, node.store.manifest_items())),
        sorted(node.store.chunk_keys()),
        [o for s in node.store.stores() for o in node.store.outcomes(s)],
    )


# -- the one table ------------------------------------------------------------------------
async def test_every_registered_route_has_a_policy(secret_only: Node) -> None:
    """Walks the real app's router: no route without an entry in node/policy.ROUTES, and no
    entry for a route that does not exist (HEAD goes with GET)."""
    app = build_app(secret_only)
    registered = set()
    for route in app.router.routes():
        key = route_key(route)
        assert key is not None, route
        registered.add(key)
    missing = registered - set(ROUTES)
    assert not missing, f"routes without a policy in node/policy.py: {sorted(missing)}"
    stale = set(ROUTES) - registered
    assert not stale, f"policies of routes the router does not register: {sorted(stale)}"
    assert len(registered) >= 45


def _node_only_requests() -> list[tuple[str, str]]:
    out = []
    for (method, template), p in sorted(ROUTES.items()):
        if p.kind == "node":
            out.append((method, _concrete(template)))
        for name in p.node_if:
            out.append((method, _concrete(template) + f"?{name}=1"))
    return out


async def test_with_the_secret_node_only_routes_want_a_signature_whatever_the_tokens(
    secret_only: Node, secured: Node
) -> None:
    """Finding 8, from the table: every node-only route and request answers 401 to a caller
    without a node signature, on a node without a tokens file and, with the ring admin's
    token, on a node with one; nothing is written."""
    cases = _node_only_requests()
    assert len(cases) >= 15
    for node, token in ((secret_only, None), (secured, ADMIN)):
        before = _holdings(node)
        for method, path in cases:
            status, body = await call(node.address, method, path, token, data=b"{}")
            assert status == 401, (node.address, method, path, status, body)
            assert body["error"]["code"] == "unauthenticated"
            assert "ring nodes only" in body["error"]["message"], body
        assert _holdings(node) == before


# -- finding 8 ----------------------------------------------------------------------------
async def test_copies_need_a_node_signature_without_a_tokens_file(
    secret_only: Node, peer: Node
) -> None:
    """Finding 8: with the cluster secret and no tokens file (the compose default) anyone
    could store ``?copy=1`` chunks and manifests past fencing and quotas, push and read
    manifest copies, list hand-over items and record tentative verdicts. Now 401 and nothing
    stored; the same requests signed by a ring node (``peer``) land."""
    node = secret_only
    (c,) = encode_chunks({b"k": b"v" * 100}, [])
    key = chunk_key(B1, 1, c.name)
    m = _manifest(B1, 1)
    raw = encode_manifest(m)
    mpath = f"/v1/manifests/{B1.path}/1/delta"
    copies = encode_copies([encode_manifest(_manifest(B1, 2))])
    read = json.dumps({"manifests": [[B1.path, 1, "delta", 1]]}).encode()
    outcome = {"outcomes": [{"version": 1, "kind": "delta", "epoch": 1, "verdict": "confirmed"}]}
    attacks: list[tuple[str, str, bytes]] = [
        ("PUT", f"/v1/chunks/{key}?copy=1", c.data),
        ("PUT", f"/v1/chunks/{key}?compaction=1", c.data),
        ("PUT", f"{mpath}?copy=1", raw),
        ("POST", "/v1/sync/manifests", copies),
        ("POST", "/v1/sync/manifests/read", read),
        ("POST", "/v1/handover/items", b'{"node": "joiner", "limit": 100}'),
        ("POST", f"/v1/stores/{B1.path}/outcomes", json.dumps(outcome).encode()),
        ("GET", f"/v1/chunks/{key}?copy=1", b""),
    ]
    before = _holdings(node)
    for method, path, data in attacks:
        status, body = await call(node.address, method, path, data=data)
        assert status == 401, (method, path, status, body)
        assert body["error"]["code"] == "unauthenticated", body
    assert _holdings(node) == before == ([], [], [])

    # a client's own (charged, fenced) writes are still open on this ring
    status, body = await call(node.address, "PUT", f"/v1/chunks/{key}", data=c.data)
    assert status == 201, body

    # a ring node's signed copies land
    t = peer.transport
    assert (await t.request("PUT", node.address, f"{mpath}?copy=1", body=raw)).status == 201
    answer = await t.request("POST", node.address, "/v1/sync/manifests", body=copies)
    assert answer.json() == {"stored": [True]}
    answer = await t.request("POST", node.address, "/v1/sync/manifests/read", body=read)
    assert msgpack.unpackb(answer.body) == [raw]


# -- finding 9 ----------------------------------------------------------------------------
async def test_a_scoped_admin_token_lists_no_other_querys_items(secured: Node, peer: Node) -> None:
    """Finding 9: an admin token scoped to ``a*`` listed query b1's chunks and manifests
    through ``POST /v1/handover/items``. The route is for ring nodes only: 401 for every
    token, the ring admin's included; a ring node still gets the listing."""
    async with AsyncRingClient([secured.address], token=B_WRITER) as ring:
        await ring.commit(B1, 1, {b"k": b"v"}, [], {}, epoch=1)
    ask = {"node": "joiner-0001", "limit": 1000}
    for token in (A_ADMIN, ADMIN, None):
        status, body = await call(secured.address, "POST", "/v1/handover/items", token, json=ask)
        assert status == 401, (token, status, body)
        assert "items" not in body and "b1/" not in json.dumps(body)
    # a secret-holding node (a joining one, here the peer) is answered
    answer = await peer.transport.request(
        "POST", secured.address, "/v1/handover/items", json_body=ask
    )
    items = answer.json()["items"]
    assert any(i.startswith(f"m:{B1.path}/1/") for i in items), items


# -- finding 7 ----------------------------------------------------------------------------
def test_tokens_need_the_cluster_secret_even_on_the_first_node(tmp_path: Path) -> None:
    """Finding 7: ``--auth-file`` without ``--cluster-secret-file`` was refused only with
    ``--seeds``; the first node of a ring took it. Now every node refuses to start, naming
    the fix."""
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    with pytest.raises(ValueError, match="--cluster-secret-file"):
        config(tmp_path, "x", auth_file=str(tmp_path / "tokens.json"))
    args = ["node", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")]
    assert cli_main([*args, "--auth-file", str(tmp_path / "tokens.json")]) == 2
    assert not (tmp_path / "d").exists()


class Impostor:
    """A process that is no ring node: it answers gossip with a table naming itself (a
    newer heartbeat each time) and records every request, and whether it carried a token."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []
        self.heartbeat = 0
        self.address = ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.requests.append((request.method, request.path, auth))
        if request.path == "/v1/gossip":
            pushed = json.loads(await request.read())
            self.heartbeat += 1
            me = {"id": "ba5eba11", "address": self.address, "incarnation": 1, "zone": ""}
            members = [*pushed.get("members", []), me | {"heartbeat": self.heartbeat}]
            return web.json_response({"epoch": pushed.get("epoch", 0), "members": members})
        await request.read()
        return web.json_response({"stored": request.path.rsplit("/", 1)[-1]}, status=201)

    def tokens_seen(self) -> list[tuple[str, str, str]]:
        return [r for r in self.requests if r[2]]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.mark.parametrize("secret", [False, True], ids=["tokens-alone", "tokens-and-secret"])
async def test_an_impostor_in_the_dht_never_gets_a_clients_token(
    tmp_path: Path, secret: bool
) -> None:
    """Finding 7, as the attack: an impostor writes itself into the node's DHT directory and
    answers the gossip the node then pushes to it with a table naming itself. A node with a
    tokens file either refuses to start (no secret) or never takes the impostor as a member
    (push-only gossip: it becomes one only by a signed push); a client's commit and restore
    then send it nothing, and the ring view lists the node alone. On a node with tokens alone
    (which started before) the impostor became a member and took the client's token. With
    the secret the directory is signed: the impostor's entry, even written into the signed
    directory beside a signed one, is never read, so the node does not even push its table
    to it (the build before did)."""
    impostor = Impostor()
    await impostor.start()
    kw = {"replicas": 2, "write_quorum": 1, "dht": True} | _files(tmp_path, True, secret)
    try:
        try:
            cfg = config(tmp_path, "n", **kw)
        except ValueError as exc:
            assert not secret and "--cluster-secret-file" in str(exc)
            return
        node, runner = await start_node(cfg)
        dht = Discovery("ba5eba11", "127.0.0.1", impostor.address, timeout=5.0)
        try:
            _, health = await call(node.address, "GET", "/v1/health")
            await dht.listen(0)
            await dht.bootstrap([("127.0.0.1", int(health["dht_port"]))])
            await dht.announce()  # the impostor's entry in the ring's DHT directory
            # ... and in the signed one, forged, beside an entry signed with the secret
            assert node.access.secret is not None
            friend, at = "127.0.0.1:9", int(time.time())
            forged = {
                "ba5eba11": [impostor.address, at, "0" * 32],
                "f00d": [friend, at, sign_entry(node.access.secret, "f00d", friend, at)],
            }
            await dht.server.set(SIGNED_DIRECTORY_KEY, json.dumps(forged))
            # the node reads the directory (every 5 s): the signed entry, not the forged one
            await eventually(lambda: friend in node._directory, "the node read the directory")
            assert impostor.address not in node._directory
            await asyncio.sleep(5 * node.config.gossip_interval)  # a few more rounds
            assert not any(p == "/v1/gossip" for _, p, _ in impostor.requests)
            async with AsyncRingClient([node.address], token=ADMIN) as ring:
                try:
                    await ring.commit(B1, 1, {b"k": b"v"}, [], {}, epoch=1)
                    await ring.restore(B1, 1)
                except StateStoreError:
                    pass  # the token was sent or not: that is what is checked
                view = await ring.refresh()
            assert impostor.tokens_seen() == [], impostor.tokens_seen()
            assert [m.id for m in view.members] == [node.id]
            assert node.membership is not None and node.membership.get("ba5eba11") is None
        finally:
            dht.stop()
            await stop_node(node, runner)
    finally:
        await impostor.stop()


async def test_nodes_with_a_secret_find_each_other_in_the_signed_dht_directory(
    tmp_path: Path,
) -> None:
    """Three in-process nodes with the cluster secret, the DHT on: each signs its own entry
    of the signed directory and reads the others' (node/discovery.py), so every node's
    directory names the other two; the unsigned directory stays empty."""
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    kw = {"dht": True, "cluster_secret_file": str(secret)}
    async with nodes(tmp_path, 3, **kw) as ns:
        others = {n.id: {m.address for m in ns if m is not n} for n in ns}
        seen: dict[str, set[str]] = {n.id: set() for n in ns}

        def named() -> bool:  # the value is merged by each in turn: some rounds lose one
            for n in ns:
                seen[n.id] |= set(n._directory)
            return all(seen[i] == others[i] for i in seen)

        await eventually(named, "each node's directory named the other two", limit=60)
        assert ns[0].discovery is not None
        assert await ns[0].discovery.server.get(DIRECTORY_KEY) is None


async def test_the_coordinator_endpoints_still_work_with_tokens_and_secret(
    secured: Node,
) -> None:
    """The ordinary paths on a secured node: a token's commit, read and ring view."""
    base = f"/v1/stores/{B1.path}"
    rows = encode_puts([b"k"], [b"v"])
    status, body = await call(
        secured.address, "POST", f"{base}/commit?version=1&epoch=1", B_WRITER, data=rows
    )
    assert status == 201, body
    status, body = await call(secured.address, "GET", f"{base}/head", B_WRITER)
    assert status == 200 and body["version"] == 1
    status, body = await call(secured.address, "GET", f"{base}/head", A_ADMIN)
    assert status == 403 and "does not cover query 'b1'" in body["error"]["message"]
    status, _ = await call(secured.address, "GET", "/v1/ring", A_ADMIN)
    assert status == 200


def test_the_docs_route_table_is_the_policy_table() -> None:
    """docs/security.md's table of credentials is :data:`ROUTES`, row for row."""
    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    start = text.index("<!-- routes:")
    start = text.index("\n", start) + 1
    end = text.index("<!-- /routes -->", start)
    assert text[start:end] == routes_table(), (
        "docs/security.md's route table is stale: paste routes_table() between its markers"
    )
