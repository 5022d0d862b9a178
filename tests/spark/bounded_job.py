"""A streaming aggregation whose state is several times the driver's heap, run in its own JVM:
``python bounded_job.py SPEC.json`` (tests/spark/test_bounded_memory.py).

Spark in local mode (the driver is the executor) with a small heap (``heap``) runs
``groupBy(k).agg(count, max(payload))`` over CSV files, one per micro-batch: ``keys`` new
keys in each and every thousandth earlier key again (state grows batch by batch, as it does
in a real query; one huge first batch would exhaust Spark's own sort-based aggregation
before the state store). A payload is the batch number (4 digits), ``:``, and ``repeat``
times the SHA-256 of the key (hex), so each row of state holds about ``64 * repeat`` bytes.
Each batch's output is checked in ``foreachBatch`` against what it must be (count, max
payload) and a summary written to ``<base>/out/<provider>/batch-<id>.json``; the query's
progress goes to ``progress.jsonl`` and the heap size to ``jvm.json``. Spec keys: ``base``,
``seeds``, ``provider`` (``ring`` or ``hdfs``), ``heap``, ``keys``, ``repeat``,
``partitions``, ``conf``, ``jar`` (a provider jar to use instead of this tree's).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.spark.jvm import JVM_FLAGS  # noqa: E402

PROVIDERS = {
    "ring": "statestore.spark.RingStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


def revisits(keys: int, b: int) -> range:
    """The earlier keys batch ``b`` (1-based) touches again: every thousandth one."""
    return range(0, (b - 1) * keys, 1000)


def write_input(base: Path, keys: int, batches: range) -> Path:
    """CSV files (``id,b``), one per batch ``b``: ``keys`` new keys (``(b-1)*keys`` on) and
    the earlier keys of :func:`revisits`."""
    src = base / "input"
    src.mkdir(parents=True, exist_ok=True)
    start = time.time() - 3600
    for b in batches:
        path = src / f"b{b:03d}.csv"
        with open(path, "w") as f:
            f.write("".join(f"{i},{b}\n" for i in revisits(keys, b)))
            f.write("".join(f"{i},{b}\n" for i in range((b - 1) * keys, b * keys)))
        # Spark's file source takes files in modification-time order, and files written
        # within one clock tick of the file system (a few ms) tie: a batch once read b003
        # before b002 (CI). A second apart, in batch order.
        os.utime(path, (start + b, start + b))
    return src


def expect(keys: int, b: int) -> dict[str, int]:
    """What batch ``b`` must output: its keys' rows, their counts summed, nothing wrong."""
    again = revisits(keys, b)
    return {
        "rows": keys + len(again),
        "sum_n": keys + sum(b - k // keys for k in again),
        "bad_n": 0,
        "bad_p": 0,
    }


def main(spec_path: str) -> None:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    base = Path(spec["base"])
    provider = spec["provider"]
    keys, repeat = int(spec["keys"]), int(spec["repeat"])
    out = base / "out" / provider
    out.mkdir(parents=True, exist_ok=True)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_connector

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"bounded-{provider}")
        .config("spark.sql.shuffle.partitions", str(spec.get("partitions", 2)))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", spec["heap"])
        # Spark refuses a heap under 450 MiB unless its 300 MiB reserve is made smaller
        .config("spark.testing.reservedMemory", str(64 << 20))
        .config("spark.driver.extraJavaOptions", " ".join(JVM_FLAGS))
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "600s")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    )
    for k, v in spec.get("conf", {}).items():
        builder = builder.config(k, v)
    if provider == "ring":
        builder = spark_connector.configure(builder, seeds=spec["seeds"])
        if spec.get("jar"):  # another build of the provider (the test's control run)
            builder = builder.config("spark.jars", spec["jar"])
    spark = builder.getOrCreate()
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    max_heap = int(jvm.java.lang.Runtime.getRuntime().maxMemory())
    (out / "jvm.json").write_text(json.dumps({"maxMemory": max_heap}))

    def payload(k: Any, b: Any) -> Any:
        pad = F.lpad(b.cast("string"), 4, "0")
        return F.concat(pad, F.lit(":"), F.repeat(F.sha2(k.cast("string"), 256), repeat))

    rows = (
        spark.readStream.schema("id long, b int")
        .option("maxFilesPerTrigger", 1)
        .csv(str(base / "input"))
        .select(F.col("id").alias("k"), payload(F.col("id"), F.col("b")).alias("p"))
    )
    agg = rows.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.max("p").alias("p"))

    def check(df: Any, batch_id: int) -> None:
        b = batch_id + 1
        k = F.col("k")
        # a key is new in batch k // keys + 1 and in every batch after it that revisits it
        want_n = F.lit(b) - F.floor(k / keys)
        summary = df.agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum("n").alias("sum_n"),
            F.sum(F.when(F.col("n") != want_n, 1).otherwise(0)).alias("bad_n"),
            F.sum(F.when(F.col("p") != payload(F.col("k"), F.lit(b)), 1).otherwise(0)).alias(
                "bad_p"
            ),
            F.min("k").alias("min_k"),
            F.max("k").alias("max_k"),
        ).collect()[0]
        (out / f"batch-{batch_id}.json").write_text(json.dumps(summary.asDict()))

    query = (
        agg.writeStream.outputMode("update")
        .foreachBatch(check)
        .option("checkpointLocation", str(base / "ckpt" / provider))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if spec.get("prefetch"):
        # the ring provider's background prefetch (Prefetcher): wait for it to drain, then
        # say how many chunks of lazy versions' bases it merged
        prefetcher = jvm.statestore.spark.Prefetcher
        for _ in range(600):
            if prefetcher.idle():
                break
            time.sleep(0.2)
        (out / "prefetch.json").write_text(
            json.dumps({"idle": bool(prefetcher.idle()), "merged": int(prefetcher.merged())})
        )
    if provider == "ring":  # what the read-ahead (ReadAhead.scala) brought in this JVM
        ring_provider = jvm.statestore.spark.RingStateStoreProvider
        (out / "readahead.json").write_text(
            json.dumps(
                {
                    "keys": int(ring_provider.readAheadKeys()),
                    "lookups": int(ring_provider.readAheadLookups()),
                    "failed": int(ring_provider.readAheadFailed()),
                }
            )
        )
    with open(out / "progress.jsonl", "w") as f:
        for p in query.recentProgress:
            f.write(json.dumps(p["stateOperators"]) + "\n")
    spark.stop()
    (out / "done").write_text("ok")


if __name__ == "__main__":
    main(sys.argv[1])
