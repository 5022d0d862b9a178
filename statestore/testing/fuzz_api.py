"""Fuzzing every endpoint of a real node (docs/reliability.md, Fuzzing).

One node (the daemon's ``Node`` and its full application, ``node.api.build_app``, operator
endpoints included) with tokens on, served in this process without sockets (``net/inproc``
through the in-memory network), takes requests built from a valid template of each route and
then mutated: paths (segments replaced, escaped, lengthened, unicode digits), query strings,
headers (charsets, tokens, forged node signatures, positions), methods and bodies (the byte and
value mutations of :mod:`statestore.testing.mutate`, nesting and huge counts).

**What "nothing committed changed" means here.** Before the run the harness commits stores of
the queries ``prod`` and ``q1`` with a token the fuzzer never uses. The fuzzer holds a
``read`` token for every query, a ``read``/``write`` token and an ``admin`` token scoped to
``scratch*``, no token or a garbage one. So it may legitimately change ``scratch*`` stores
(write, gc, drop them) and the node's soft state (membership, metrics, caches), and nothing
else: every storage key of another query (chunks, manifests, heads, retention floors and
settings, tombstones) must keep its exact bytes, and every committed version must restore to
the same rows. Membership is reset after a request that changed it, so that one accepted
gossip does not turn every later request into an honest 503.

Checked per request: an answer (no exception escaping the application), no 5xx, within
``DEADLINE`` seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
from yarl import URL

from statestore.core.chunk import encode_chunks
from statestore.core.errors import RequestTimeout, StateStoreError
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.membership import Membership
from statestore.core.plan import ChunkTask, Hop
from statestore.net.inproc import Answer
from statestore.net.memory import MemoryNetwork, MemoryTransport
from statestore.net.transport import MAX_ANSWER_BYTES, Response, error_from_answer
from statestore.node.api import build_app
from statestore.node.backends import MemoryBackend
from statestore.node.config import NodeConfig
from statestore.node.daemon import Node
from statestore.testing.clock import InlineExecutor
from statestore.testing.mutate import Mutator, deep_json, huge_msgpack
from statestore.wire.frames import encode_hop
from statestore.wire.manifest import encode_manifest
from statestore.wire.rows import decode_rows, encode_rows

__all__ = ["DEADLINE", "ApiReport", "fuzz_endpoints"]

DEADLINE = 10.0
ADDRESS = "n0:7400"
CLIENT = "fuzzer:1"
OWNER = "owner-token-never-fuzzed"
TOKENS = {
    OWNER: {"queries": ["*"], "rights": ["read", "write", "admin"]},
    "fuzz-reader": {"queries": ["*"], "rights": ["read"]},
    "fuzz-scratch-rw": {"queries": ["scratch*"], "rights": ["read", "write"]},
    "fuzz-scratch-admin": {"queries": ["scratch*"], "rights": ["admin"]},
}
COMMITTED = (StoreId("prod", 0, 0, "default"), StoreId("q1", 1, 2, "agg"))
SCRATCH = (StoreId("scratch", 0, 0, "default"), StoreId("scratch-b", 3, 1, "x"))
VERSIONS = 4  # committed versions per store (v3 a snapshot)


@dataclass
class ApiReport:
    requests: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    by_route: dict[str, int] = field(default_factory=dict)
    unparsable: int = 0  # requests an HTTP parser would refuse before the application
    server_errors: list[str] = field(default_factory=list)  # first few 5xx, with the request
    five_xx: int = 0
    five_xx_codes: dict[str, int] = field(default_factory=dict)  # "503 unavailable" -> n
    internal: int = 0  # 500s: bugs
    five_xx_committed: int = 0  # 5xx on a path naming a committed store's query
    escaped: int = 0  # an exception out of the application (no answer)
    hangs: int = 0
    max_seconds: float = 0.0
    seconds: float = 0.0
    committed_changed: list[str] = field(default_factory=list)
    restores_checked: int = 0


class _SignedTransport(MemoryTransport):
    """The in-memory transport with the node's credentials on every request, as its HTTP
    transport sends them (a node with tokens on calls itself as a signed node)."""

    def __init__(
        self, network: MemoryNetwork, source: str, auth: Callable[[str, str, str, bytes], Any]
    ) -> None:
        super().__init__(network, source, timeout=5.0)
        self.auth = auth

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        ok: tuple[int, ...] = (200, 201),
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> Response:
        hdrs = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        hdrs.update(self.auth(method, address, path, body or b""))
        return await super().request(
            method,
            address,
            path,
            body=body,
            headers=hdrs,
            timeout=timeout,
            ok=ok,
            max_bytes=max_bytes,
        )

    async def open_stream(
        self, address: str, path: str, body: bytes, *, timeout: float | None = None
    ) -> Answer:
        limit = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                signed = self.auth("POST", address, path, body)
                answer = await self.network.send(
                    self.source, address, "POST", path, body, signed, stream=True
                )
                status, _ = answer.status.result()
                if status != 200:
                    raise error_from_answer(status, await answer.read_all(), address)
        except TimeoutError as exc:
            raise RequestTimeout(f"POST {address}{path} took longer than {limit:.1f}s") from exc
        return answer


def _rows(rng: random.Random, n: int) -> dict[bytes, bytes]:
    return {
        f"k{rng.randrange(10**6)}".encode(): rng.randbytes(rng.randrange(0, 40)) for _ in range(n)
    }


class _Harness:
    def __init__(self, root: str, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.network = MemoryNetwork(random.Random(seed))
        self.node: Node
        self.expected: dict[tuple[str, int], dict[bytes, bytes]] = {}

    async def start(self) -> None:
        auth = os.path.join(self.root, "tokens.json")
        with open(auth, "w") as f:  # noqa: ASYNC230 - before the node exists, once
            json.dump(TOKENS, f)
        secret = os.path.join(self.root, "cluster.secret")  # tokens need one (node/config.py)
        with open(secret, "wb") as f:  # noqa: ASYNC230 - before the node exists, once
            f.write(b"fuzz-cluster-secret-0123456789abcdef")
        config = NodeConfig(
            data_dir=os.path.join(self.root, "node"),
            storage="memory://",
            replicas=1,
            write_quorum=1,
            vnodes=16,
            dht=False,
            advertise=ADDRESS,
            auth_file=auth,
            cluster_secret_file=secret,
            max_body=1 << 20,
            max_chunk=1 << 20,
            max_commit=4 << 20,
            body_timeout=5.0,
            min_free_bytes=0,
        )
        loop = asyncio.get_running_loop()
        self.node = Node(
            config,
            clock=loop.time,
            rng=random.Random(1),
            transport=self.network.transport(ADDRESS, timeout=5.0),
            backend=MemoryBackend(),
            writer=InlineExecutor(),
        )
        self.node.transport = _SignedTransport(self.network, ADDRESS, self.node.access.outbound)
        self.network.attach(ADDRESS, build_app(self.node), config.max_body)
        await self.node.start(7400, ())
        assert self.node.membership is not None
        self.membership = self.node.membership
        for stores, token in ((COMMITTED, OWNER), (SCRATCH, "fuzz-scratch-rw")):
            for store in stores:
                for v in range(1, VERSIONS + 1):
                    rows = _rows(self.rng, 30)
                    body = b"".join(encode_rows(rows.items()))
                    path = f"/v1/stores/{store.path}/commit?version={v}&epoch=1" + (
                        "&snapshot=1" if v == 3 else ""
                    )
                    status, _, answer = await self.call("POST", path, body, _auth(token))
                    if status != 201:
                        raise AssertionError(f"seeding {path}: {status} {answer[:200]!r}")
        for store in COMMITTED:
            for v in range(1, VERSIONS + 1):
                self.expected[(store.path, v)] = await self.restore(store, v)

    async def stop(self) -> None:
        await self.network.detach(ADDRESS)
        await self.node.stop()

    async def call(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        async with asyncio.timeout(DEADLINE):
            answer = await self.network.send(
                CLIENT, ADDRESS, method, path, body, headers, stream=False
            )
            data = await answer.read_all()
        status, hdrs = answer.status.result()
        return status, dict(hdrs), data

    async def restore(self, store: StoreId, version: int) -> dict[bytes, bytes]:
        """The rows of ``version`` (a restore streams them in no promised order)."""
        status, _, data = await self.call(
            "GET", f"/v1/stores/{store.path}/state?version={version}", b"", _auth(OWNER)
        )
        if status != 200:
            raise AssertionError(f"restore of {store} v{version}: {status} {data[:200]!r}")
        return decode_rows(data)[0]

    def fingerprint(self) -> dict[bytes, str]:
        """Every storage key of a query the fuzzer may not write, with its value's digest."""
        out = {}
        for k, v in self.node.store.backend.scan(b""):
            query = k[2:].split(b"/", 1)[0]
            if not query.startswith(b"scratch"):
                out[k] = hashlib.sha256(v).hexdigest()
        return out

    def reset_membership(self) -> None:
        node = self.node
        if node.membership is not self.membership or len(self.membership.members()) > 1:
            node.membership = self.membership = Membership(
                node.id, node.address, node.config.zone, node.incarnation, node.clock()
            )


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- requests ----------------------------------------------------------------------------
@dataclass
class Request:
    route: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    body_obj: Any = None  # the JSON or msgpack value of the body, for value mutations
    body_kind: str = ""  # json | msgpack | bytes

    def target(self) -> str:
        if not self.query:
            return self.path
        return self.path + "?" + "&".join(f"{k}={v}" for k, v in self.query.items())


