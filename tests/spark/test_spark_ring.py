"""The ring provider under real Spark (local[2]) against real nodes (LocalRing, port 0).

Each stateful query runs once on the ring and once on Spark's HDFS-backed provider, in two
JVMs: batches, stop, every partition folder of the ring's checkpoints deleted, new input,
restart in a fresh JVM. The final outputs must match. A node is killed mid-stream; a driver
is killed inside a batch after its state commit.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import spark_connector
from statestore.cli.local import LocalRing
from tests.conftest import FAST

JOBS = Path(__file__).with_name("jobs.py")
T0 = datetime(2024, 1, 1)
ALL_OPS = ["agg", "dedup", "dedup_wm", "join", "session", "pandas"]
LAST_PER_KEY = {"agg": "user", "pandas": "user"}


def _ts(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _events(rng: random.Random, lo: int, hi: int, n: int = 24) -> list[dict[str, Any]]:
    ids = [rng.randrange(lo, hi) for _ in range(n)]
    return [
        {"user": f"u{(i * 7 + rng.randrange(2)) % 5}", "id": i, "ts": _ts(i * 0.5), "v": i % 9 + 1}
        for i in ids
    ]


def _side(prefix: str, ids: list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "ts": _ts(i), "x": f"{prefix}{i}"} for i in ids]


def write_inputs(base: Path, phase: int) -> list[dict[str, Any]]:
    """Two files per source and phase (one micro-batch each); returns the events written."""
    rng = random.Random(phase)
    inp = base / "input"
    if phase == 1:
        files = {"f0": _events(rng, 0, 60), "f1": _events(rng, 40, 120)}
        left = {"l0": list(range(0, 30)), "l1": list(range(30, 60))}
        right = {"r0": list(range(10, 20))}
    elif phase == 2:
        files = {"f2": _events(rng, 100, 180), "f3": _events(rng, 300, 400)}
        left = {"l2": list(range(60, 70))}
        right = {"r1": [*range(0, 10), *range(40, 50)], "r2": [*range(60, 65), *range(20, 26)]}
    elif phase == 3:
        files = {"f4": _events(rng, 150, 350), "f5": _events(rng, 380, 460)}
        left = {"l3": list(range(70, 90))}
        right = {"r3": [*range(26, 30), *range(66, 80)]}
    else:
        files = {"f6": _events(rng, 440, 520)}
        left = {"l4": list(range(90, 95))}
        right = {"r4": [*range(84, 96)]}
    for name, rows in files.items():
        _write(inp / "events" / f"{name}.json", rows)
    for name, ids in left.items():
        _write(inp / "left" / f"{name}.json", _side("l", ids))
    for name, ids in right.items():
        _write(inp / "right" / f"{name}.json", _side("r", ids))
    return [r for rows in files.values() for r in rows]


def run_job(base: Path, spec: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
    spec_path = base / f"{name}.json"
    spec_path.write_text(json.dumps({"base": str(base), **spec}))
    with open(base / f"{name}.log", "w") as log:
        done = subprocess.run(
            [sys.executable, str(JOBS), str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1200,
            check=False,
        )
    return done


def log_tail(base: Path, name: str) -> str:
    return (base / f"{name}.log").read_text(errors="replace")[-6000:]


def final_output(base: Path, provider: str, op: str) -> Any:
    out = base / "out" / provider / op
    batches = sorted(out.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    assert batches, f"{provider}/{op} wrote no batch"
    if op in LAST_PER_KEY:
        key = LAST_PER_KEY[op]
        last: dict[str, Any] = {}
        for b in batches:
            for row in json.loads(b.read_text()):
                last[row[key]] = row
        return last
    rows = [json.dumps(r, sort_keys=True) for b in batches for r in json.loads(b.read_text())]
    return sorted(rows)


def drop_partition_folders(ckpt: Path) -> int:
    """Delete state/<op>/<partition> (keep state/<op>/_metadata): all the provider could
    have left on local disk. Returns how many folders went."""
    gone = 0
    for op_dir in (ckpt / "state").iterdir():
        for part in op_dir.iterdir():
            if part.name.isdigit():
                shutil.rmtree(part)
                gone += 1
    return gone


def ring_metrics(base: Path, op: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for line in (base / "out" / "ring" / op / "progress.jsonl").read_text().splitlines():
        for operator in json.loads(line):
            for k, v in operator.get("customMetrics", {}).items():
                if k.startswith("ring"):
                    totals[k] = totals.get(k, 0) + int(v)
    return totals


@pytest.mark.timeout(1800)
def test_operators_restore_from_ring_after_restart(tmp_path: Path, ring3: LocalRing) -> None:
    seeds = [p.address for p in ring3.procs]
    victim = ring3.procs[2]
    assert victim.proc is not None
    events = write_inputs(tmp_path, 1)
    spec = {"seeds": seeds, "providers": ["ring", "hdfs"], "operators": ALL_OPS}
    kill = {"op": "agg", "provider": "ring", "after_batch": 0, "pid": victim.proc.pid}
    done = run_job(tmp_path, {**spec, "kill": kill}, "phase1")
    assert done.returncode == 0, log_tail(tmp_path, "phase1")
    assert not victim.alive, "the node was to be killed mid-stream"

    for op in ALL_OPS:
        assert drop_partition_folders(tmp_path / "ckpt" / "ring" / op) > 0
    events += write_inputs(tmp_path, 2)
    done = run_job(tmp_path, spec, "phase2")
    assert done.returncode == 0, log_tail(tmp_path, "phase2")

    for op in ALL_OPS:
        ring_out = final_output(tmp_path, "ring", op)
        assert ring_out == final_output(tmp_path, "hdfs", op), op
        assert ring_out, f"{op} produced no rows"
    counts: dict[str, int] = {}
    for e in events:
        counts[e["user"]] = counts.get(e["user"], 0) + 1
    agg = final_output(tmp_path, "ring", "agg")
    assert {u: row["n"] for u, row in agg.items()} == counts
    metrics = ring_metrics(tmp_path, "agg")
    assert metrics["ringCacheMissCount"] > 0 and metrics["ringRestoredRows"] > 0
    assert metrics["ringCacheHitCount"] > 0 and metrics["ringBytesCommitted"] > 0
    # one head read per task: the aggregation's write store uses its read store's
    loads = metrics["ringCacheHitCount"] + metrics["ringCacheMissCount"]
    assert metrics["ringHeadReads"] == loads, metrics


@pytest.mark.timeout(1200)
def test_driver_killed_mid_batch_resumes_identically(tmp_path: Path, ring3: LocalRing) -> None:
    seeds = ring3.seeds
    write_inputs(tmp_path, 1)
    write_inputs(tmp_path, 2)
    ops = ["agg", "session"]
    die = {"op": "agg", "provider": "ring", "batch": 2}
    done = run_job(
        tmp_path, {"seeds": seeds, "providers": ["ring"], "operators": ops, "die": die}, "killed"
    )
    assert done.returncode == -9, log_tail(tmp_path, "killed")
    assert not (tmp_path / "out" / "ring" / "agg" / "batch-2.json").exists()

    spec = {"seeds": seeds, "providers": ["ring", "hdfs"], "operators": ops}
    done = run_job(tmp_path, spec, "resumed")
    assert done.returncode == 0, log_tail(tmp_path, "resumed")
    for op in ops:
        assert final_output(tmp_path, "ring", op) == final_output(tmp_path, "hdfs", op), op


@pytest.mark.timeout(1200)
def test_checkpoint_deleted_and_restarted_at_same_path_starts_fresh(tmp_path: Path) -> None:
    # retention of 3 versions: after 8 batches the old run's floor is well past version 1
    args = [*FAST, "--retain", "3", "--snapshot-every", "2"]
    ring = LocalRing(str(tmp_path / "ring"), 3, args=args).start()
    try:
        rng = random.Random(7)
        for i in range(8):
            _write(tmp_path / "input" / "events" / f"e{i}.json", _events(rng, 0, 50, n=10))
        spec = {"seeds": ring.seeds, "providers": ["ring"], "operators": ["agg", "dedup"]}
        done = run_job(tmp_path, spec, "first")
        assert done.returncode == 0, log_tail(tmp_path, "first")
        first = {op: final_output(tmp_path, "ring", op) for op in ("agg", "dedup")}
        shutil.rmtree(tmp_path / "ckpt")
        shutil.rmtree(tmp_path / "out")
        done = run_job(tmp_path, spec, "second")
        assert done.returncode == 0, log_tail(tmp_path, "second")
        for op in ("agg", "dedup"):
            assert final_output(tmp_path, "ring", op) == first[op], op
    finally:
        ring.stop()


def test_configure_sets_provider_and_ring_options() -> None:
    from pyspark.sql import SparkSession

    builder = spark_connector.configure(
        SparkSession.builder, seeds=["127.0.0.1:1"], snapshot_interval=5, check=False
    )
    opts: dict[str, str] = builder._options
    assert opts["spark.sql.streaming.stateStore.providerClass"] == spark_connector.PROVIDER_CLASS
    assert opts["spark.jars"].endswith("statestore-spark.jar")
    assert Path(opts["spark.jars"]).is_file()
    assert opts["spark.statestore.seeds"] == "127.0.0.1:1"
    assert opts["spark.statestore.snapshotInterval"] == "5"
    assert opts["spark.hadoop.fs.ring.impl"] == spark_connector.RING_FS_CLASS  # ring:// paths


def test_configure_unreachable_seeds_is_a_clear_error() -> None:
    from pyspark.sql import SparkSession

    with pytest.raises(spark_connector.SparkConnectorError, match="no ring seed answered"):
        spark_connector.configure(SparkSession.builder, seeds=["127.0.0.1:1"])
    with pytest.raises(spark_connector.SparkConnectorError, match="not HOST:PORT"):
        spark_connector.configure(SparkSession.builder, seeds=["localhost"], check=False)
    with pytest.raises(spark_connector.SparkConnectorError, match="at least one"):
        spark_connector.configure(SparkSession.builder, seeds=[], check=False)


def test_spark_jar_prints_the_jar(capsys: pytest.CaptureFixture[str]) -> None:
    assert spark_connector.main([]) == 0
    path = capsys.readouterr().out.strip()
    assert path.endswith(".jar") and Path(path).is_file()
