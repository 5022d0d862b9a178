"""Per-query storage quotas: the pure rules and accounting (core/quota) from tables, the
store's counters against a full recount, and a real 4-node ring (separate processes) with a
quotas file: refusal through the SDK, nothing left behind, reload, gc and drop freeing usage,
repair still re-replicating a query over its quota, and malformed files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from client import QuotaExceeded, RingClient, StoreId
from statestore.cli.local import LocalRing, http_json
from statestore.core.chunk import encode_chunks
from statestore.core.errors import QuotaExceeded as CoreQuotaExceeded
from statestore.core.ids import chunk_key
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.quota import (
    COUNTED_PREFIXES,
    Quotas,
    Rule,
    Usage,
    charges,
    check,
    parse_quotas,
)
from statestore.core.view import RingView
from statestore.node.backends import MemoryBackend
from statestore.node.replica import NodeStore
from statestore.wire.rows import encode_rows
from tests.ringkit import FAST, eventually, local_ring

CLI = [sys.executable, "-m", "statestore"]
NO_DHT = ["--no-dht", "--quota-file"]

# -- the pure part, from tables ----------------------------------------------------------

RULES = Quotas((Rule("*", 1000), Rule("etl-*", 500), Rule("etl-big*", 5000), Rule("etl-bigone", 7)))


@pytest.mark.parametrize(
    "query, limit",
    [
        ("q1", 1000),  # only "*"
        ("etl-a", 500),  # a prefix beats "*"
        ("etl-bigger", 5000),  # the longer prefix wins
        ("etl-bigone", 7),  # an exact name beats every prefix
        ("etl", 1000),  # "etl-*" needs the dash
    ],
)
def test_the_most_specific_rule_wins(query: str, limit: int) -> None:
    assert RULES.limit(query) == limit
    assert Quotas((Rule("q1", 3),)).limit("q2") is None  # no rule: no quota


@pytest.mark.parametrize(
    "usage, delta, limit, refused",
    [
        (0, 100, None, False),  # no quota
        (0, 100, 100, False),  # exactly at the limit
        (0, 101, 100, True),
        (90, 11, 100, True),
        (500, 0, 100, False),  # the same chunk again adds nothing: passes over quota
        (500, -50, 100, False),  # a write that frees bytes always passes
        (0, 1, 0, True),  # max_bytes 0: no new data
    ],
)
def test_check(usage: int, delta: int, limit: int | None, refused: bool) -> None:
    if refused:
        with pytest.raises(CoreQuotaExceeded, match=rf"query 'q' holds {usage} bytes .* {limit}"):
            check("q", usage, delta, limit)
    else:
        check("q", usage, delta, limit)


@pytest.mark.parametrize(
    "old, puts, deletes, want",
    [
        ({b"c:q/0/0/n/1/x": None}, {b"c:q/0/0/n/1/x": 10}, [], {"q": 10}),  # new chunk
        ({b"c:q/0/0/n/1/x": 10}, {b"c:q/0/0/n/1/x": 10}, [], {}),  # the same again
        ({b"c:q/0/0/n/1/x": 10}, {}, [b"c:q/0/0/n/1/x"], {"q": -10}),  # deleted
        ({b"c:q/0/0/n/1/x": None}, {}, [b"c:q/0/0/n/1/x"], {}),  # deleted, was absent
        # a manifest replaced by a higher epoch: the old one moves to its side key
        (
            {b"m:q/0/0/n/1/delta": 7, b"o:q/0/0/n/1/delta/1": None},
            {b"m:q/0/0/n/1/delta": 9, b"o:q/0/0/n/1/delta/1": 7},
            [],
            {"q": 9},
        ),
        # heads, floors, tombstones are not counted; two queries in one write
        (
            {b"c:a/0/0/n/1/x": None, b"c:b/0/0/n/1/x": 5},
            {b"h:a/0/0/n": 20, b"f:a/0/0/n": 2, b"t:b": 30, b"c:a/0/0/n/1/x": 4},
            [b"c:b/0/0/n/1/x"],
            {"a": 4, "b": -5},
        ),
        # deleted and put in one write: put wins (deletes apply first)
        ({b"c:q/0/0/n/1/x": 3}, {b"c:q/0/0/n/1/x": 8}, [b"c:q/0/0/n/1/x"], {"q": 5}),
    ],
)
def test_charges(
    old: dict[bytes, int | None], puts: dict[bytes, int], deletes: list[bytes], want: Any
) -> None:
    assert charges(old, puts, deletes) == want


@pytest.mark.parametrize(
    "body, words",
    [
        (b"[1]", "must be an object"),
        (b"{not json", "not JSON"),
        (b'{"q1": 5}', "its value must be"),
        (b'{"q1": {"max_bytes": -1}}', "max_bytes must be a whole number"),
        (b'{"q1": {"max_bytes": "1GB"}}', "max_bytes must be a whole number"),
        (b'{"q1": {"max_bytes": true}}', "max_bytes must be a whole number"),
        (b'{"q1": {"max_bytes": 1.5}}', "max_bytes must be a whole number"),
        (b'{"q1": {"max_bytes": 9223372036854775807}}', "above 2\\^62"),
        (b'{"q1": {"max_bytes": 1, "per": "ring"}}', "unknown field"),
        (b'{"a/b": {"max_bytes": 1}}', "a query name"),
        (b'{"": {"max_bytes": 1}}', "a query name"),
        (b'{"e*x*": {"max_bytes": 1}}', "a query name"),
    ],
)
def test_malformed_quota_files_are_refused_by_name(body: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_quotas(body)


def test_a_good_file_parses() -> None:
    q = parse_quotas(b'{"q1": {"max_bytes": 10}, "etl-*": {"max_bytes": 0}, "*": {"max_bytes": 5}}')
    assert (q.limit("q1"), q.limit("etl-x"), q.limit("z")) == (10, 0, 5)
    assert not parse_quotas(b"{}")


# -- the store's counters ---------------------------------------------------------------


def recount(store: NodeStore) -> dict[str, int]:
    sizes = [kv for p in COUNTED_PREFIXES for kv in store.backend.scan_sizes(p)]
    return Usage.from_sizes(sizes).snapshot()


def commit_local(
    store: NodeStore, sid: StoreId, version: int, epoch: int, kind: str = "delta"
) -> Manifest:
    rows = {f"{sid.path}-{version}-{i}".encode(): os.urandom(40) for i in range(30)}
    chunks = encode_chunks(rows, [], kind=kind[0])
    for c in chunks:
        store.put_chunk(chunk_key(sid, version, c.name), c.data)
    m = Manifest(sid, version, kind, epoch, 128, tuple(ChunkRef.of(c) for c in chunks), {})
    store.put_manifest(m)
    return m


def test_counters_follow_every_kind_of_write_and_match_a_rebuild() -> None:
    store = NodeStore(MemoryBackend())
    a, b = StoreId("qa", 0, 0, "n"), StoreId("qb", 0, 1, "n")
    steps: list[Callable[[], object]] = [
        lambda: commit_local(store, a, 1, 1, "snapshot"),
        lambda: commit_local(store, a, 2, 1),
        lambda: commit_local(store, a, 2, 3),  # a higher epoch: the old one is kept aside
        lambda: commit_local(store, b, 1, 1),
        lambda: store.copy_manifest(commit_local(NodeStore(MemoryBackend()), a, 3, 2)),
        lambda: store.apply_floor(a, 2),
        lambda: store.delete_manifest(a, 2, "delta", 1),
        lambda: store.delete_chunks([k for k in store.chunk_keys() if k.startswith("qb/")][:1]),
        lambda: store.purge_query("qb", b"{}"),
    ]
    seen = []
    for step in steps:
        step()
        assert store.usage.snapshot() == recount(store)
        seen.append(store.query_bytes("qa"))
        # the counters a restarted node rebuilds from its storage are the same
        assert NodeStore(store.backend).usage.snapshot() == store.usage.snapshot()
    assert seen[2] > seen[1] > seen[0] > 0  # the replaced epoch still counts
    assert seen[5] < seen[4]  # the floor freed version 1
    assert store.query_bytes("qb") == 0


def test_a_refused_write_stores_nothing() -> None:
    store = NodeStore(MemoryBackend())
    sid = StoreId("qa", 0, 0, "n")
    commit_local(store, sid, 1, 1)
    used, keys = store.query_bytes("qa"), store.chunk_keys()
    (c,) = encode_chunks({b"k": os.urandom(500)}, [])
    with pytest.raises(CoreQuotaExceeded, match="qa"):
        store.put_chunk(chunk_key(sid, 2, c.name), c.data, limit=used + 100)
    assert store.chunk_keys() == keys and store.query_bytes("qa") == used
    m = Manifest(sid, 2, "delta", 1, 128, (ChunkRef.of(c),), {})
    with pytest.raises(CoreQuotaExceeded):
        store.put_manifest(m, limit=used)
    assert store.head(sid) is not None and store.head(sid).version == 1  # type: ignore[union-attr]
    store.put_chunk(keys[0], store.get_chunk(keys[0]) or b"", limit=0)  # adds nothing: passes


# -- a real ring ---------------------------------------------------------------------------


def write_quotas(path: Path, rules: dict[str, int]) -> None:
    path.write_text(json.dumps({q: {"max_bytes": n} for q, n in rules.items()}))


def quota_of(address: str, query: str) -> dict[str, Any]:
    obj = http_json(address, f"/v1/queries/{query}")
    assert isinstance(obj, dict)
    q = obj["quota"]
    assert isinstance(q, dict)
    return q


def usage(ring: LocalRing, query: str) -> dict[str, int]:
    return {a: int(quota_of(a, query)["usage"]) for a in ring.seeds}


def put(address: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://{address}{path}", data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def rows(tag: str, n: int, size: int) -> dict[bytes, bytes]:
    return {f"{tag}-{i}".encode(): os.urandom(size) for i in range(n)}


def test_quotas_on_a_real_ring(tmp_path: Path) -> None:
    qfile = tmp_path / "quotas.json"
    write_quotas(qfile, {"other-*": 10})
    with local_ring(tmp_path, 4, [*FAST, "--quota-file", str(qfile)]) as ring:
        a, b = StoreId("qa", 0, 0, "default"), StoreId("qb", 0, 0, "default")
        with RingClient(ring.seeds) as client:
            state = rows("v1", 20, 100)
            client.commit(a, 1, state, [], {}, epoch=1)
            before = usage(ring, "qa")
            assert sum(before.values()) > 0
            write_quotas(qfile, {"qa": max(before.values()) + 50, "other-*": 10})
            eventually(
                lambda: quota_of(ring.seeds[0], "qa")["limit"] is not None, "quota seen", every=0.2
            )

            # over quota: the typed error through the SDK, naming query, usage and limit
            with pytest.raises(QuotaExceeded, match=r"query 'qa' holds \d+ bytes .* quota"):
                client.commit(a, 2, rows("v2", 50, 2000), [], {}, epoch=1)
            assert usage(ring, "qa") == before  # nothing left behind
            assert client.versions(a) == [1] and dict(client.restore(a)) == state
            client.commit(b, 1, rows("b1", 50, 2000), [], {}, epoch=1)  # others unaffected

            # the coordinator path: 507 quota_exceeded, nothing stored
            addr = ring.seeds[1]
            req = urllib.request.Request(
                f"http://{addr}/v1/stores/{a.path}/commit?version=2&epoch=1",
                data=b"".join(encode_rows(rows("c2", 50, 2000).items())),
                method="POST",
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=10)
            assert err.value.code == 507
            assert json.loads(err.value.read())["error"]["code"] == "quota_exceeded"
            assert usage(ring, "qa") == before

            # a replica's own refusal (no room check first): 507, and a copy is taken; sent
            # to an owner of the chunk that stays up (repair keeps it there), below the floor
            # that gc takes later
            (c,) = encode_chunks({b"k": os.urandom(5000)}, [])
            key = chunk_key(a, 1, c.name)
            owners = RingView.from_json(ring.ring()).replicas_of(key)
            addr = next(o for o in owners if o != ring.procs[3].address)
            path = f"/v1/chunks/{key}"
            status, body = put(addr, path, c.data)
            assert (status, body["error"]["code"]) == (507, "quota_exceeded"), body
            assert usage(ring, "qa") == before
            status, body = put(addr, path + "?copy=1", c.data)
            assert status == 201, body
            assert usage(ring, "qa")[addr] == before[addr] + len(c.data)

            # the gauges
            with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            assert (
                f'statestore_query_bytes{{query="qa"}} {float(before[addr] + len(c.data))}' in text
            )
            assert 'statestore_query_quota_bytes{query="qa"}' in text
            assert 'statestore_query_quota_bytes{query="qb"}' not in text

            # a malformed file on reload: the last good quotas kept, health degraded
            qfile.write_text('{"qa": {"max_bytes": "lots"}}')
            eventually(
                lambda: "--quota-file" in " ".join(http_json(addr, "/v1/health")["reasons"]),  # type: ignore[index]
                "degraded",
                every=0.2,
            )
            with pytest.raises(QuotaExceeded):
                client.commit(a, 2, rows("v2", 50, 2000), [], {}, epoch=1)

            # raising the quota lets writes resume
            write_quotas(qfile, {"qa": 10**9})
            eventually(lambda: quota_of(addr, "qa")["limit"] == 10**9, "reloaded", every=0.2)
            client.commit(a, 2, rows("v2", 50, 2000), [], {}, epoch=1)
            client.commit(a, 3, dict(client.restore(a)), [], {}, epoch=1, snapshot=True)
            assert http_json(addr, "/v1/health")["status"] == "ok"  # type: ignore[index]

            # gc frees usage: a floor on the snapshot at version 3 drops versions 1 and 2
            full = usage(ring, "qa")

            def gc(addresses: list[str]) -> list[str]:
                """The floor to each of ``addresses``; those that refused it."""
                refused = []
                for address in addresses:
                    req = urllib.request.Request(
                        f"http://{address}/v1/stores/{a.path}/gc",
                        data=b'{"floor": 3}',
                        method="POST",
                    )
                    try:
                        urllib.request.urlopen(req, timeout=10).close()
                    except urllib.error.HTTPError as exc:
                        assert exc.code == 400, exc
                        refused.append(address)
                return refused

            # a node holding none of the store's manifests takes only a floor its home
            # replicas took: sent again once they have
            assert gc(gc(ring.seeds)) == []
            freed = usage(ring, "qa")
            assert sum(freed.values()) < sum(full.values()), (full, freed)

            # repair re-replicates a query over its quota after a node loss
            write_quotas(qfile, {"qa": 0})
            eventually(
                lambda: all(quota_of(s, "qa")["limit"] == 0 for s in ring.seeds),
                "quota 0",
                every=0.2,
            )
            with pytest.raises(QuotaExceeded):
                client.commit(a, 4, rows("v4", 5, 10), [], {}, epoch=1)

            def chunks_on(address: str) -> set[str]:
                obj = http_json(address, f"/v1/inventory/{a.path}")
                assert isinstance(obj, dict)
                return set(obj["chunks"])

            held = {s: chunks_on(s) for s in ring.seeds}
            chunks = set().union(*held.values())
            # kill a node holding a chunk that another node lacks: that one must get it
            victim = next(
                i
                for i, p in enumerate(ring.procs)
                if any(not held[p.address] <= held[o] for o in ring.seeds if o != p.address)
            )
            # usage before the kill: repair may start copying as soon as the ring sees the
            # node down, before the test could look again
            was = usage(ring, "qa")
            ring.kill(victim)
            ring.wait_ring(3)
            lacking = [s for s in ring.seeds if not held[s] >= chunks]
            assert lacking, held
            # with 3 nodes left and R=3, every survivor must hold every chunk again
            eventually(
                lambda: all(chunks_on(s) >= chunks for s in ring.seeds),
                "re-replicated",
                limit=40,
                every=0.2,
            )
            now = usage(ring, "qa")
            assert all(now[s] > was[s] for s in lacking), (was, now)  # over its quota of 0

            # dropping the query frees all of it
            done = subprocess.run(
                [*CLI, "drop", "--seeds", ring.seeds[0], "--query", "qa", "--yes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, done.stderr  # the dead member: said so
            assert set(usage(ring, "qa").values()) == {0}
            assert sum(usage(ring, "qb").values()) > 0


def test_a_malformed_quota_file_stops_the_node(tmp_path: Path) -> None:
    bad = tmp_path / "quotas.json"
    bad.write_text('{"q1": {"max_bytes": -5}}')
    done = subprocess.run(
        [*CLI, "node", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), *NO_DHT, str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"--quota-file {bad}" in done.stderr and "max_bytes" in done.stderr


async def test_room_counts_only_the_chunks_the_node_lacks(tmp_path: Path) -> None:
    """A retried commit (its chunks landed, its manifest did not) is not charged twice by the
    room check: what the node holds already counts nothing, as its writes would not."""
    import aiohttp

    from statestore.node.config import NodeConfig
    from statestore.node.server import start_node, stop_node

    qfile = tmp_path / "quotas.json"
    qfile.write_text(json.dumps({"qa": {"max_bytes": 9000}}))
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "n"),
        storage="memory://",
        replicas=1,
        write_quorum=1,
        dht=False,
        quota_file=str(qfile),
    )
    node, runner = await start_node(config)
    try:
        a = StoreId("qa", 0, 0, "default")
        (c1,) = encode_chunks({b"k1": os.urandom(5000)}, [])
        (c2,) = encode_chunks({b"k2": os.urandom(5000)}, [])
        k1, k2 = chunk_key(a, 1, c1.name), chunk_key(a, 1, c2.name)
        url = f"http://{node.address}/v1/queries/qa/room"
        async with aiohttp.ClientSession() as http:

            async def room(body: object) -> tuple[int, Any]:
                async with http.post(url, json=body) as resp:
                    return resp.status, await resp.json()

            assert (await room({"chunks": [[k1, len(c1.data)]], "bytes": 300}))[0] == 200
            async with http.put(f"http://{node.address}/v1/chunks/{k1}", data=c1.data) as r:
                assert r.status == 201
            # k1 held: a retry asks for it again and only the manifest counts
            status, answer = await room({"chunks": [[k1, len(c1.data)]], "bytes": 300})
            assert status == 200 and answer["bytes"] == 300, answer
            # the old question (bytes only) charges it again and is refused
            async with http.get(f"{url}?bytes={len(c1.data) + 300}") as resp:
                assert resp.status == 507
            # a chunk it lacks still counts
            status, answer = await room({"chunks": [[k2, len(c2.data)]], "bytes": 300})
            assert (status, answer["error"]["code"]) == (507, "quota_exceeded"), answer
            # hostile bodies: another query's chunk, a negative size, not an object
            other = chunk_key(StoreId("qb", 0, 0, "default"), 1, c2.name)
            for bad in ({"chunks": [[other, 1]]}, {"chunks": [[k2, -1]]}, [], {"bytes": "x"}):
                status, answer = await room(bad)
                assert status == 400, (bad, answer)
        assert node.store.query_bytes("qa") == len(c1.data)  # the questions stored nothing
    finally:
        await stop_node(node, runner)
