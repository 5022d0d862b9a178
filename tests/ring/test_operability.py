"""Operable for years: what a node runs and keeps, and honest probes (docs/operations.md,
Probes; Versions and upgrades).

Real nodes on port 0 and real ``statestore`` processes: ``statestore --version``; the version
and formats in ``/v1/health``, ``statestore ring`` and ``statestore_build_info``; a data dir
recording its disk format and a newer one refused (exit 2, no trace, nothing written); the
probes ``/v1/health/live`` and ``/v1/health/ready`` through a real join and a full disk;
labelled counters and process metrics exported before anything happened; and the compose
file's health check run for real against a node.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from client import AsyncRingClient, StoreId
from statestore.core.formats import DISK_FORMAT, DISK_FORMATS_READ, VERSION, WIRE_FORMAT
from statestore.node.daemon import Node, NodeConfig
from statestore.node.metrics import KNOWN_ERRORS
from statestore.node.server import start_node, stop_node
from tests.ringkit import scrape, value

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "statestore"


async def call(address: str, path: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{address}{path}") as r:
            return r.status, json.loads(await r.read())


async def eventually_ready(node: Node, limit: float = 90.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + limit
    while True:
        status, body = await call(node.address, "/v1/health/ready")
        if status == 200:
            return body
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never ready: {body}")
        await asyncio.sleep(0.1)


def node_config(tmp_path: Path, name: str, **kw: Any) -> NodeConfig:
    base: dict[str, Any] = {
        "port": 0,
        "data_dir": str(tmp_path / name),
        "storage": "memory://",
        "dht": False,
        "gossip_interval": 0.1,
        "replicas": 1,
        "write_quorum": 1,
    }
    return NodeConfig(**(base | kw))


# -- versions ----------------------------------------------------------------------------
def test_version_prints_the_package_version_and_the_formats() -> None:
    done = subprocess.run([str(BIN), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line == (
        f"statestore {VERSION} (wire format {WIRE_FORMAT}, disk format {DISK_FORMAT}; "
        f"reads disk formats {', '.join(map(str, sorted(DISK_FORMATS_READ)))})"
    )
    # written once: the installed metadata and the package attribute are that constant
    assert installed_version("statestore") == VERSION
    import statestore

    assert statestore.__version__ == VERSION
    assert 'attr = "statestore.core.formats.VERSION"' in (ROOT / "pyproject.toml").read_text()


async def test_health_gives_the_version_and_formats_and_keeps_its_fields(solo: Node) -> None:
    status, health = await call(solo.address, "/v1/health")
    assert status == 200
    assert (health["version"], health["wire_format"], health["disk_format"]) == (
        VERSION,
        WIRE_FORMAT,
        DISK_FORMAT,
    )
    for kept in ("status", "reasons", "id", "address", "zone", "incarnation", "epoch", "state"):
        assert kept in health, kept
    assert health["id"] == solo.id and health["status"] == "ok"


async def test_ring_shows_each_members_version(tmp_path: Path) -> None:
    a, ra = await start_node(node_config(tmp_path, "a", replicas=2, write_quorum=1))
    b, rb = await start_node(
        node_config(tmp_path, "b", replicas=2, write_quorum=1, seeds=[a.address])
    )
    try:
        for _ in range(600):  # b gossips its way into a's view
            if len(a.view().members) == 2:
                break
            await asyncio.sleep(0.05)
        proc = await asyncio.create_subprocess_exec(
            str(BIN), "ring", "--seeds", a.address, "--json", stdout=subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        members = json.loads(out)["members"]
        assert {m["id"] for m in members} == {a.id, b.id}
        for m in members:
            assert (m["version"], m["wire_format"], m["disk_format"]) == (
                VERSION,
                WIRE_FORMAT,
                DISK_FORMAT,
            )
        proc = await asyncio.create_subprocess_exec(
            str(BIN),
            "ring",
            "--seeds",
            a.address,
            stdout=subprocess.PIPE,
            env=os.environ | {"COLUMNS": "200"},
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        table = out.decode()
        assert "version" in table and table.count(VERSION) == 2, table
    finally:
        await stop_node(b, rb)
        await stop_node(a, ra)


async def test_build_info_metric(solo: Node) -> None:
    samples = await scrape(solo)
    labels = {"version": VERSION, "wire_format": str(WIRE_FORMAT), "disk_format": str(DISK_FORMAT)}
    assert value(samples, "statestore_build_info", **labels) == 1
    assert [k for k in samples if k[0] == "statestore_build_info"] == [
        ("statestore_build_info", tuple(sorted(labels.items())))
    ]


# -- the data dir's disk format ------------------------------------------------------------
async def test_a_data_dir_records_its_disk_format_and_an_old_one_is_read(tmp_path: Path) -> None:
    node, runner = await start_node(node_config(tmp_path, "new"))
    await stop_node(node, runner)
    kept = json.loads((tmp_path / "new" / "node.json").read_text())
    assert kept["disk_format"] == DISK_FORMAT and kept["version"] == VERSION
    assert kept["id"] == node.id
    # a data dir from before formats were recorded (node.json without them) is format 1:
    # read, and recorded as this build's format from then on (it writes sealed manifests)
    old = tmp_path / "old"
    old.mkdir()
    (old / "node.json").write_text(json.dumps({"id": "0123456789abcdef", "incarnation": 4}))
    node, runner = await start_node(node_config(tmp_path, "old"))
    await stop_node(node, runner)
    kept = json.loads((old / "node.json").read_text())
    assert (node.id, node.incarnation, kept["disk_format"]) == ("0123456789abcdef", 5, DISK_FORMAT)


def test_a_newer_disk_format_is_refused_with_exit_2_and_nothing_written(tmp_path: Path) -> None:
    data = tmp_path / "newer"
    data.mkdir()
    ident = {"id": "feedfacefeedface", "incarnation": 7, "disk_format": DISK_FORMAT + 1}
    ident["version"] = "9.0.0"
    (data / "node.json").write_text(json.dumps(ident))
    done = subprocess.run(
        [str(BIN), "node", "--listen", "127.0.0.1:0", "--data-dir", str(data), "--no-dht"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = done.stderr
    assert "Traceback" not in err, err
    assert f"disk format {DISK_FORMAT + 1}" in err and "9.0.0" in err, err
    assert f"statestore {VERSION} reads disk formats 1, 2, 3" in err, err
    assert str(data) in err, err
    assert json.loads((data / "node.json").read_text()) == ident  # not rewritten
    assert not (data / "db").exists()  # storage never opened
    assert "listening" not in done.stdout


# -- probes ------------------------------------------------------------------------------
async def test_live_is_200_and_ready_is_200_on_a_normal_node(solo: Node) -> None:
    status, body = await call(solo.address, "/v1/health/live")
    assert (status, body["status"]) == (200, "live")
    status, body = await call(solo.address, "/v1/health/ready")
    assert (status, body["status"], body["reasons"]) == (200, "ready", [])


async def test_ready_is_503_while_the_disk_is_full_and_200_after(solo: Node) -> None:
    solo.config.min_free_bytes = 2**62  # more than any disk has: "nearly full"
    status, body = await call(solo.address, "/v1/health/ready")
    assert status == 503 and body["status"] == "not_ready"
    assert any("disk nearly full" in r for r in body["reasons"]), body
    status, _ = await call(solo.address, "/v1/health/live")
    assert status == 200  # alive: restarting it would not free the disk
    status, health = await call(solo.address, "/v1/health")
    assert status == 200 and health["status"] == "degraded"  # kept as it was
    before = await scrape(solo)
    solo.config.min_free_bytes = 0  # space returned
    status, _ = await call(solo.address, "/v1/health/ready")
    assert status == 200
    # a probe's 503 is an answer, not a failed request
    assert not [k for k, v in before.items() if k[0] == "statestore_failures_total" and v]


async def test_ready_is_503_while_a_node_joins_a_loaded_ring(tmp_path: Path) -> None:
    a, ra = await start_node(node_config(tmp_path, "a", replicas=1, write_quorum=1))
    try:
        async with AsyncRingClient([a.address]) as ring:
            for p in range(24):  # ~1.5 MB of incompressible state
                rows = {b"k%d" % i: os.urandom(4096) for i in range(16)}
                await ring.commit(StoreId("q", 0, p, "s"), 1, rows, [], {}, epoch=1)
        # 0.25 MB/s: the join streams for seconds, while it is probed
        b, rb = await start_node(
            node_config(tmp_path, "b", seeds=[a.address], join=True, stream_mbps=0.25)
        )
        try:
            status, body = await call(b.address, "/v1/health/ready")
            assert status == 503, body
            assert body["state"] == "joining"
            assert any(r.startswith("ring state is joining") for r in body["reasons"]), body
            status, _ = await call(b.address, "/v1/health/live")
            assert status == 200
            status, health = await call(b.address, "/v1/health")
            assert status == 200 and health["state"] == "joining"
            body = await eventually_ready(b)  # the join finished: a normal member
            assert body["state"] == "normal"
            assert b.move is not None and b.move.handover.copied > 0  # it did stream
        finally:
            await stop_node(b, rb)
    finally:
        await stop_node(a, ra)


# -- metrics from the start ----------------------------------------------------------------
async def test_labelled_counters_and_process_metrics_are_exported_from_the_start(
    tmp_path: Path,
) -> None:
    node, runner = await start_node(node_config(tmp_path, "fresh"))
    try:
        samples = await scrape(node)  # the first request the node serves
    finally:
        await stop_node(node, runner)
    present = set(samples)

    def has(name: str, **labels: str) -> bool:
        return (name, tuple(sorted(labels.items()))) in present

    for status, code in KNOWN_ERRORS:
        family = "statestore_refusals_total" if status < 500 else "statestore_failures_total"
        assert has(family, status=str(status), code=code), (status, code)
        assert value(samples, family, status=str(status), code=code) == 0
    assert has("statestore_refusals_total", status="401", code="unauthenticated")
    assert has("statestore_failures_total", status="503", code="quorum_not_reached")
    for direction in ("in", "out"):
        assert has("statestore_http_bytes_total", direction=direction)
    for op in ("get", "put", "batch"):
        assert has("statestore_chunk_seconds_count", op=op)
    for path in ("state", "relay"):
        assert has("statestore_restore_seconds_count", path=path)
    for loop in ("gossip", "repair", "compaction", "join", "hints", "scrub", "tombstones"):
        assert has("statestore_loop_restarts_total", loop=loop), loop
        assert value(samples, "statestore_loop_restarts_total", loop=loop) == 0
    for event in ("repaired", "handed_off", "gc", "scrub_corrupt"):
        assert has("statestore_node_events_total", event=event)
    if sys.platform == "linux":  # prometheus_client reads /proc
        assert samples[("process_cpu_seconds_total", ())] > 0
        assert samples[("process_resident_memory_bytes", ())] > 0
        assert ("process_open_fds", ()) in present


# -- docker ------------------------------------------------------------------------------
def _compose_nodes() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "docker" / "docker-compose.yml").read_text())
    return {n: s for n, s in doc["services"].items() if "entrypoint" not in s}


async def test_the_compose_health_check_asks_ready_on_the_nodes_own_port(solo: Node) -> None:
    for svc in _compose_nodes().values():
        assert svc["healthcheck"]["test"] == ["CMD", "python3", "/opt/statestore/healthcheck.py"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "healthcheck.py" in dockerfile
    script = (ROOT / "docker" / "healthcheck.py").read_text()
    assert "/v1/health/ready" in script
    port = solo.address.rsplit(":", 1)[1]

    async def check() -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "docker" / "healthcheck.py"), port, stderr=subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, err.decode()

    assert await check() == (0, "")
    solo.config.min_free_bytes = 2**62  # degraded: the container turns unhealthy
    code, err = await check()
    assert code != 0 and "not ready (503)" in err and "disk nearly full" in err, err
    solo.config.min_free_bytes = 0
    assert (await check())[0] == 0
