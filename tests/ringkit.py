"""The test kit: the vocabulary every ring test speaks, in one place.

Test modules import from here (and from ``tests/certs.py``, ``tests/corekit.py``,
``tests/javakit.py``, ``tests/spark/runs.py``), never from another test module.

- **Rings**: :data:`FAST` (timers short enough for a test), :func:`config` (an in-process
  node's ``NodeConfig``: port 0, memory storage, no DHT), :func:`nodes` (in-process nodes on
  loopback port 0 that see each other), :class:`Restartable` (in-process nodes stopped and
  started again on their address and data), :func:`local_ring` (node processes, ``LocalRing``).
- **Waiting**: :func:`eventually`, the one wait-until of the suite.
- **HTTP**: :func:`post` (JSON over urllib, for process rings), :func:`call` (aiohttp, with
  a token, to an address or an in-process node), :func:`scrape` and :func:`value`
  (``GET /metrics``), :func:`state_of` and :func:`assert_refused` (what a hostile request
  must leave alone, and how it must be refused).
- **Workloads**: :func:`workload` (versions of one store, with the states expected),
  :func:`chunk_keys` / :func:`manifest_keys` / :func:`wait_copies` / :func:`assert_all_restore`,
  and the elastic ring's load (:class:`Writer` committing without pause, :class:`Copies`
  counting copies of sampled items, :func:`under_load`, :func:`stop_load`,
  :func:`check_restores`, :func:`wait_exact`, :func:`short_copies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from client import RingClient, StoreId
from statestore.cli.local import LocalRing, NodeProcess, http_json
from statestore.core.ids import chunk_key
from statestore.core.manifest import Manifest
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node
from statestore.wire.manifest import encode_manifest
from statestore.wire.rows import encode_rows

FAST = ["--gossip-interval", "0.2", "--suspect-after", "1", "--down-after", "2.5"]
SECRET = b"0123456789abcdef0123456789abcdef"  # a cluster secret (node identity)
R = 3  # the replication factor of the elastic ring's load
ARGS = [*FAST, "--retain", "1000"]  # node flags of the elastic ring's load
Ref = dict[bytes, bytes]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- rings -------------------------------------------------------------------------------
def peak_rss(pid: int) -> int:
    """A process's peak resident set (VmHWM), in bytes."""
    return rss_kib(pid, "VmHWM") * 1024