def _store(rng: random.Random) -> StoreId:
    return rng.choice((*COMMITTED, *SCRATCH, *SCRATCH, StoreId("other", 0, 0, "default")))


def _chunk(rng: random.Random, store: StoreId, version: int) -> tuple[str, bytes]:
    c = encode_chunks(_rows(rng, rng.randrange(0, 6)), [], groups=128)[0]
    return chunk_key(store, version, c.name), c.data


def _template(rng: random.Random, h: _Harness) -> Request:
    store = _store(rng)
    v = rng.randrange(1, VERSIONS + 2)
    sp = f"/v1/stores/{store.path}"
    keys = h.node.store.chunk_keys()
    some_key = rng.choice(keys) if keys else "prod/0/0/default/1/d0-0000000000000000"
    route = rng.choice(
        (
            "health", "ring", "gossip", "have", "digest", "put-chunk", "get-chunk", "chunks",
            "put-manifest", "get-manifest", "stores", "heads", "chains", "head", "versions",
            "chain", "gc", "commit", "state", "relay", "metrics", "dashboard", "activity",
            "inventory", "store-inventory", "point-read", "drop", "purge", "query", "tombstones",
            "put-hint", "get-hint", "outcomes", "post-outcomes", "load", "tokens", "copies",
            "read-copies", "live", "ready", "remove", "remove-sweep", "removals", "handover",
            "leave", "items", "room", "post-room", "hints", "lookup", "lookups",
        )
    )  # fmt: skip
    j = "json"
    r: Request
    if route == "health":
        r = Request(route, "GET", "/v1/health", {}, {}, b"")
    elif route in ("live", "ready"):  # the probes (open, like health)
        r = Request(route, "GET", f"/v1/health/{route}", {}, {}, b"")
    elif route == "ring":
        r = Request(route, "GET", "/v1/ring", {}, {}, b"")
    elif route == "lookups":  # a lookup channel asked without a WebSocket upgrade
        r = Request(route, "GET", "/v1/lookups", {}, {}, b"")
    elif route == "gossip":
        obj = h.node.membership.digest() if h.node.membership else {}
        obj["members"].append(
            {"id": "x1", "address": "x1:7400", "zone": "", "incarnation": 1, "heartbeat": 3}
        )
        r = Request(route, "POST", "/v1/gossip", {}, {}, b"", obj, j)
    elif route == "have":
        obj = {"chunks": [some_key], "manifests": [[store.path, v, "delta"]]}
        r = Request(route, "POST", "/v1/sync/have", {}, {}, b"", obj, j)
    elif route == "digest":
        lo = rng.getrandbits(63)
        obj = {"seed": rng.getrandbits(64), "ranges": [[lo, lo + 10**15, 1, "ff"]]}
        r = Request(route, "POST", "/v1/sync/digest", {}, {}, b"", obj, j)
    elif route == "put-chunk":
        key, data = _chunk(rng, store, v)
        r = Request(route, "PUT", f"/v1/chunks/{key}", {}, {}, data, None, "bytes")
    elif route == "get-chunk":
        r = Request(route, "GET", f"/v1/chunks/{some_key}", {}, {}, b"")
    elif route == "chunks":
        r = Request(route, "POST", "/v1/chunks", {}, {}, b"", {"keys": keys[:5]}, j)
    elif route == "put-manifest":
        c = encode_chunks(_rows(rng, 3), [], groups=128)[0]
        kind = rng.choice(("delta", "snapshot"))
        m = Manifest(store, v, kind, rng.choice((0, 1, 2)), 128, (ChunkRef.of(c),), {"p": 1})
        obj = msgpack.unpackb(encode_manifest(m))
        path = f"/v1/manifests/{store.path}/{v}/{kind}"
        q = {"retain": "3"} if rng.random() < 0.2 else {}
        r = Request(route, "PUT", path, q, {}, b"", obj, "msgpack")
    elif route == "put-hint":
        key, data = _chunk(rng, store, v)
        c = encode_chunks(_rows(rng, 3), [], groups=128)[0]
        m = Manifest(store, v, "delta", rng.choice((0, 1, 2)), 128, (ChunkRef.of(c),), {"p": 1})
        obj = msgpack.unpackb(encode_manifest(m))
        q = {"holders": rng.choice((ADDRESS, f"{ADDRESS},n1:7400", "x", ""))}
        path = f"/v1/hints/{store.path}/{v}/delta"
        r = Request(route, "PUT", path, q, {}, b"", obj, "msgpack")
    elif route == "copies":  # manifests of any stores, scratch or committed, in one batch
        c = encode_chunks(_rows(rng, 3), [], groups=128)[0]
        batch = [
            encode_manifest(
                Manifest(
                    _store(rng), v, rng.choice(("delta", "snapshot")), rng.choice((0, 1, 2)),
                    128, (ChunkRef.of(c),), {"p": 1},
                )
            )
            for _ in range(rng.randrange(1, 4))
        ]  # fmt: skip
        q = {"handoff": "1"} if rng.random() < 0.3 else {}  # charged to quotas (hand-offs)
        r = Request(route, "POST", "/v1/sync/manifests", q, {}, b"", batch, "msgpack")
    elif route == "read-copies":
        obj = {"manifests": [[store.path, v, "delta", rng.choice((0, 1, 2))]]}
        r = Request(route, "POST", "/v1/sync/manifests/read", {}, {}, b"", obj, j)
    elif route == "get-hint":
        q = {"epoch": str(rng.choice((0, 1, 2)))}
        r = Request(route, "GET", f"/v1/hints/{store.path}/{v}/delta", q, {}, b"")
    elif route == "outcomes":
        r = Request(route, "GET", f"{sp}/outcomes", {}, {}, b"")
    elif route == "post-outcomes":
        verdict = rng.choice(("confirmed", "rolled_back"))
        o = {"store": store.path, "version": v, "epoch": 1, "outcome": verdict}
        if verdict == "rolled_back":
            o |= {"replay_from": v - 1, "positions": {"k": v}}
        r = Request(route, "POST", f"{sp}/outcomes", {}, {}, b"", {"outcomes": [o]}, j)
    elif route == "get-manifest":
        path = f"/v1/manifests/{store.path}/{v}/{rng.choice(('delta', 'snapshot'))}"
        r = Request(route, "GET", path, {}, {}, b"")
    elif route == "stores":
        r = Request(route, "GET", "/v1/stores", {}, {}, b"")
    elif route == "heads":
        obj = {"stores": [s.path for s in (*COMMITTED, *SCRATCH)]}
        r = Request(route, "POST", "/v1/heads", {}, {}, b"", obj, j)
    elif route == "chains":
        obj = {"stores": [[s.path, v] for s in (*COMMITTED, *SCRATCH)]}
        r = Request(route, "POST", "/v1/chains", {}, {}, b"", obj, j)
    elif route in ("head", "versions"):
        r = Request(route, "GET", f"{sp}/{route}", {}, {}, b"")
    elif route == "chain":
        r = Request(route, "GET", f"{sp}/chain", {"version": str(v)}, {}, b"")
    elif route == "gc":
        r = Request(route, "POST", f"{sp}/gc", {}, {}, b"", {"floor": rng.choice((1, 3, v))}, j)
    elif route == "commit":
        rows = _rows(rng, rng.randrange(0, 20))
        body = b"".join(encode_rows([*rows.items(), (b"gone", None)]))
        q = {"version": str(v + VERSIONS), "epoch": str(rng.choice((1, 2)))}
        if rng.random() < 0.3:
            q["snapshot"] = "1"
        hdrs = {"X-Statestore-Positions": json.dumps({"kafka": {"t": {"0": v}}})}
        r = Request(route, "POST", f"{sp}/commit", q, hdrs, body, None, "bytes")
    elif route == "state":
        q = {"version": str(v), "plan": rng.choice(("auto", "star", "line", "tree"))}
        r = Request(route, "GET", f"{sp}/state", q, {}, b"")
    elif route == "relay":
        task = ChunkTask(some_key, 0, 1, some_key.rsplit("/", 1)[-1], 1, 10, 20, 2, ())
        kids = (Hop(rng.choice((ADDRESS, "n1:7400", "127.0.0.1:7400")), (task,)),)
        hop = Hop(ADDRESS, (task,), kids if rng.random() < 0.5 else ())
        obj = msgpack.unpackb(encode_hop(store, hop, rng.random() < 0.5, 0, 128))
        # the plan's store named in the URL (authorized before the body), or another's
        named = rng.choice((None, store.path, _store(rng).path, "q\n/0/0/s"))
        q = {} if named is None else {"store": named}
        r = Request(route, "POST", "/v1/relay", q, {}, b"", obj, "msgpack")
    elif route == "metrics":
        r = Request(route, "GET", "/metrics", {}, {}, b"")
    elif route == "dashboard":
        name = rng.choice(("", "/dashboard.js", "/dashboard.css", "/x", "/../api.py"))
        r = Request(route, "GET", "/dashboard" + name, {}, {}, b"")
    elif route == "activity":
        r = Request(route, "GET", "/v1/activity", {}, {}, b"")
    elif route == "load":
        r = Request(route, "GET", "/v1/load", {}, {}, b"")
    elif route == "tokens":  # the count it owns: no move, unless a mutation makes one
        obj = {"vnodes": h.node.vnodes or h.node.config.vnodes}
        r = Request(route, "POST", "/v1/handover/tokens", {}, {}, b"", obj, j)
    elif route in ("remove", "remove-sweep"):  # statestore removenode: no such member, or us
        obj = {"node": rng.choice(("nobody", h.node.id, "a" * 64))}
        path = "/v1/handover/remove" + ("/sweep" if route == "remove-sweep" else "")
        r = Request(route, "POST", path, {}, {}, b"", obj, j)
    elif route == "removals":
        r = Request(route, "GET", "/v1/handover/remove", {}, {}, b"")
    elif route == "inventory":
        r = Request(route, "GET", "/v1/inventory", {"scope": rng.choice(("node", "ring"))}, {}, b"")
    elif route == "store-inventory":
        r = Request(route, "GET", f"/v1/inventory/{store.path}", {}, {}, b"")
    elif route == "point-read":
        q = {"key": rng.randbytes(4).hex(), "version": str(v)}
        r = Request(route, "GET", f"{sp}/key", q, {}, b"")
    elif route == "lookup":  # a part named like a held chunk, if any; mutated from there
        name = some_key.rsplit("/", 1)[-1]
        part = [v, name, 0, 127, rng.randrange(2, 5000), rng.randrange(1, 100), rng.getrandbits(64)]
        obj = {"groups": 128, "keys": [rng.randbytes(4).hex()], "parts": [part]}
        r = Request(route, "POST", f"{sp}/lookup", {}, {}, b"", obj, j)
    elif route in ("drop", "purge"):
        obj = {"id": "fuzz", "at": 1.0, "phase": rng.choice(("purge", "seal"))}
        r = Request(route, "POST", f"/v1/queries/{store.query}/{route}", {}, {}, b"", obj, j)
    elif route == "query":
        r = Request(route, "GET", f"/v1/queries/{store.query}", {}, {}, b"")
    elif route == "handover":  # the move in progress, if any
        r = Request(route, "GET", "/v1/handover", {}, {}, b"")
    elif route == "leave":  # statestore decommission: ring admin only, never a fuzzer's token
        r = Request(route, "POST", "/v1/handover/leave", {}, {}, b"")
    elif route == "items":  # a joining node's page of items (node only)
        obj = {"node": rng.choice(("x1", h.node.id)), "limit": rng.choice((0, 5)), "after": ""}
        r = Request(route, "POST", "/v1/handover/items", {}, {}, b"", obj, j)
    elif route == "room":  # would a commit of this many bytes fit the query's quota?
        q = {"bytes": str(rng.choice((0, 100, 1 << 30)))}
        r = Request(route, "GET", f"/v1/queries/{store.query}/room", q, {}, b"")
    elif route == "post-room":
        obj = {"chunks": [[some_key, 100]], "bytes": rng.choice((0, 100, 1 << 30))}
        r = Request(route, "POST", f"/v1/queries/{store.query}/room", {}, {}, b"", obj, j)
    elif route == "hints":  # a store's hints (tentative commits)
        r = Request(route, "GET", f"/v1/hints/{store.path}", {}, {}, b"")
    else:
        r = Request(route, "GET", "/v1/tombstones", {}, {}, b"")
    if r.body_kind == "json":
        r.body = json.dumps(r.body_obj).encode()
        r.headers.setdefault("Content-Type", "application/json")
    elif r.body_kind == "msgpack":
        r.body = msgpack.packb(r.body_obj, use_bin_type=True)
    token = rng.choices(
        ("fuzz-scratch-rw", "fuzz-scratch-admin", "fuzz-reader", "", "nope", "basic"),
        (40, 15, 30, 5, 5, 5),
    )[0]
    if token == "basic":
        r.headers["Authorization"] = "Basic Zm9vOmJhcg=="
    elif token:
        r.headers["Authorization"] = f"Bearer {token}"
    return r


