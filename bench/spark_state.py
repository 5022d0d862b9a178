"""Spark state providers compared: the ring (direct and coordinator data paths), Spark's
HDFS-backed provider, optionally RocksDB.

A streaming count by key, ``local[2]``: 2,000,000 rows over 200,000 keys in 4 micro-batches
(4 Parquet files, one per batch), 8 shuffle partitions, then 200. The providers run
alternated in one JVM, after a warm-up round of one batch of the same size per provider (a
smaller warm-up left the JIT compiling Spark's and the provider's hot paths during the first
measured run, whoever ran first: up to 5x slower than the same provider later in the same
JVM); with ``--rounds N`` each provider runs N times, the order reversed every round, and
its median time is reported. Then each is restarted in a new JVM that restores its state
and runs one small batch. Ratios are against HDFS-backed.
``ring`` is the provider's default data path (``spark.statestore.dataPath=direct``: the JVM
writes and reads chunks itself), ``ring-coord`` the coordinator path (a node chunks and
replicates framed rows). For the ring, the nodes' CPU seconds (``/proc/<pid>/stat``,
user + system, all nodes) per MiB committed (``ringBytesCommitted``: framed row bytes, the
same measure on both paths) are read around each throughput run.

    .venv/bin/python bench/spark_state.py [--rows 2000000] [--keys 200000] [--partitions 8,200]
        [--providers ring,ring-coord,hdfs[,rocksdb]] [--rounds 1] [--payload 0] [--memory 3g]

``--payload N`` gives every input row an N-letter string and makes the query keep each key's
count and largest string, so the state holds ~N bytes per key (the restart cell at ~1 GiB of
state: ``--rows 5400000 --keys 2700000 --payload 400 --partitions 200 --memory 14g``).
``--trace --keep``: the provider's own timings (each partition's head read, restore and
commit) in the kept work dir's ``spark.log``.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

PROVIDERS = {
    "ring": "statestore.spark.RingStateStoreProvider",
    "ring-coord": "statestore.spark.RingStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def write_parquet(path: Path, n: int, keys: int, seed: int, payload: int = 0) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    columns = {"key": rng.integers(0, keys, n, dtype=np.int64), "v": rng.integers(0, 100, n)}
    if payload:  # a string of `payload` letters per row (incompressible enough: 26 letters)
        letters = rng.integers(97, 123, n * payload, dtype=np.uint8)
        offsets = np.arange(0, n * payload + 1, payload, dtype=np.int64)
        columns["p"] = pa.LargeStringArray.from_buffers(
            n, pa.py_buffer(offsets), pa.py_buffer(letters)
        ).cast(pa.string())
    table = pa.table(columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


# -- the JVM side --------------------------------------------------------------------------
def session(spec: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    import spark_connector

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-state")
        .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", spec.get("memory", "3g"))
    )
    if spec.get("trace"):  # the provider's timings on the worker's stderr (spark.log)
        builder = builder.config("spark.driver.extraJavaOptions", "-Dstatestore.trace=true")
    spark = spark_connector.configure(builder, seeds=spec["seeds"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("bench.payload", str(spec.get("payload", 0)))
    return spark


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (``/proc/<pid>/stat``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / tick


def committed_bytes(query: Any) -> int:
    """``ringBytesCommitted`` summed over the query's progress reports."""
    total = 0
    for p in query.recentProgress:
        obj = json.loads(p.json) if hasattr(p, "json") else p
        for op in obj.get("stateOperators", []):
            total += int(op.get("customMetrics", {}).get("ringBytesCommitted", 0))
    return total