def rss_kib(pid: int, field: str) -> int:
    """A memory field of ``/proc/{pid}/status`` (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def config(tmp_path: Path, name: str, **kw: Any) -> NodeConfig:
    """An in-process node's configuration: port 0, memory storage, no DHT, gossip every
    0.1 s, R=W=2; ``kw`` overrides any of it."""
    base: dict[str, Any] = {
        "port": 0,
        "data_dir": str(tmp_path / name),
        "storage": "memory://",
        "dht": False,
        "gossip_interval": 0.1,
        "replicas": 2,
        "write_quorum": 2,
    }
    base.update(kw)
    return NodeConfig(**base)


@contextlib.asynccontextmanager
async def nodes(tmp_path: Path, n: int, **kw: Any) -> AsyncIterator[list[Node]]:
    """``n`` in-process nodes on loopback port 0 (:func:`config` with ``kw``), the others
    seeded with the first; yields once every node sees ``n`` live members, stops them in
    reverse order."""
    started = [await start_node(config(tmp_path, "n0", **kw))]
    try:
        first = started[0][0]
        for i in range(1, n):
            started.append(await start_node(config(tmp_path, f"n{i}", seeds=[first.address], **kw)))
        live = [node for node, _ in started]
        await eventually(
            lambda: all(len(node.view().live_addresses()) == n for node in live),
            f"{n} in-process nodes see each other",
        )
        yield live
    finally:
        for node, runner in reversed(started):
            await stop_node(node, runner)


def sees(node: Node, n: int) -> bool:
    """Whether ``node`` sees ``n`` live members (itself included)."""
    return len(node.view().live_addresses()) == n


class Restartable:
    """In-process nodes that keep their address and data across a stop (fixed loopback
    ports, LMDB data dirs; :func:`config` with ``kw``), started, stopped and started again
    by name; :meth:`close` stops those running. R=3, and timers short enough that a stop is
    seen within a second, repair runs every second and compaction five times a second, unless
    ``kw`` says otherwise."""

    def __init__(self, tmp_path: Path, names: str = "abc", **kw: Any) -> None:
        self.tmp_path = tmp_path
        self.kw = {
            "replicas": 3,
            "compact_interval": 0.2,
            "repair_interval": 1.0,
            "suspect_after": 0.5,
            "down_after": 1.0,
            **kw,
        }
        self.ports: dict[str, int] = {}
        for name in names:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.ports[name] = s.getsockname()[1]
        self.running: dict[str, tuple[Node, web.AppRunner]] = {}

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def __getitem__(self, name: str) -> Node:
        return self.running[name][0]

    def live(self) -> list[Node]:
        return [node for node, _ in self.running.values()]

    def leader(self, store: StoreId) -> str:
        """The running node first among ``store``'s replicas (its compaction leader)."""
        return next(
            k
            for k, (n, _) in self.running.items()
            if n.view().store_replicas(store)[0] == n.address
        )

    async def start(self, name: str, seed: str | None = None) -> Node:
        cfg = config(
            self.tmp_path,
            name,
            port=self.ports[name],
            storage=f"lmdb://{self.tmp_path}/{name}-db",
            seeds=[seed] if seed else [],
            **self.kw,
        )
        self.running[name] = await start_node(cfg)
        return self.running[name][0]

    async def start_all(self) -> None:
        """Every node, the others seeded with the first; once they all see each other."""
        names = list(self.ports)
        first = await self.start(names[0])
        for name in names[1:]:
            await self.start(name, first.address)
        await eventually(
            lambda: all(sees(n, len(names)) for n in self.live()), f"{len(names)} nodes"
        )

    async def stop(self, name: str) -> None:
        await stop_node(*self.running.pop(name))

    async def close(self) -> None:
        for name in list(self.running):
            await self.stop(name)


@contextlib.contextmanager
def local_ring(
    tmp_path: Path | str, n: int, args: list[str] | None = None, **kw: Any
) -> Iterator[LocalRing]:
    """``n`` node processes (``LocalRing`` on port 0, :data:`FAST` timers unless ``args``
    says otherwise; ``kw`` sets its other fields: ``tls_ca``, ``token``, ...), stopped on
    the way out, also when they never all came up."""
    ring = LocalRing(str(tmp_path), n, args=FAST if args is None else args, **kw)
    try:
        yield ring.start()
    finally:
        ring.stop()


