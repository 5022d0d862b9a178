"""Spark's RocksDB provider with its checkpoint on the ring (``ring://``) against the same on
local disk.

A streaming count by key, ``local[2]``, 8 shuffle partitions: ``--rows`` rows over ``--keys``
keys in 4 micro-batches (4 Parquet files, one per batch). Throughput: one JVM runs the query
``--rounds`` times per checkpoint kind, alternated (the order reversed every round, after a
warm-up run of each), each round into fresh checkpoints; the per-round ratio local time / ring
time is the ring's relative throughput. Restart: one more Parquet file (a small batch) is
added, and each round's checkpoints are restarted in a fresh JVM with an empty Spark local
dir (RocksDB has no working copy: it loads the state from the checkpoint), alternated the same
way; the time from the query's start to the end of its batch is compared, ring / local. 3 local
ring nodes; medians of the per-round ratios with their 25th-75th percentile spread.

    .venv/bin/python bench/spark_checkpoint_fs.py [--rows 1000000] [--keys 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import local_ring, machine, paired_ratio  # noqa: E402
from spark_state import write_parquet  # noqa: E402

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
KINDS = ("local", "ring")


def checkpoint(spec: dict[str, Any], kind: str, rnd: int) -> str:
    if kind == "ring":
        return f"ring://{spec['fs']}/ckpt-{rnd}"
    return str(Path(spec["base"]) / f"ckpt-{rnd}")


def run_query(spark: Any, source: str, ckpt: str) -> float:
    df = spark.readStream.schema("key long, v long").option("maxFilesPerTrigger", 1).parquet(source)
    started = time.perf_counter()
    q = (
        df.groupBy("key")
        .count()
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return time.perf_counter() - started


def worker(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession

    import spark_connector

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-checkpoint-fs")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.local.dir", spec["local_dir"])
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    )
    spark = spark_connector.configure(builder, seeds=spec["seeds"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    base = Path(spec["base"])
    out: dict[str, Any] = {}
    if spec["mode"] == "throughput":
        for kind in KINDS:  # warm-up: class loading, codegen, JIT
            run_query(spark, str(base / "warm"), checkpoint(spec, kind, -1))
        for kind in KINDS:
            out[kind] = []
        for rnd in range(spec["rounds"]):
            order = KINDS if rnd % 2 == 0 else KINDS[::-1]
            for kind in order:
                t = run_query(spark, str(base / "input"), checkpoint(spec, kind, rnd))
                out[kind].append(t)
                print(f"  round {rnd} {kind}: {t:.1f} s", file=sys.stderr, flush=True)
    else:
        out["t"] = run_query(
            spark, str(base / "input"), checkpoint(spec, spec["kind"], spec["round"])
        )
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


def call(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    shutil.rmtree(spec["local_dir"], ignore_errors=True)
    os.makedirs(spec["local_dir"])
    with open(log, "a") as f:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
            check=False,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    if done.returncode != 0:
        raise SystemExit(f"worker failed ({spec['mode']}); see {log}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    print(machine())
    with local_ring(3) as ring, tempfile.TemporaryDirectory(prefix="bench-ckptfs-") as tmp:
        base = Path(tmp)
        for i in range(4):
            write_parquet(base / "input" / f"part-{i}.parquet", args.rows // 4, args.keys, i)
        write_parquet(base / "warm" / "part-0.parquet", args.rows // 4, args.keys, 99)
        spec: dict[str, Any] = {
            "base": str(base),
            "seeds": ring.seeds,
            "fs": "bench-" + uuid.uuid4().hex[:8],
            "rounds": args.rounds,
            "local_dir": str(base / "spark-local"),
        }
        log = base / "workers.log"
        got = call({**spec, "mode": "throughput"}, log)
        write_parquet(base / "input" / "part-9.parquet", 10_000, args.keys, 9)
        restart: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for rnd in range(args.rounds):
            for kind in KINDS if rnd % 2 == 0 else KINDS[::-1]:
                took = call({**spec, "mode": "restart", "kind": kind, "round": rnd}, log)["t"]
                restart[kind].append(took)
                print(f"restart round {rnd} {kind}: {took:.1f} s", flush=True)
        if os.environ.get("BENCH_KEEP_LOG"):
            shutil.copy(log, os.environ["BENCH_KEEP_LOG"])
    local_t, ring_t = got["local"], got["ring"]
    for rnd in range(args.rounds):
        print(f"throughput round {rnd}: local {local_t[rnd]:.1f} s, ring {ring_t[rnd]:.1f} s")
    mid, lo, hi = paired_ratio(local_t, ring_t)
    print(
        f"\nthroughput, {args.rows:,} rows over {args.keys:,} keys in 4 batches, {args.rounds} "
        f"rounds: ring:// / local median {mid:.2f}x the throughput (25th-75th percentile "
        f"{lo:.2f}x-{hi:.2f}x; goal >= 0.9x: {'met' if mid >= 0.9 else 'NOT met'})"
    )
    mid, lo, hi = paired_ratio(restart["ring"], restart["local"])
    print(
        f"restart (fresh JVM, empty local dir, one small batch), {args.rounds} rounds: ring:// "
        f"/ local median {mid:.2f}x the time (25th-75th percentile {lo:.2f}x-{hi:.2f}x; goal "
        f"<= 1.1x: {'met' if mid <= 1.1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
