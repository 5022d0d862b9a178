"""The admin commands against real node processes: ``stores ls``, ``inspect`` and ``drop``.

After a drop nothing of the query is left on any node (its ``/v1/stores``, what its storage
holds under the query's prefixes, also after repair has had passes to bring anything back),
other queries are untouched, and the query can be written again from version 1. A node that
was down during the drop purges its copy when it comes back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from client import RingClient, StoreId
from statestore.cli.local import LocalRing, http_json
from statestore.wire.rows import encode_rows
from tests.ringkit import FAST, local_ring

DROP = [StoreId("q-drop", 0, p, "default") for p in range(2)] + [StoreId("q-drop", 1, 0, "agg")]
KEEP = [StoreId("q-keep", 0, p, "default") for p in range(2)]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
    )


def commit_versions(
    client: RingClient, sid: StoreId, versions: int, tag: str
) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for v in range(1, versions + 1):
        puts = {f"{tag}-{v}-{i}".encode(): f"{sid.path}@{v}".encode() * 20 for i in range(50)}
        client.commit(sid, v, puts, [], {"offset": v}, epoch=1)
        state.update(puts)
    return state


def holdings(address: str, query: str) -> dict[str, Any]:
    obj = http_json(address, f"/v1/queries/{query}")
    assert isinstance(obj, dict)
    return obj


def stores_on(address: str) -> list[str]:
    obj = http_json(address, "/v1/stores")
    assert isinstance(obj, dict)
    return list(obj["stores"])


def assert_nothing_left(ring: LocalRing, query: str) -> None:
    for address in ring.seeds:
        held = holdings(address, query)
        assert held["held"] == {
            "chunks": 0,
            "manifests": 0,
            "heads": 0,
            "floors": 0,
            "thinning": 0,
            "retention": 0,
            "hints": 0,
            "outcomes": 0,
        }, address
        assert held["tombstone"] is not None and held["tombstone"]["state"] == "sealed"
        assert not [s for s in stores_on(address) if s.startswith(query + "/")], address


def test_ls_inspect_drop_and_write_again(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3) as ring:
        seeds = ",".join(ring.seeds)
        with RingClient(ring.seeds) as client:
            dropped = {sid: commit_versions(client, sid, 3, "old") for sid in DROP}
            kept = {sid: commit_versions(client, sid, 2, "keep") for sid in KEEP}
            assert dropped and kept

            out = cli("stores", "ls", "--seeds", seeds, "--json")
            assert out.returncode == 0, out.stderr
            listing = {s["store"]: s for s in json.loads(out.stdout)["stores"]}
            assert set(listing) == {s.path for s in DROP + KEEP}
            for sid in DROP:
                assert listing[sid.path]["head"] == {"version": 3, "epoch": 1}
                assert listing[sid.path]["versions"] == 3
                assert len(listing[sid.path]["holders"]) == 3  # R = 3 on 3 nodes
            only = cli("stores", "ls", "--seeds", seeds, "--query", "q-keep", "--json")
            assert {s["store"] for s in json.loads(only.stdout)["stores"]} == {s.path for s in KEEP}
            table = cli("stores", "ls", "--seeds", seeds)
            assert table.returncode == 0 and "q-keep/0/1/default" in table.stdout

            out = cli("inspect", "--seeds", seeds, "--store", DROP[0].path, "--json")
            assert out.returncode == 0, out.stdout + out.stderr
            report = json.loads(out.stdout)
            assert report["head"] == {"version": 3, "epoch": 1}
            assert [v["version"] for v in report["versions"]] == [1, 2, 3]
            assert [c["version"] for c in report["chain"]] == [1, 2, 3]
            assert all(v["rows"] == 50 and v["bytes"] > 0 for v in report["versions"])
            assert sorted(r["address"] for r in report["replicas"]) == sorted(ring.seeds)
            for r in report["replicas"]:
                assert r["complete"] and r["manifests"] == {"expected": 3, "held": 3}
                assert r["chunks"]["held"] == r["chunks"]["expected"] > 0
            text = cli("inspect", "--seeds", seeds, "--store", DROP[0].path)
            assert text.returncode == 0 and "chain of the head" in text.stdout

            # no terminal and no --yes: nothing happens
            refused = cli("drop", "--seeds", seeds, "--query", "q-drop", stdin="")
            assert refused.returncode == 2 and "--yes" in refused.stderr
            assert holdings(ring.seeds[0], "q-drop")["held"]["heads"] == 3

            done = cli("drop", "--seeds", seeds, "--query", "q-drop", "--yes")
            assert done.returncode == 0, done.stdout + done.stderr
            assert_nothing_left(ring, "q-drop")
            # repair and compaction get several passes to bring anything back: they must not
            time.sleep(3 * 2.0 + 1)
            assert_nothing_left(ring, "q-drop")
            gone = cli("stores", "ls", "--seeds", seeds, "--query", "q-drop", "--json")
            assert json.loads(gone.stdout)["stores"] == []

            for sid, state in kept.items():  # the other query is untouched
                assert dict(client.restore(sid)) == state
                assert client.versions(sid) == [1, 2]

            # written again from version 1, with other content, at epoch 1
            again = commit_versions(client, DROP[0], 2, "new")
            assert dict(client.restore(DROP[0])) == again
            assert client.versions(DROP[0]) == [1, 2]
        out = cli("inspect", "--seeds", seeds, "--store", DROP[0].path, "--json")
        assert out.returncode == 0, out.stdout
        assert json.loads(out.stdout)["head"] == {"version": 2, "epoch": 1}


def test_a_node_down_during_the_drop_purges_when_it_returns(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3) as ring:
        with RingClient(ring.seeds) as client:
            for sid in DROP:
                commit_versions(client, sid, 2, "old")
            kept = {sid: commit_versions(client, sid, 2, "keep") for sid in KEEP}
        away = ring.procs[2]
        ring.kill(2)
        ring.wait_ring(2)
        seeds = ",".join(ring.seeds)
        done = cli("drop", "--seeds", seeds, "--query", "q-drop", "--yes")
        assert done.returncode == 1  # one member could not be reached: said so
        assert away.address in done.stdout
        assert_nothing_left(ring, "q-drop")

        ring.restart(2)
        ring.wait_ring(3)
        deadline = time.monotonic() + 30
        while holdings(away.address, "q-drop")["held"]["heads"]:
            assert time.monotonic() < deadline, holdings(away.address, "q-drop")
            time.sleep(0.3)
        time.sleep(3 * 2.0 + 1)  # repair passes on every node, the returned one included
        assert_nothing_left(ring, "q-drop")
        with RingClient(ring.seeds) as client:
            for sid, state in kept.items():
                assert dict(client.restore(sid)) == state


def test_drop_needs_the_admin_right(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATESTORE_TOKEN", "admin-token")  # LocalRing's own ring checks
    secret = tmp_path / "secret"
    secret.write_text("s" * 64)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "writer-token": {"queries": ["q-drop"], "rights": ["read", "write"]},
                "admin-token": {"queries": ["q-*"], "rights": ["read", "admin"]},
            }
        )
    )
    auth = ["--cluster-secret-file", str(secret), "--auth-file", str(tokens)]
    with local_ring(tmp_path / "ring", 3, [*FAST, *auth]) as ring:
        commit_rows(ring.seeds[0], DROP[0], "writer-token")
        seeds = ",".join(ring.seeds)
        env = {"STATESTORE_TOKEN": "writer-token"}
        refused = cli_env(env, "drop", "--seeds", seeds, "--query", "q-drop", "--yes")
        assert refused.returncode == 1 and "admin" in refused.stderr
        nobody = cli_env({}, "drop", "--seeds", seeds, "--query", "q-drop", "--yes")
        assert nobody.returncode == 1 and "token" in nobody.stderr
        held = request(ring.seeds[0], "GET", "/v1/queries/q-drop", "admin-token")
        assert held["held"]["heads"] >= 1  # still there
        done = cli_env(
            {"STATESTORE_TOKEN": "admin-token"},
            "drop",
            "--seeds",
            seeds,
            "--query",
            "q-drop",
            "--yes",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        listing = cli_env(
            {"STATESTORE_TOKEN": "admin-token"}, "stores", "ls", "--seeds", seeds, "--json"
        )
        assert json.loads(listing.stdout)["stores"] == []


def request(address: str, method: str, path: str, token: str, body: bytes = b"") -> Any:
    req = urllib.request.Request(
        f"http://{address}{path}",
        data=body or None,
        method=method,
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def commit_rows(address: str, sid: StoreId, token: str) -> None:
    rows = b"".join(encode_rows([(b"k%d" % i, b"v" * 50) for i in range(20)]))
    path = f"/v1/stores/{sid.path}/commit?version=1&epoch=1"
    assert request(address, "POST", path, token, rows)["version"] == 1


def cli_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("STATESTORE_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**full, **env},
    )


def test_a_drop_gives_the_disk_space_back(tmp_path: Path) -> None:
    """After a drop frees most of what the nodes hold, each node's storage file shrinks
    while it serves (node/space.py), every kept store restores, and ``statestore ring
    --json`` and /metrics show the bytes held, the file and the compaction."""
    args = [*FAST, "--reclaim-at", "0.5", "--reclaim-min", "1048576"]
    with local_ring(tmp_path, 3, args) as ring:
        seeds = ",".join(ring.seeds)
        with RingClient(ring.seeds, chunk_size=256 * 1024) as client:
            rng = __import__("random").Random(3)
            big = StoreId("q-big", 0, 0, "default")
            for v in range(1, 4):
                client.commit(big, v, {b"b%05d" % i: rng.randbytes(1000) for i in range(3000)}, [])
            kept = commit_versions(client, KEEP[0], 2, "keep")

            def files() -> list[int]:
                out = cli("ring", "--seeds", seeds, "--json")
                assert out.returncode == 0, out.stderr
                members = json.loads(out.stdout)["members"]
                return [m["storage"]["file_bytes"] for m in members]

            full = files()
            assert min(full) > 9_000_000  # three versions of 3 MB on each node
            done = cli("drop", "--seeds", seeds, "--query", "q-big", "--yes")
            assert done.returncode == 0, done.stdout + done.stderr
            deadline = time.monotonic() + 60
            while max(now := files()) > 0.3 * min(full):
                assert time.monotonic() < deadline, (full, now)
                time.sleep(0.5)
            assert dict(client.restore(KEEP[0])) == kept
            client.commit(KEEP[0], 3, {b"after": b"compaction"}, [], epoch=1)
            assert dict(client.restore(KEEP[0]))[b"after"] == b"compaction"
        for address in ring.seeds:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            line = 'statestore_node_events_total{event="compactions"} '
            assert float(text.split(line, 1)[1].split()[0]) >= 1, text
            assert "statestore_storage_file_bytes" in text and "statestore_held_bytes" in text
            health = http_json(address, "/v1/health")
            assert isinstance(health, dict) and health["status"] == "ok", health
            assert health["storage"]["held_bytes"] > 0