_SEGMENTS = (
    "", ".", "..", "%2F", "%2e%2e", "²", "٣", "-1", "0", "00000000000000000001", str(2**31),
    str(2**62 + 1), str(2**63), str(2**64), "1e3", " 1", "a" * 300, "scratch", "prod", "q1",
    "d0-0000000000000000", "s0-ffffffffffffffff", "%00", "é", "default", "*", "scratch*",
)  # fmt: skip
_QUERY_VALUES = (
    "", "-1", "0", "1", "²", "1.5", str(2**62), str(2**63), str(2**64), "true", "%ff", "a" * 500,
    "tree", "line", "zz", "00",
)  # fmt: skip
_HEADERS = (
    ("Content-Type", "application/json; charset=utf-99"),
    ("Content-Type", "text/plain; charset=latin-1"),
    ("Content-Type", "application/msgpack"),
    ("X-Statestore-Positions", "[1, 2]"),
    ("X-Statestore-Positions", "{" * 40),
    ("X-Statestore-Positions", '{"a": NaN}'),
    ("X-Statestore-Positions", "\udcff"),
    ("X-Statestore-Signature", "00" * 32),
    ("X-Statestore-Node", "n0"),
    ("X-Statestore-Timestamp", "99999999999999999999"),
    ("Authorization", "Bearer "),
    ("Authorization", "Bearer " + "x" * 5000),
    ("Authorization", "bearer fuzz-reader"),
    ("Authorization", "Bearer fuzz-scratch-rw extra"),
    ("Host", "evil:1"),
    ("Content-Encoding", "gzip"),
    ("Accept", "*/*"),
)


