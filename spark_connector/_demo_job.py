"""One run of the Spark demo's query, in its own JVM: ``python -m spark_connector._demo_job``.

Windowed counts per sensor over the JSON files in ``<base>/events`` (one file per
micro-batch), state on the ring. Writes each batch's rows and the ring metrics of the run to
``<base>/out``. Argument: a JSON spec ``{"base": dir, "seeds": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def run(base: Path, seeds: list[str]) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from . import configure

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("statestore-spark-demo")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
    )
    spark = configure(builder, seeds=seeds).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out = base / "out"
    out.mkdir(parents=True, exist_ok=True)

    def sink(df: Any, batch_id: int) -> None:
        rows = [
            {"window": str(r["window"]["start"]), "sensor": r["sensor"], "n": r["n"]}
            for r in df.collect()
        ]
        (out / f"batch-{batch_id}.json").write_text(json.dumps(rows))

    events = (
        spark.readStream.schema("sensor string, ts timestamp, value double")
        .option("maxFilesPerTrigger", 1)
        .json(str(base / "events"))
    )
    counts = (
        events.withWatermark("ts", "1 hour")
        .groupBy(F.window("ts", "10 seconds"), "sensor")
        .agg(F.count("*").alias("n"))
    )
    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", str(base / "checkpoint"))
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    metrics: dict[str, int] = {}
    for progress in query.recentProgress:
        for op in progress.get("stateOperators", []):
            for k, v in op.get("customMetrics", {}).items():
                if k.startswith("ring"):
                    metrics[k] = metrics.get(k, 0) + int(v)
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(metrics) + "\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spec = json.loads(sys.argv[1])
    raise SystemExit(run(Path(spec["base"]), list(spec["seeds"])))
