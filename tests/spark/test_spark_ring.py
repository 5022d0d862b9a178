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
from pathlib import Path

import pytest

import spark_connector
from statestore.cli.local import LocalRing
from tests.ringkit import FAST
from tests.spark.runs import (
    drop_partition_folders,
    event_rows,
    final_output,
    log_tail,
    run_job,
    write_inputs,
    write_rows,
)

ALL_OPS = ["agg", "dedup", "dedup_wm", "join", "session", "pandas"]


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
            write_rows(tmp_path / "input" / "events" / f"e{i}.json", event_rows(rng, 0, 50, n=10))
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
