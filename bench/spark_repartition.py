"""Repartitioning a stopped query's state: the ring's tool against Spark's own.

One JVM (``local[2]``, 3 GiB driver) runs a count by key over ``--rows`` distinct keys (one
Parquet file, one micro-batch, 4 shuffle partitions) twice: once on the ring provider (3
local nodes), once on Spark's RocksDB provider, each with its own checkpoint, so both hold
``--rows`` state rows. Then each round repartitions both checkpoints, to 8 partitions and back
to 4 on alternate rounds, the order of the two reversed every round:
``spark_connector.repartition`` (the ring) and ``spark._streamingCheckpointManager.repartition``
(Spark's own runner, RocksDB only). A first, unmeasured round warms the JIT. The median of
the per-round ratios ring / RocksDB is printed with its 25th-75th percentile spread, and the
state reader checks that each checkpoint still holds ``--rows`` rows at the end.

    .venv/bin/python bench/spark_repartition.py [--rows 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import local_ring, machine, median, paired_ratio  # noqa: E402

PROVIDERS = {
    "ring": "statestore.spark.RingStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def write_parquet(path: Path, n: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"key": np.arange(n, dtype=np.int64)}), path)


def fill(spark: Any, provider: str, source: Path, ckpt: Path) -> float:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    started = time.perf_counter()
    query = (
        spark.readStream.schema("key long")
        .parquet(str(source))
        .groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def repartition(spark: Any, provider: str, ckpt: Path, n: int) -> float:
    import spark_connector

    started = time.perf_counter()
    if provider == "ring":
        spark_connector.repartition(spark, str(ckpt), n)
    else:
        spark._streamingCheckpointManager.repartition(str(ckpt), n)
    return time.perf_counter() - started


def state_rows(spark: Any, ckpt: Path) -> int:
    return int(spark.read.format("statestore").load(str(ckpt)).count())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_connector

    print(machine())
    with local_ring(3) as ring, tempfile.TemporaryDirectory(prefix="bench-repart-") as tmp:
        base = Path(tmp)
        write_parquet(base / "input" / "keys.parquet", args.rows)
        builder = (
            SparkSession.builder.master("local[2]")
            .appName("bench-spark-repartition")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "3g")
        )
        spark = spark_connector.configure(builder, seeds=ring.seeds).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        ckpt = {name: base / "ckpt" / name for name in PROVIDERS}
        for name in PROVIDERS:
            took = fill(spark, name, base / "input", ckpt[name])
            print(f"{name}: {args.rows:,} state rows written in {took:.1f}s", flush=True)

        times: dict[str, list[float]] = {name: [] for name in PROVIDERS}
        count = 4
        for rnd in range(args.rounds + 1):
            count = 8 if count == 4 else 4
            order = list(PROVIDERS) if rnd % 2 == 0 else list(reversed(PROVIDERS))
            took = {name: repartition(spark, name, ckpt[name], count) for name in order}
            label = "warm-up" if rnd == 0 else f"round {rnd}"
            print(
                f"{label}: to {count} partitions: "
                + ", ".join(f"{name} {took[name]:.2f}s" for name in PROVIDERS)
                + f" (ring / rocksdb {took['ring'] / took['rocksdb']:.2f}x)",
                flush=True,
            )
            if rnd > 0:
                for name in PROVIDERS:
                    times[name].append(took[name])
        for name in PROVIDERS:
            rows = state_rows(spark, ckpt[name])
            assert rows == args.rows, f"{name}: {rows} state rows after repartitioning"
        spark.stop()
    mid, lo, hi = paired_ratio(times["ring"], times["rocksdb"])
    print(
        f"\nrepartition of {args.rows:,} state rows, {args.rounds} rounds: ring median "
        f"{median(times['ring']):.2f}s, RocksDB (Spark's runner) median "
        f"{median(times['rocksdb']):.2f}s; ring / RocksDB median {mid:.2f}x the time "
        f"(25th-75th percentile {lo:.2f}x-{hi:.2f}x); goal <= 1.0x: "
        f"{'met' if mid <= 1.0 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