def run_query(
    spark: Any, provider: str, source: str, ckpt: str, stats: dict[str, float] | None = None
) -> float:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    path = "coordinator" if provider == "ring-coord" else "direct"
    spark.conf.set("spark.statestore.dataPath", path)
    from pyspark.sql import functions as F

    wide = bool(spark.conf.get("bench.payload", "0") != "0")
    schema = "key long, v long, p string" if wide else "key long, v long"
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
    started = time.perf_counter()
    counted = (
        df.groupBy("key").agg(F.count("*").alias("count"), F.max("p").alias("p"))
        if wide  # the state keeps each key's largest payload: payload bytes per key
        else df.groupBy("key").count()
    )
    q = (
        counted.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    elapsed = time.perf_counter() - started
    if stats is not None:
        stats["committed"] = committed_bytes(q)
    return elapsed


def worker(spec: dict[str, Any]) -> None:
    spark = session(spec)
    base = Path(spec["base"])
    out: dict[str, Any] = {}
    if spec["mode"] == "throughput":
        for provider in spec["order"]:  # warm-up round: class loading, codegen, JIT
            run_query(spark, provider, str(base / "warm"), str(base / "ckpt-warm" / provider))
        runs: dict[str, list[tuple[float, float, float]]] = {p: [] for p in spec["order"]}
        for r in range(spec.get("rounds", 1)):
            order = spec["order"] if r % 2 == 0 else spec["order"][::-1]
            for provider in order:
                ckpt = base / f"ckpt-{spec['partitions']}-{r}" / provider
                cpu0 = cpu_seconds(spec["pids"])
                stats: dict[str, float] = {}
                t = run_query(spark, provider, str(base / "input"), str(ckpt), stats)
                runs[provider].append((t, cpu_seconds(spec["pids"]) - cpu0, stats["committed"]))
                print(f"  {provider}: {t:.1f} s", file=sys.stderr, flush=True)
        for provider, got in runs.items():
            t, cpu, committed = sorted(got)[(len(got) - 1) // 2]  # the median run (lower)
            out[provider] = t
            out[f"{provider}:cpu"] = cpu
            out[f"{provider}:committed"] = committed
            out[f"{provider}:all"] = [g[0] for g in got]
    else:
        provider = spec["provider"]
        ckpt = base / f"ckpt-{spec['partitions']}-0" / provider
        out[provider] = run_query(spark, provider, str(base / "input"), str(ckpt))
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


def call(spec: dict[str, Any], log: Path) -> tuple[dict[str, float], float]:
    started = time.perf_counter()
    with open(log, "a") as f:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
            check=False,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"worker failed ({spec['mode']}); see {log}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :]), wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--partitions", default="8,200")
    p.add_argument(
        "--providers",
        default="ring,ring-coord,hdfs",
        help="comma-separated, from " + ",".join(PROVIDERS) + " (hdfs is always run)",
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="throughput runs per provider (median reported)"
    )
    p.add_argument(
        "--payload",
        type=int,
        default=0,
        help="bytes of a string column kept per key in the state (max per key); 0: count only",
    )
    p.add_argument("--memory", default="3g", help="the Spark driver's memory (local mode)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--trace",
        action="store_true",
        help="the provider's per-partition timings (-Dstatestore.trace=true) into the work "
        "dir's spark.log (with --keep)",
    )
    args = p.parse_args()

    from _common import local_ring, machine, table

    print(machine())
    work = Path(tempfile.mkdtemp(prefix="statestore-bench-spark-"))
    log = work / "spark.log"
    batch = args.rows // 4
    for i in range(4):
        write_parquet(work / "input" / f"part-{i}.parquet", batch, args.keys, i, args.payload)
    write_parquet(work / "warm" / "part-0.parquet", batch, args.keys, 99, args.payload)
    results = []
    try:
        with local_ring(3) as ring:
            seeds = ring.seeds
            chosen = [x for x in args.providers.split(",") if x]
            unknown = [x for x in chosen if x not in PROVIDERS]
            if unknown:
                raise SystemExit(f"unknown provider(s) {unknown}: choose from {list(PROVIDERS)}")
            if "hdfs" not in chosen:
                chosen.append("hdfs")
            orders = [chosen, chosen[::-1]]
            pids = [p.proc.pid for p in ring.procs if p.proc is not None]
            # the nodes' own background (gossip, repair, compaction) while nothing commits
            idle0 = cpu_seconds(pids)
            time.sleep(10)
            idle_rate = (cpu_seconds(pids) - idle0) / 10
            print(f"nodes idle: {idle_rate:.3f} CPU s per s (all nodes)", flush=True)
            parts = [int(x) for x in args.partitions.split(",")]
            for n, partitions in enumerate(parts):
                shutil.rmtree(work / "input" / "part-4.parquet", ignore_errors=True)
                (work / "input" / "part-4.parquet").unlink(missing_ok=True)
                spec = {
                    "base": str(work),
                    "seeds": seeds,
                    "partitions": partitions,
                    "mode": "throughput",
                    "order": orders[n % 2],
                    "pids": pids,
                    "rounds": args.rounds,
                    "payload": args.payload,
                    "memory": args.memory,
                    "trace": args.trace,
                }
                print(f"{partitions} partitions: throughput, order {spec['order']} ...", flush=True)
                times, _ = call(spec, log)
                print(
                    f"{partitions} partitions: runs (s) "
                    + ", ".join(f"{p} {times[p + ':all']}" for p in chosen)
                    + f"; load average {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                # one small new batch for every provider's restart
                write_parquet(work / "input" / "part-4.parquet", 1_000, args.keys, 4, args.payload)
                restart: dict[str, tuple[float, float]] = {}
                for provider in orders[n % 2]:
                    print(f"{partitions} partitions: restart {provider} ...", flush=True)
                    spec_r = {**spec, "mode": "restart", "provider": provider}
                    q, wall = call(spec_r, log)
                    restart[provider] = (q[provider], wall)
                for provider in chosen:
                    rate = args.rows / times[provider]
                    base_rate = args.rows / times["hdfs"]
                    rq, rw = restart[provider]
                    hq, hw = restart["hdfs"]
                    mib = float(times.get(f"{provider}:committed", 0)) / (1 << 20)
                    # net of the nodes' idle background over the run's duration
                    cpu = float(times.get(f"{provider}:cpu", 0)) - idle_rate * times[provider]
                    per_mib = f"{cpu / mib:.3f}" if provider.startswith("ring") and mib else "-"
                    results.append(
                        [
                            provider,
                            partitions,
                            f"{rate:,.0f}",
                            f"{rate / base_rate:.2f}x",
                            f"{rq:.1f}",
                            f"{rq / hq:.2f}x",
                            f"{rw:.1f}",
                            f"{rw / hw:.2f}x",
                            per_mib,
                            f"{mib:,.1f}" if mib else "-",
                        ]
                    )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(
        table(
            [
                "provider",
                "partitions",
                "rows/s",
                "vs HDFS",
                "restart query s",
                "vs HDFS",
                "restart incl. JVM s",
                "vs HDFS",
                "node CPU s/MiB (net of idle)",
                "MiB committed",
            ],
            results,
        )
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
    else:
        main()
