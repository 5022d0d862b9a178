"""The ring end to end: real node processes on loopback port 0, kill -9, restarts, joins."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from client import RingClient, StaleEpoch, StoreId, VersionNotFound
from statestore.cli.local import http_json
from tests.ringkit import (
    FAST,
    assert_all_restore,
    chunk_keys,
    local_ring,
    manifest_keys,
    post,
    wait_copies,
    workload,
)


@pytest.mark.parametrize("nodes", [3, 5])
def test_fifty_versions_restore_exactly(tmp_path: Path, nodes: int) -> None:
    with local_ring(tmp_path, nodes, [*FAST, "--snapshot-every", "8"]) as ring:
        sid = StoreId("it", 1, nodes, "default")
        with RingClient(ring.seeds[-1:], chunk_size=8192) as client:
            expected = workload(sid, client, 50, seed=nodes)
            assert client.latest(sid).version == 50
            assert_all_restore(client, sid, expected)
            key = next(iter(expected[50]))
            assert client.get(sid, key) == expected[50][key]
            assert client.get(sid, b"never-written") is None
            # the compactor folded the chain into snapshots in the background
            deadline = time.monotonic() + 30
            while client.restore(sid, 50).stats["chain"] > 8:
                assert time.monotonic() < deadline, "no snapshot was written"
                time.sleep(0.5)
            assert dict(client.restore(sid, 50)) == expected[50]


def test_kill9_one_then_a_second_after_repair(tmp_path: Path) -> None:
    with local_ring(tmp_path, 5) as ring:
        sid = StoreId("kill", 0, 0)
        with RingClient(ring.seeds, chunk_size=4096) as client:
            expected = workload(sid, client, 12, seed=1)
            keys = chunk_keys(client, sid, list(expected))
            ring.kill(1)
            # writes still succeed at W while the node is down or suspect
            more = workload(StoreId("kill", 0, 1), client, 3, seed=2)
            ring.wait_ring(4)
            wait_copies(ring, keys, 3)  # re-replicated without anyone asking
            ring.kill(3)
            ring.wait_ring(3)
            assert_all_restore(client, sid, expected)
            assert dict(client.restore(StoreId("kill", 0, 1))) == more[3]


def test_restarted_node_rejoins_with_its_data_and_catches_up(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3) as ring:
        sid = StoreId("restart", 2, 7)
        with RingClient(ring.seeds, chunk_size=4096) as client:
            first = workload(sid, client, 3, seed=3)
            old_id = ring.procs[2].id
            ring.kill(2)
            ring.wait_ring(2)
            rng = random.Random(9)
            state = dict(first[3])
            for v in range(4, 8):  # committed while node 2 is down: W=2 of the other two
                puts = {f"late-{v}-{i}".encode(): rng.randbytes(50) for i in range(100)}
                client.commit(sid, v, puts, [], {"offset": v * 1000}, epoch=1)
                state.update(puts)
            ring.restart(2)
            assert ring.procs[2].id == old_id
            ring.wait_ring(3)
            keys = chunk_keys(client, sid, list(range(1, 8)))
            manifests = manifest_keys(client, sid, list(range(1, 8)))
        wait_copies(ring, keys, 3, manifests=manifests)
        # only the restarted node left: it must hold everything on its own
        ring.kill(0)
        ring.kill(1)
        with RingClient([ring.procs[2].address]) as alone:
            deadline = time.monotonic() + 30
            while len(alone.ring().ring) != 1:
                assert time.monotonic() < deadline
                time.sleep(0.3)
            assert dict(alone.restore(sid, 7)) == state
            assert dict(alone.restore(sid, 3)) == first[3]


def test_new_node_found_through_one_seed_and_the_dht(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3) as ring:
        newcomer = ring.add_node()
        ring.wait_ring(4)
        view = ring.ring(newcomer.address)
        assert {m["address"] for m in view["members"]} == set(ring.seeds)
        import subprocess
        import sys

        cli = [sys.executable, "-m", "statestore", "ring", "--seeds", newcomer.address]
        shown = json.loads(
            subprocess.run(
                [*cli, "--json"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        )
        assert {m["status"] for m in shown["members"]} == {"up"} and len(shown["members"]) == 4
        assert abs(sum(m["share"] for m in shown["members"]) - 1) < 0.01 and shown["epoch"] >= 1
        table = subprocess.run(cli, capture_output=True, text=True, timeout=30, check=True)
        assert "ring epoch" in table.stdout and newcomer.id in table.stdout
        down = subprocess.run(
            [*cli[:-1], "127.0.0.1:1"], capture_output=True, text=True, timeout=30
        )
        assert down.returncode == 1 and "no seed answered" in down.stderr
        deadline = time.monotonic() + 30
        while True:  # the DHT directory lists every member, not only the seed
            health = http_json(newcomer.address, "/v1/health")
            if health["dht_directory"] >= 3:  # type: ignore[index]
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.3)


def test_zombie_writer_is_fenced_and_retention_keeps_the_last_k(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, [*FAST, "--retain", "5", "--snapshot-every", "3"]) as ring:
        sid = StoreId("retain", 0, 0)
        with RingClient(ring.seeds) as client:
            expected = workload(sid, client, 20, seed=4)
            # retention drops old versions as the compactions behind it land (a loaded CI
            # run saw 15 versions kept at the first drop): wait for it to reach its bound
            deadline = time.monotonic() + 60
            while (kept := client.versions(sid))[0] == 1 or len(kept) > 5 + 3:
                assert time.monotonic() < deadline, f"retention never dropped old versions: {kept}"
                time.sleep(0.5)
            assert kept[-1] == 20 and 5 <= len(kept) <= 5 + 3
            assert_all_restore(client, sid, expected)
            with pytest.raises(VersionNotFound):
                client.restore(sid, 1)
            client.commit(sid, 21, {b"new": b"writer"}, [], {"offset": 21000}, epoch=2)
            with pytest.raises(StaleEpoch):
                client.commit(sid, 22, {b"old": b"zombie"}, [], {}, epoch=1)
            assert client.latest(sid).epoch == 2


def test_sigterm_stops_gracefully(tmp_path: Path) -> None:
    with local_ring(tmp_path, 1, ["--replicas", "1"]) as ring:
        proc = ring.procs[0]
        assert proc.proc is not None
        popen = proc.proc
        popen.send_signal(signal.SIGTERM)
        assert popen.wait(30) == 0
    out = (Path(proc.data_dir) / "node.out").read_text()
    assert "stopped" in out


def test_node_cli_refuses_bad_setups_with_a_message(tmp_path: Path) -> None:
    import subprocess
    import sys

    with local_ring(tmp_path, 1, ["--replicas", "1"]) as ring:
        node = [sys.executable, "-m", "statestore", "node"]
        busy_port = ring.procs[0].port
        cases = [
            (
                [*node, "--data-dir", ring.procs[0].data_dir, "--listen", "127.0.0.1:0"],
                "in use by another running node",
            ),
            (
                [*node, "--data-dir", str(tmp_path / "x"), "--listen", f"127.0.0.1:{busy_port}"],
                "cannot listen",
            ),
            ([*node, "--data-dir", "/proc/statestore", "--listen", "127.0.0.1:0"], "cannot use"),
            ([*node, "--data-dir", str(tmp_path / "y"), "--listen", "nope"], "HOST:PORT"),
            (
                [
                    *node,
                    "--data-dir",
                    str(tmp_path / "z"),
                    "--replicas",
                    "2",
                    "--write-quorum",
                    "3",
                ],
                "write quorum",
            ),
        ]
        for cmd, message in cases:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            assert done.returncode == 2, (cmd, done.stderr)
            assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_each_lost_copy_is_made_by_its_planned_source(tmp_path: Path) -> None:
    """After a node loss, re-replication is planned: each lost copy is made by the one
    surviving holder the planner names (rendezvous), not by whichever holder runs first."""
    from statestore.core.repair import pick_source

    with local_ring(tmp_path, 4) as ring:
        sid = StoreId("once", 0, 0)
        with RingClient(ring.seeds, chunk_size=2048) as client:
            expected = workload(sid, client, 8, seed=8)
            keys = chunk_keys(client, sid, list(expected))
            before = client.ring()
        victim = ring.procs[3]
        manifests = [[sid.path, v, "delta"] for v in expected]
        held = post(victim.address, "/v1/sync/have", {"chunks": keys, "manifests": manifests})
        planned: dict[str, int] = {p.address: 0 for p in ring.procs[:3]}
        lost = [k for k, h in zip(keys, held["chunks"], strict=True) if h]  # type: ignore[index]
        lost += [sid.path for h in held["manifests"] if h]  # type: ignore[index]
        for key in lost:
            holders = [a for a in before.replicas_of(key) if a != victim.address]
            planned[pick_source(key, holders)] += 1
        assert len(lost) > 30
        ring.kill(3)
        ring.wait_ring(3)
        wait_copies(ring, keys, 3)
        time.sleep(3)  # a second pass, if one is pending
        for p in ring.procs[:3]:
            done = http_json(p.address, "/v1/health")["stats"]["repaired"]  # type: ignore[index]
            assert abs(done - planned[p.address]) <= 2 + 0.1 * planned[p.address], (
                p.address,
                done,
                planned,
            )
