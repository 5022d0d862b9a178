"""Spark's state tools on each provider, in one JVM: ``python reader_job.py SPEC.json``.

Runs every operator of the spec once per provider (the queries of ``jobs.py``: JSON files,
one file per micro-batch, ``trigger(availableNow=True)``), then reads each query's state with
``spark.read.format("statestore")`` and ``format("state-metadata")`` under every read of the
spec, and writes ``<base>/out/<provider>/reads.json``: read name -> ``{"rows": [...]}`` (each
row as sorted JSON, the list sorted; a change feed's rows also as ``"ordered"``, in the order
Spark gave them) or ``{"error": {"conditions", "root", "message"}}``.

Spec keys: ``base``, ``seeds``, ``providers``, ``operators``, ``partitions``, ``confs`` (extra
session confs), ``variants``: more runs, name -> ``{"provider", "confs", "operators"}`` (a
provider under other session confs, its reads only of those operators), ``reads``: a list
of ``{"name", "op", "format", "options"}`` where an option value ``"$snapshot_batch"`` /
``"$snapshot_partition"`` stands for a batch and partition at which the HDFS-backed provider
wrote a snapshot file of that operator (the job waits for its maintenance to write one), and
``"$no_snapshot_batch"`` for a batch at which it wrote none.
The batch and partition chosen go to ``<base>/out/snapshots.json``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.spark.jobs import OPERATORS, PROVIDERS, build  # noqa: E402
from tests.spark.jvm import JVM_FLAGS  # noqa: E402


def run_queries(spark: Any, base: Path, spec: dict[str, Any]) -> list[str]:
    """Run the spec's queries, each provider's into ``<base>/ckpt/<provider>/<op>``; returns
    the providers' names."""
    runs = [(p, PROVIDERS[p], {}, spec["operators"]) for p in spec["providers"]]
    for name, extra in spec.get("variants", {}).items():
        runs.append((name, PROVIDERS[extra["provider"]], extra["confs"], extra["operators"]))
    for name, cls, confs, operators in runs:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", cls)
        for k, v in confs.items():
            spark.conf.set(k, v)
        for op in operators:
            query = (
                build(spark, op, base)
                .writeStream.outputMode(OPERATORS[op])
                .option("checkpointLocation", str(base / "ckpt" / name / op))
                .format("noop")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            print(f"{name}/{op}: batch {(query.lastProgress or {}).get('batchId')}", flush=True)
        for k in confs:
            spark.conf.unset(k)
    return [name for name, *_ in runs]


SNAPSHOT = re.compile(r"^(\d+)\.snapshot$")


def hdfs_snapshots(ckpt: Path) -> dict[int, set[int]]:
    """Partition -> versions with a snapshot file, for operator 0's default store."""
    out: dict[int, set[int]] = {}
    op_dir = ckpt / "state" / "0"
    for part in op_dir.iterdir() if op_dir.is_dir() else []:
        if part.name.isdigit():
            for f in part.iterdir():
                m = SNAPSHOT.match(f.name)
                if m:
                    out.setdefault(int(part.name), set()).add(int(m.group(1)))
    return out


def snapshot_choice(base: Path, op: str, held: set[int], timeout: float = 120.0) -> dict[str, int]:
    """A partition and batch with an HDFS snapshot file (the lowest version found), and a batch
    of the same partition without one; waits for the maintenance thread to write one.

    Only partitions in ``held`` (those whose state has rows) are chosen: the maintenance
    thread snapshots an empty partition too (five users over four partitions leave one
    empty), and a read of an empty partition would compare two empty answers."""
    ckpt = base / "ckpt" / "hdfs" / op
    deadline = time.monotonic() + timeout
    while True:
        snaps = {p: vs for p, vs in hdfs_snapshots(ckpt).items() if p in held}
        if snaps or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not snaps:
        raise RuntimeError(
            f"the HDFS-backed provider wrote no snapshot file of a partition of {op} with rows"
        )
    part, version = min(((p, min(vs)) for p, vs in snaps.items()), key=lambda pv: pv[1])
    missing = [v for v in range(1, version) if v not in snaps[part]]
    return {
        "$snapshot_partition": part,
        "$snapshot_batch": version - 1,
        "$no_snapshot_batch": (missing[0] - 1) if missing else -1,
    }


def collect(df: Any) -> list[str]:
    """Each row as sorted JSON, in the order Spark gave them (partition by partition, each
    partition's rows in the order its reader produced them)."""
    return [json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in df.collect()]


def error_of(e: Exception, ckpt: Path) -> dict[str, Any]:
    """What a failed read says, without what differs by provider (the checkpoint's path):
    every Spark error condition on the way from the top error to its root cause, and the
    root cause's class and first line."""
    conditions: list[str] = []
    root_class, root_message = type(e).__name__, str(e)
    cond = getattr(e, "getCondition", None)
    if callable(cond) and cond():
        conditions.append(cond())
    java = getattr(e, "java_exception", None)
    while java is not None:
        try:
            c = java.getCondition()
        except Exception:  # not a SparkThrowable
            c = None
        if c and c not in conditions:
            conditions.append(c)
        root_class, root_message = java.getClass().getName(), str(java.getMessage())
        java = java.getCause()
    first = root_message.splitlines()[0] if root_message else ""
    for path in (str(ckpt), "file:" + str(ckpt)):
        first = first.replace(path, "<checkpoint>")
    return {"conditions": conditions, "root": root_class, "message": first[:2000]}


def run(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession

    import spark_connector

    base = Path(spec["base"])
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("statestore-reader-tests")
        .config("spark.sql.shuffle.partitions", str(spec.get("partitions", 4)))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", " ".join(JVM_FLAGS))
    )
    for k, v in spec.get("confs", {}).items():
        builder = builder.config(k, v)
    spark = spark_connector.configure(builder, seeds=spec["seeds"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    providers = run_queries(spark, base, spec)

    choices: dict[str, dict[str, int]] = {}
    for read in spec["reads"]:
        if any(str(v).startswith("$") for v in read.get("options", {}).values()):
            if read["op"] not in choices:
                ckpt = base / "ckpt" / "hdfs" / read["op"]
                rows = collect(spark.read.format("statestore").load(str(ckpt)))
                held = {int(json.loads(r)["partition_id"]) for r in rows}
                choices[read["op"]] = snapshot_choice(base, read["op"], held)
    (base / "out").mkdir(parents=True, exist_ok=True)
    (base / "out" / "snapshots.json").write_text(json.dumps(choices))

    for provider in providers:
        results: dict[str, Any] = {}
        for read in spec["reads"]:
            if not (base / "ckpt" / provider / read["op"]).is_dir():
                continue
            options = {
                k: str(choices[read["op"]][v]) if str(v).startswith("$") else str(v)
                for k, v in read.get("options", {}).items()
            }
            reader = spark.read.format(read.get("format", "statestore"))
            for k, v in options.items():
                reader = reader.option(k, v)
            try:
                rows = collect(reader.load(str(base / "ckpt" / provider / read["op"])))
                results[read["name"]] = {"rows": sorted(rows)}
                if options.get("readChangeFeed") == "true":
                    results[read["name"]]["ordered"] = rows
            except Exception as e:  # the error is the result: compared across providers
                ckpt = base / "ckpt" / provider / read["op"]
                results[read["name"]] = {"error": error_of(e, ckpt)}
            print(f"{provider} {read['name']}: {str(results[read['name']])[:200]}", flush=True)
        out = base / "out" / provider
        out.mkdir(parents=True, exist_ok=True)
        (out / "reads.json").write_text(json.dumps(results, indent=1))
    spark.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    run(json.loads(Path(sys.argv[1]).read_text()))