# -- waiting -----------------------------------------------------------------------------
def eventually(
    check: Callable[[], object], what: str, limit: float = 30.0, every: float = 0.05
) -> Any:
    """Wait until ``check()`` is true, at most ``limit`` seconds, asking every ``every``
    seconds; raises ``AssertionError("never happened: <what>")`` after that.

    In a coroutine it returns an awaitable (``await eventually(...)``: it sleeps on the
    loop, and ``check`` may itself return an awaitable); anywhere else (a sync test, a
    thread) it blocks. One function, so that one timeout message and one polling rule hold
    for in-process nodes and node processes alike.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        deadline = time.monotonic() + limit
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"never happened: {what}") from None
            time.sleep(every)
        return None
    return _eventually(check, what, limit, every)


async def _eventually(check: Callable[[], object], what: str, limit: float, every: float) -> None:
    deadline = time.monotonic() + limit
    while True:
        done = check()
        if inspect.isawaitable(done):
            done = await done
        if done:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(every)


# -- HTTP --------------------------------------------------------------------------------
def post(address: str, path: str, body: object) -> object:
    """POST ``body`` as JSON (urllib, 5 s); the JSON answer. Raises on a non-2xx."""
    req = urllib.request.Request(
        f"http://{address}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


async def send_commit(node: Node, m: Manifest, chunks: list[Any], hint: str | None = None) -> None:
    """What a writer sends one replica: the chunks, then the manifest (or the hint)."""
    async with aiohttp.ClientSession() as s:
        for c in chunks:
            key = chunk_key(m.store, m.version, c.name)
            async with s.put(f"http://{node.address}/v1/chunks/{key}", data=c.data) as r:
                assert r.status in (200, 201), await r.text()
        if hint is None:
            url = f"http://{node.address}/v1/manifests/{m.store.path}/{m.version}/{m.kind}"
        else:
            url = (
                f"http://{node.address}/v1/hints/{m.store.path}/{m.version}/{m.kind}?holders={hint}"
            )
        headers = {"Content-Type": "application/msgpack"}
        async with s.put(url, data=encode_manifest(m), headers=headers) as r:
            assert r.status in (200, 201), await r.text()


def commit_row(seed: str, store: StoreId, version: int, query: str = "") -> int:
    """One row ``k<version>`` = ``v`` committed at ``version`` (epoch 1) through the node's
    ``POST .../commit``, ``query`` added to its query string; the status."""
    body = b"".join(encode_rows([(f"k{version}".encode(), b"v")]))
    url = f"http://{seed}/v1/stores/{store.path}/commit?version={version}&epoch=1{query}"
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def call(
    to: str | Node, method: str, path: str, token: str | None = None, **kw: Any
) -> tuple[int, dict[str, Any]]:
    """One request to an address or an in-process node (``kw`` as ``aiohttp``'s
    ``request``), with ``token`` as a bearer token; the status and the JSON answer (``{}``
    when the body is not a JSON object)."""
    address = to if isinstance(to, str) else to.address
    headers = dict(kw.pop("headers", {}))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"http://{address}{path}", headers=headers, **kw) as r:
            body = await r.read()
            return r.status, json.loads(body) if body.startswith(b"{") else {}


async def scrape(node: Node) -> Samples:
    """``GET /metrics`` of ``node``, parsed by ``prometheus_client``'s own parser."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.address}/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def state_of(node: Node) -> dict[str, Any]:
    """What a node holds and believes: compared before and after every attack."""
    assert node.membership is not None
    return {
        "chunks": sorted(node.store.chunk_keys()),
        "manifests": sorted((s.path, v, k) for s, v, k in node.store.manifest_keys()),
        "heads": {s.path: node.store.head(s) for s in node.store.stores()},
        "floors": {s.path: node.store.floor(s) for s in node.store.stores()},
        "epoch": node.epoch,
        "members": sorted((m.id, m.address, m.incarnation) for m in node.membership.members()),
    }


def assert_refused(status: int, body: dict[str, Any], code: str = "") -> None:
    """A 4xx whose error names the problem (and has ``code``, if given)."""
    assert 400 <= status < 500, (status, body)
    assert body["error"]["message"], body
    if code:
        assert body["error"]["code"] == code, body


# -- workloads ---------------------------------------------------------------------------
def workload(sid: StoreId, ring: RingClient, versions: int, seed: int) -> dict[int, Ref]:
    """Commit ``versions`` versions of mixed puts and deletes; return the expected states."""
    rng = random.Random(seed)
    state: Ref = {}
    expected: dict[int, Ref] = {}
    for v in range(1, versions + 1):
        puts = {
            f"key-{rng.randrange(3000):05d}".encode(): rng.randbytes(rng.randrange(1, 200))
            for _ in range(rng.randrange(50, 400))
        }
        dels = [k for k in rng.sample(sorted(state), min(len(state), 40)) if k not in puts]
        ring.commit(sid, v, puts, dels, {"offset": v * 1000}, epoch=1)
        state.update(puts)
        for k in dels:
            del state[k]
        expected[v] = dict(state)
    return expected