def _mutate(rng: random.Random, r: Request) -> Request:
    mut = Mutator(rng)
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(7)
        if op == 0:  # a path segment replaced
            parts = r.path.split("/")
            i = rng.randrange(1, len(parts))
            parts[i] = rng.choice(_SEGMENTS)
            r.path = "/".join(parts)
        elif op == 1:  # a path segment added or removed
            parts = r.path.split("/")
            if rng.random() < 0.5 and len(parts) > 2:
                del parts[rng.randrange(1, len(parts))]
            else:
                parts.insert(rng.randrange(1, len(parts) + 1), rng.choice(_SEGMENTS))
            r.path = "/".join(parts)
        elif op == 2:  # a query parameter
            name = rng.choice((*r.query, "version", "epoch", "retain", "plan", "key", "scope"))
            r.query[name] = rng.choice(_QUERY_VALUES)
        elif op == 3:  # a header
            name, value = rng.choice(_HEADERS)
            r.headers[name] = value
        elif op == 4:  # the method
            r.method = rng.choice(("GET", "PUT", "POST", "DELETE", "HEAD", "PATCH"))
        elif op == 5 and r.body_obj is not None:  # the body's value
            obj = mut.mutate_value(r.body_obj, keep_types=rng.random() < 0.5)
            try:
                if r.body_kind == "json":
                    r.body = json.dumps(obj).encode()
                else:
                    r.body = msgpack.packb(obj, use_bin_type=True)
            except (TypeError, ValueError, OverflowError, UnicodeError):
                pass
        else:  # the body's bytes, or a body of another shape
            roll = rng.random()
            if roll < 0.1:
                r.body = deep_json(rng.choice((100, 5000, 100_000)), rng)
            elif roll < 0.15:
                r.body = huge_msgpack(rng)
            elif roll < 0.2:
                r.body = rng.randbytes(rng.randrange(0, 64))
            else:
                r.body = mut.mutate_bytes(r.body, text=r.body_kind == "json")
    return r