def chunk_keys(ring: RingClient, sid: StoreId, versions: list[int]) -> list[str]:
    """Every chunk key the retained versions need (from the manifests, via the client)."""
    from statestore.wire.manifest import decode_chain

    view = ring.ring()
    keys: set[str] = set()
    for address in view.store_replicas(sid):
        for v in versions:
            with urllib.request.urlopen(
                f"http://{address}/v1/stores/{sid.path}/chain?version={v}", timeout=5
            ) as resp:
                for m in decode_chain(resp.read()):
                    keys |= {f"{sid.path}/{m.version}/{c.name}" for c in m.chunks}
    return sorted(keys)


def manifest_keys(ring: RingClient, sid: StoreId, versions: list[int]) -> list[list[str]]:
    """Every manifest the versions' chains are made of, as ``[store path, version, kind]``."""
    from statestore.wire.manifest import decode_chain

    view = ring.ring()
    found: set[tuple[str, str, str]] = set()
    for address in view.store_replicas(sid):
        for v in versions:
            with urllib.request.urlopen(
                f"http://{address}/v1/stores/{sid.path}/chain?version={v}", timeout=5
            ) as resp:
                found |= {(sid.path, str(m.version), m.kind) for m in decode_chain(resp.read())}
    return [list(m) for m in sorted(found)]


def wait_copies(
    ring: LocalRing,
    keys: list[str],
    copies: int,
    timeout: float = 60,
    manifests: list[list[str]] | None = None,
) -> None:
    """Wait until every chunk key (and manifest, if given) has ``copies`` copies among the
    live nodes."""
    deadline = time.monotonic() + timeout
    wanted = manifests or []
    while True:
        counts = dict.fromkeys(keys, 0)
        held = [0] * len(wanted)
        for address in ring.seeds:
            answer = post(address, "/v1/sync/have", {"chunks": keys, "manifests": wanted})
            for k, has in zip(keys, answer["chunks"], strict=True):  # type: ignore[index]
                counts[k] += bool(has)
            for i, has in enumerate(answer["manifests"]):  # type: ignore[arg-type]
                held[i] += bool(has)
        short = [k for k, c in counts.items() if c < copies]
        short += ["/".join(m) for m, c in zip(wanted, held, strict=True) if c < copies]
        if not short:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(short)} chunks still have < {copies} copies: {short[:3]}")
        time.sleep(0.5)


def assert_all_restore(client: RingClient, sid: StoreId, expected: dict[int, Ref]) -> None:
    retained = client.versions(sid)
    assert retained[-1] == max(expected)
    for v in retained:
        st = client.restore(sid, v)
        assert dict(st) == expected[v], f"version {v} differs"
        assert st.positions == {"offset": v * 1000}


# -- the elastic ring's load: a writer and a copy counter while nodes move ----------------
def load(client: RingClient, stores: list[StoreId], versions: int, seed: int) -> dict[StoreId, Ref]:
    """Commit ``versions`` versions of every store; returns each store's state."""
    rng = random.Random(seed)
    states: dict[StoreId, Ref] = {s: {} for s in stores}
    for v in range(1, versions + 1):
        for sid in stores:
            puts = {f"k{rng.randrange(2000):05d}".encode(): rng.randbytes(120) for _ in range(150)}
            client.commit(sid, v, puts, [], {"offset": v}, epoch=1)
            states[sid].update(puts)
    return states


class Writer(threading.Thread):
    """Commits new versions of its stores until stopped; remembers every acknowledged state
    and every failure."""

    def __init__(self, seeds: list[str], states: dict[StoreId, Ref], first: int) -> None:
        super().__init__(daemon=True)
        self.seeds = seeds
        self.state = {s: dict(r) for s, r in states.items()}
        self.next = dict.fromkeys(states, first)
        self.acked: dict[tuple[StoreId, int], Ref] = {}
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        with RingClient(self.seeds, chunk_size=4096) as client:
            while not self.halt.is_set():
                for sid in self.state:
                    v = self.next[sid]
                    puts = {
                        f"w{rng.randrange(4000):05d}".encode(): rng.randbytes(80) for _ in range(60)
                    }
                    dels = [k for k in rng.sample(sorted(self.state[sid]), 5) if k not in puts]
                    try:
                        client.commit(sid, v, puts, dels, {"offset": v}, epoch=1)
                    except Exception as exc:  # every failure is a finding
                        self.failures.append(f"{sid} v{v}: {type(exc).__name__}: {exc}")
                        continue
                    self.state[sid].update(puts)
                    for k in dels:
                        self.state[sid].pop(k, None)
                    self.acked[(sid, v)] = dict(self.state[sid])
                    self.next[sid] = v + 1

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


class Copies(threading.Thread):
    """Counts, again and again, the copies of the sampled items on every node that answers;
    keeps the lowest count seen of each (a round in which a node did not answer is skipped)."""

    def __init__(self, ring: LocalRing, keys: list[str], manifests: list[list[str]]) -> None:
        super().__init__(daemon=True)
        self.ring = ring
        self.keys = keys
        self.manifests = manifests
        self.low: dict[str, int] = {}
        self.rounds = 0
        self.halt = threading.Event()

    def count(self, addresses: list[str]) -> dict[str, int] | None:
        counts = dict.fromkeys(self.keys + ["/".join(m) for m in self.manifests], 0)
        for address in addresses:
            try:
                answer = post(
                    address, "/v1/sync/have", {"chunks": self.keys, "manifests": self.manifests}
                )
            except (OSError, urllib.error.URLError, ValueError):
                return None
            assert isinstance(answer, dict)
            for k, has in zip(self.keys, answer["chunks"], strict=True):
                counts[k] += bool(has)
            for m, has in zip(self.manifests, answer["manifests"], strict=True):
                counts["/".join(m)] += bool(has)
        return counts

    def run(self) -> None:
        while not self.halt.is_set():
            counts = self.count([p.address for p in self.ring.procs if p.alive])
            if counts is not None:
                self.rounds += 1
                for item, n in counts.items():
                    self.low[item] = min(self.low.get(item, n), n)
            time.sleep(0.2)

    def stop(self) -> None:
        self.halt.set()
        self.join(30)

    def below(self, r: int) -> list[tuple[str, int]]:
        return sorted((i, n) for i, n in self.low.items() if n < r)


def sample(
    client: RingClient, stores: list[StoreId], versions: int
) -> tuple[list[str], list[list[str]]]:
    keys: list[str] = []
    manifests: list[list[str]] = []
    for sid in stores:
        keys += chunk_keys(client, sid, list(range(1, versions + 1)))
        manifests += manifest_keys(client, sid, list(range(1, versions + 1)))
    return keys, manifests


def check_restores(
    client: RingClient,
    writer: Writer,
    states: dict[StoreId, Ref],
    versions: int,
    per_store: int = 40,
) -> None:
    """Every store's loaded state and a spread of its acknowledged versions restore exactly.

    The spread is at most ``per_store`` versions of each store, evenly spaced over its
    acknowledged ones (the first and the last among them, so every phase of the run is
    sampled), not all of them: the writer commits without pause, so the count grows with
    the machine's speed and a restore's chain with it, and restoring every one (800 and
    more versions, chains of 100 deltas) took a loaded CI run past its test's time limit.
    """
    assert writer.acked, "the writer committed nothing"
    by_store: dict[StoreId, list[int]] = {}
    for sid, v in writer.acked:
        by_store.setdefault(sid, []).append(v)
    for sid, acked in sorted(by_store.items(), key=lambda kv: kv[0].path):
        for v in spread(sorted(acked), per_store):
            restored = client.restore(sid, v)
            assert dict(restored) == writer.acked[(sid, v)], f"{sid} v{v} differs"
            assert restored.positions == {"offset": v}
    for sid, state in states.items():
        assert dict(client.restore(sid, versions)) == state


def spread(items: list[int], most: int) -> list[int]:
    """At most ``most`` of ``items``, evenly spaced, the first and the last among them."""
    if len(items) <= most:
        return items
    step = (len(items) - 1) / (most - 1)
    return sorted({items[round(i * step)] for i in range(most)})