def _parsable(r: Request) -> bool:
    """Whether an HTTP server would hand this request to the application at all."""
    text = r.target()
    if not text.startswith("/") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in text):
        return False
    for k, v in r.headers.items():
        if any(ord(c) < 0x20 or ord(c) > 0xFF for c in v) or not k.isascii():
            return False
    try:
        text.encode("utf-8")
        URL(text)
    except (ValueError, UnicodeError):
        return False
    return True


# -- the run -----------------------------------------------------------------------------
async def fuzz_endpoints(
    root: str, seed: int, count: int, progress: Any = None, keep: int = 20
) -> ApiReport:
    """Send ``count`` mutated requests to one node under ``root`` (a fresh directory)."""
    report = ApiReport()
    logging.getLogger("statestore").setLevel(logging.CRITICAL)
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    h = _Harness(root, seed)
    await h.start()
    try:
        before = h.fingerprint()
        for i in range(count):
            rng = random.Random(f"{seed}/api/{i}")
            r = _template(rng, h)
            if rng.random() < 0.9:
                r = _mutate(rng, r)
            report.requests += 1
            report.by_route[r.route] = report.by_route.get(r.route, 0) + 1
            if not _parsable(r):
                report.unparsable += 1
                continue
            began = time.perf_counter()
            try:
                status, _, data = await h.call(r.method, r.target(), r.body, r.headers)
            except TimeoutError:
                report.hangs += 1
                _keep(report.server_errors, keep, f"hang (request {i}) {r.method} {r.target()}")
                continue
            except StateStoreError as exc:  # the application raised past its middlewares
                report.escaped += 1
                _keep(report.server_errors, keep, f"escaped {exc} (request {i}) {r.method}")
                continue
            finally:
                took = time.perf_counter() - began
                report.seconds += took
                report.max_seconds = max(report.max_seconds, took)
                h.reset_membership()
            report.by_status[status] = report.by_status.get(status, 0) + 1
            if status >= 500:
                report.five_xx += 1
                code = _code(data)
                report.five_xx_codes[f"{status} {code}"] = (
                    report.five_xx_codes.get(f"{status} {code}", 0) + 1
                )
                report.internal += status == 500
                if status != 503:  # the others are listed by code
                    _keep(report.server_errors, keep, f"{status} (request {i}) {r.method} ...")
                parts = r.path.split("/")  # /v1/{area}/{query}/...
                report.five_xx_committed += len(parts) > 3 and parts[3] in {
                    s.query for s in COMMITTED
                }
                _keep(
                    report.server_errors,
                    keep,
                    f"{status} (request {i}, seed {seed}) {r.method} {r.target()[:200]} "
                    f"headers {r.headers} body {r.body[:80]!r}: {data[:300]!r}",
                )
            if progress is not None:
                progress(1)
        after = h.fingerprint()
        for k in sorted(set(before) | set(after)):
            if before.get(k) != after.get(k):
                report.committed_changed.append(
                    f"{k.decode(errors='replace')}: {before.get(k)} -> {after.get(k)}"
                )
        for (path, v), rows in h.expected.items():
            got = await h.restore(StoreId.parse(path), v)
            report.restores_checked += 1
            if got != rows:
                report.committed_changed.append(f"restore of {path} v{v} returns other rows")
    finally:
        await h.stop()
    return report


def _code(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


def _keep(out: list[str], keep: int, line: str) -> None:
    if len(out) < keep:
        out.append(line)