def under_load(
    ring: LocalRing, client: RingClient, stores: list[StoreId], seed: int, seeds: list[str]
) -> tuple[dict[StoreId, Ref], Writer, Copies]:
    """Load six versions of each store, then start the writer (through ``seeds``) and the
    copy counter (over every chunk and manifest of the loaded versions)."""
    states = load(client, stores, 6, seed=seed)
    keys, manifests = sample(client, stores, 6)
    writer = Writer(seeds, states, 7)
    copies = Copies(ring, keys, manifests)
    writer.start()
    copies.start()
    time.sleep(1.0)
    return states, writer, copies


def stop_load(writer: Writer, copies: Copies) -> None:
    """Stop both; no commit failed, no sampled item was seen below R copies."""
    writer.stop()
    copies.stop()
    assert not writer.failures, writer.failures[:5]
    assert copies.rounds > 3
    assert not copies.below(R), copies.below(R)[:5]


def wait_state(node: NodeProcess, state: str, timeout: float = 60.0) -> dict[str, object]:
    """Wait until ``node``'s hand-over state (``GET /v1/handover``) is ``state``."""
    deadline = time.monotonic() + timeout
    answer: object = None
    while time.monotonic() < deadline:
        answer = http_json(node.address, "/v1/handover")
        assert isinstance(answer, dict)
        if answer["state"] == state:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"node {node.id} did not become {state}: {answer}")


def wait_exact(copies: Copies, addresses: list[str], r: int, timeout: float = 40.0) -> None:
    """Old owners drop what they handed over: every sampled item settles at exactly ``r``."""
    deadline = time.monotonic() + timeout
    counts = None
    while time.monotonic() < deadline:
        counts = copies.count(addresses)
        if counts is not None and set(counts.values()) == {r}:
            return
        time.sleep(0.5)
    extra = {i: n for i, n in (counts or {}).items() if n != r}
    raise AssertionError(f"{len(extra)} items not at {r} copies: {list(extra.items())[:5]}")


def held_states(addresses: list[str], stores: list[StoreId]) -> str:
    """What each node holds of ``stores`` that decides which snapshots a chain names: head,
    floor, thinning line, snapshot manifests and snapshot chunks by version (for a failing
    assertion's message)."""
    lines = []
    for address in addresses:
        for sid in stores:
            try:
                d = http_json(address, f"/v1/inventory/{sid.path}")
            except (OSError, ValueError) as exc:
                lines.append(f"{address} {sid.path}: {exc!r}")
                continue
            assert isinstance(d, dict)
            snaps = sorted({m["version"] for m in d["manifests"] if m["kind"] == "snapshot"})
            chunks = sorted(
                {int(c.split("/")[-2]) for c in d["chunks"] if c.rsplit("/", 1)[-1][:1] == "s"}
            )
            lines.append(
                f"{address} {sid.path}: head {d['head']} floor {d['floor']} "
                f"thinning {d['thinning']} snapshots {snaps} snapshot chunks {chunks}"
            )
    return "\n".join(lines)


def short_copies(ring: LocalRing, client: RingClient, stores: list[StoreId], top: int) -> dict:
    """Items of versions 1..top with fewer than R copies on the live nodes, among those the
    replicas' chains still name once counted: a chain read before a thinning line moved
    names a snapshot that the line may drop, manifests and chunks alike, before the count
    (an item a chain names with its chunks gone is one a restore would miss: it stays)."""
    keys, manifests = sample(client, stores, top)
    counts = Copies(ring, keys, manifests).count(ring.seeds)
    assert counts is not None
    short = {i: n for i, n in counts.items() if n < R}
    if short:
        keys, manifests = sample(client, stores, top)
        named = set(keys) | {"/".join(m) for m in manifests}
        short = {i: n for i, n in short.items() if i in named}
    return short


def cli(args: list[str], timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``statestore ARGS`` in a process of its own; its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args], capture_output=True, text=True, timeout=timeout
    )
