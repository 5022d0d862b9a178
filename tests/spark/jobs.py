"""Streaming jobs for the Spark tests, run in their own JVM: ``python jobs.py SPEC.json``.

One SparkSession (local[2]) runs every operator of the spec, once per provider, each as a
``trigger(availableNow=True)`` query over JSON files (one file per micro-batch). Each batch's
output is written to ``<base>/out/<provider>/<op>/batch-<id>.json`` (overwritten when a
batch is replayed, so a replay is idempotent); the tests fold those files and compare the
providers. Spec keys:

- ``base``, ``seeds``, ``providers`` (``ring``, ``hdfs``, ``rocksdb``; each also as
  ``<name>@ringfs``: its checkpoint on the ring, ``ring://<fs>/ckpt/...``), ``operators``
- ``fs``: the ring file system's name for ``@ringfs`` providers
- ``kill``: ``{"op", "provider", "after_batch", "pid"}``: SIGKILL that ring node once the
  batch's output is written (the query goes on)
- ``die``: ``{"op", "provider", "batch"}``: SIGKILL this driver inside that batch, after the
  state commit and before the batch is marked done
- ``partitions``: shuffle partitions (default 2)
- ``conf``: extra Spark conf keys (e.g. ``spark.statestore.dataPath``)
- ``repartition``: ``{"provider", "partitions"}``: before each of that provider's queries,
  ``spark_connector.repartition`` its checkpoint to that many partitions; the batch it made (or
  the error) goes to ``<base>/out/<provider>/<op>/repartition-<n>.json``; with
  ``"only": true`` the queries do not run after it
- ``spark_repartition``: ``{"provider", "partitions", "operators"}``: the same with Spark's
  own ``spark._streamingCheckpointManager.repartition`` (RocksDB checkpoints only), for those
  operators (default: all)
- ``fs_probe``: true: RingFileSystem's operations through Hadoop's API, results written to
  ``<base>/out/fs_probe.json``
- ``repartition_probes``: ``[{"name", "checkpoint", "partitions"}]``: after all queries,
  ``spark_connector.repartition`` of each, the batch or the error written to
  ``<base>/out/probes.json`` (name -> result)
- ``ckpt_root``: where the checkpoints are (default ``<base>/ckpt``):
  ``<ckpt_root>/<provider>/<op>``
- ``read_state``: operator ids (a join: its left side) whose state the state data source
  (``spark.read.format("statestore")``) reads after each query, written as sorted JSON rows
  to ``<base>/out/<provider>/<op>/state-<id>.json``
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.spark.jvm import JVM_FLAGS  # noqa: E402

PROVIDERS = {
    "ring": "statestore.spark.RingStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
# the same providers with their checkpoint on the ring: ring://<spec "fs">/ckpt/<name>/<op>
for _name in list(PROVIDERS):
    PROVIDERS[f"{_name}@ringfs"] = PROVIDERS[_name]


def checkpoint(base: Path, spec: dict[str, Any], provider: str, op: str) -> str:
    if provider.endswith("@ringfs"):
        return f"ring://{spec['fs']}/ckpt/{provider.replace('@', '-')}/{op}"
    return str(Path(spec.get("ckpt_root") or base / "ckpt") / provider / op)


EVENTS = "user string, id long, ts timestamp, v long"
SIDE = "id long, ts timestamp, x string"
# operator name -> output mode; "last" ops are folded as last value per key, "all" as a multiset
OPERATORS = {
    "agg": "update",
    "dedup": "append",
    "dedup_wm": "append",
    "join": "append",
    "session": "append",
    "pandas": "update",
    "dedup_count": "update",
    "tws": "update",
    "tws_ttl": "update",
}


def count_by_user(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """applyInPandasWithState: running count and sum of v per user."""
    import pandas as pd

    n, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        total += int(pdf["v"].sum())
    state.update((n, total))
    yield pd.DataFrame({"user": [key[0]], "n": [n], "total": [total]})


def _processor_base() -> Any:
    try:
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    except ImportError:  # pyspark < 4.0: no transformWithState
        return object
    return StatefulProcessor


class UserActivity(_processor_base()):  # type: ignore[misc]
    """transformWithStateInPandas: per user a value state (count and sum of v over distinct
    ids), a list state (the last three v) and a map state (id -> v, the ids seen). In event
    time (``ttl=False``) an event-time timer 20 s past each batch's latest event reports the
    count; in processing time (``ttl=True``) the value state has a TTL of a day instead (Spark
    allows TTLs in processing time only)."""

    def __init__(self, ttl: bool = False) -> None:
        self.ttl = ttl

    def init(self, handle: Any) -> None:
        self.handle = handle
        ttl = 86_400_000 if self.ttl else None
        self.count = handle.getValueState("count", "n long, total long", ttl)
        self.recent = handle.getListState("recent", "v long")
        self.seen = handle.getMapState("seen", "id long", "v long")

    def _totals(self) -> tuple[int, int]:
        got = self.count.get() if self.count.exists() else None
        return (int(got[0]), int(got[1])) if got else (0, 0)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        n, total = self._totals()
        recent = [int(r[0]) for r in self.recent.get()] if self.recent.exists() else []
        latest = None
        for pdf in rows:
            for i, v, ts in zip(pdf["id"], pdf["v"], pdf["ts"], strict=True):
                if not self.seen.containsKey((int(i),)):
                    self.seen.updateValue((int(i),), (int(v),))
                    n, total = n + 1, total + int(v)
                recent = [*recent, int(v)][-3:]
                latest = ts if latest is None else max(latest, ts)
        self.count.update((n, total))
        self.recent.put([(x,) for x in recent])
        if latest is not None and not self.ttl:
            self.handle.registerTimer(int(pd.Timestamp(latest).value // 1_000_000) + 20_000)
        row = {"user": key[0], "kind": "rows", "n": n, "total": total}
        yield pd.DataFrame([{**row, "recent": ",".join(map(str, recent))}])

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        import pandas as pd

        n, total = self._totals()
        at = str(expiredTimerInfo.getExpiryTimeInMs())
        yield pd.DataFrame(
            [{"user": key[0], "kind": "timer", "n": n, "total": total, "recent": at}]
        )

    def close(self) -> None:
        pass


def build(spark: Any, op: str, base: Path) -> Any:
    from pyspark.sql import functions as F

    def stream(name: str, schema: str) -> Any:
        return (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .json(str(base / "input" / name))
        )

    if op == "agg":
        ev = stream("events", EVENTS)
        return ev.groupBy("user").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    if op == "dedup":
        return stream("events", EVENTS).dropDuplicates(["id"]).select("id", "user", "v")
    if op == "dedup_wm":
        ev = stream("events", EVENTS).withWatermark("ts", "30 seconds")
        return ev.dropDuplicates(["id", "ts"]).select("id", "ts", "user")
    if op == "join":
        left = stream("left", SIDE).select("id", F.col("x").alias("lx"))
        right = stream("right", SIDE).select("id", F.col("x").alias("rx"))
        return left.join(right, "id")
    if op == "session":
        ev = stream("events", EVENTS).withWatermark("ts", "10 seconds")
        return ev.groupBy(F.session_window("ts", "5 seconds").alias("s"), "user").agg(
            F.count("*").alias("n"), F.sum("v").alias("total")
        )
    if op == "dedup_count":
        ev = stream("events", EVENTS).dropDuplicates(["id"])
        return ev.groupBy("user").agg(F.count("*").alias("n"))
    if op == "pandas":
        from pyspark.sql.streaming.state import GroupStateTimeout

        ev = stream("events", EVENTS).select("user", "v")
        return ev.groupBy("user").applyInPandasWithState(
            count_by_user,
            "user string, n long, total long",
            "n long, total long",
            "Update",
            GroupStateTimeout.NoTimeout,
        )
    if op in ("tws", "tws_ttl"):
        ev = stream("events", EVENTS).withWatermark("ts", "10 seconds")
        return (
            ev.select("user", "id", "ts", "v")
            .groupBy("user")
            .transformWithStateInPandas(
                UserActivity(ttl=op == "tws_ttl"),
                "user string, kind string, n long, total long, recent string",
                "Update",
                "ProcessingTime" if op == "tws_ttl" else "EventTime",
            )
        )
    raise ValueError(f"unknown operator {op}")


def run(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession

    import spark_connector

    base = Path(spec["base"])
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("statestore-spark-tests")
        .config("spark.sql.shuffle.partitions", str(spec.get("partitions", 2)))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "600s")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", " ".join(JVM_FLAGS))
    )
    for key, value in spec.get("conf", {}).items():
        builder = builder.config(key, value)
    spark = spark_connector.configure(builder, seeds=spec["seeds"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    kill = spec.get("kill") or {}
    die = spec.get("die") or {}
    for provider in spec["providers"]:
        for op in spec["operators"]:
            out_dir = base / "out" / provider / op
            out_dir.mkdir(parents=True, exist_ok=True)
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
            here = (op, provider)
            srep = spec.get("spark_repartition") or {}
            if srep.get("provider") == provider and op in srep.get("operators", [op]):
                spark._streamingCheckpointManager.repartition(
                    checkpoint(base, spec, provider, op), srep["partitions"]
                )
                (out_dir / f"spark-repartition-{srep['partitions']}.json").write_text("{}")
            rep = spec.get("repartition") or {}
            if rep.get("provider") == provider:
                try:
                    result: dict[str, Any] = {
                        "batch": spark_connector.repartition(
                            spark, checkpoint(base, spec, provider, op), rep["partitions"]
                        )
                    }
                except spark_connector.SparkConnectorError as exc:
                    result = {"error": str(exc)}
                (out_dir / f"repartition-{rep['partitions']}.json").write_text(json.dumps(result))
                if rep.get("only"):
                    continue
            query = (
                build(spark, op, base)
                .writeStream.outputMode(OPERATORS[op])
                .option("checkpointLocation", checkpoint(base, spec, provider, op))
                .foreachBatch(
                    sink(
                        out_dir,
                        kill if (kill.get("op"), kill.get("provider")) == here else {},
                        die if (die.get("op"), die.get("provider")) == here else {},
                    )
                )
                .trigger(**TRIGGERS.get(op, {"availableNow": True}))
                .start()
            )
            if op in TRIGGERS:
                until_all_files_read(query, base / "input" / "events")
            else:
                query.awaitTermination()
            progress = query.lastProgress or {}
            with open(out_dir / "progress.jsonl", "a") as f:
                for p in query.recentProgress:
                    f.write(json.dumps(p.get("stateOperators", [])) + "\n")
            print(f"{provider}/{op}: {progress.get('batchId')}", flush=True)
            for op_id in spec.get("read_state", []):
                reader = spark.read.format("statestore").option("operatorId", op_id)
                if op == "join":  # a join's state is read one side at a time
                    reader = reader.option("joinSide", "left")
                state = reader.load(checkpoint(base, spec, provider, op))
                rows = [
                    json.dumps(r.asDict(recursive=True), sort_keys=True, default=str)
                    for r in state.collect()
                ]
                (out_dir / f"state-{op_id}.json").write_text(json.dumps(sorted(rows)))
    if spec.get("fs_probe"):
        (base / "out").mkdir(parents=True, exist_ok=True)
        (base / "out" / "fs_probe.json").write_text(json.dumps(fs_probe(spark, spec["fs"])))
    probes: dict[str, Any] = {}
    for probe in spec.get("repartition_probes", []):
        try:
            probes[probe["name"]] = {
                "batch": spark_connector.repartition(
                    spark, probe["checkpoint"], probe["partitions"]
                )
            }
        except spark_connector.SparkConnectorError as exc:
            probes[probe["name"]] = {"error": str(exc)}
    if probes:
        (base / "out" / "probes.json").write_text(json.dumps(probes))
    spark.stop()


def fs_probe(spark: Any, fs_name: str) -> dict[str, Any]:
    """RingFileSystem through Hadoop's API: name -> what happened (a value, or the Java
    exception's class)."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    root = f"ring://{fs_name}/probe"

    def path(p: str) -> Any:
        return jvm.org.apache.hadoop.fs.Path(root + p)

    fs = path("").getFileSystem(conf)
    big = bytes(range(256)) * (3 * 4096 + 7)  # > 3 MiB: several parts

    def write(p: str, data: bytes, overwrite: bool = True) -> None:
        out = fs.create(path(p), overwrite)
        out.write(bytearray(data))
        out.close()

    def read(p: str) -> bytes:
        ins = fs.open(path(p))
        try:
            return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(ins))
        finally:
            ins.close()

    steps: dict[str, Any] = {
        "write_read": lambda: (write("/d/a.txt", b"hello"), read("/d/a.txt") == b"hello")[1],
        "no_overwrite": lambda: write("/d/a.txt", b"x", overwrite=False),
        "rename": lambda: fs.rename(path("/d/a.txt"), path("/d/b.txt")),
        "old_name_gone": lambda: fs.exists(path("/d/a.txt")),
        "new_name": lambda: read("/d/b.txt") == b"hello",
        "big": lambda: (write("/d/big.bin", big), read("/d/big.bin") == big)[1],
        "length": lambda: fs.getFileStatus(path("/d/big.bin")).getLen() == len(big),
        "temp_then_rename": lambda: (
            write("/d/.c.txt.1234.tmp", b"atomic"),
            fs.rename(path("/d/.c.txt.1234.tmp"), path("/d/c.txt")),
            read("/d/c.txt") == b"atomic",
        )[1:],
        "list": lambda: sorted(str(st.getPath().getName()) for st in fs.listStatus(path("/d"))),
        "missing": lambda: fs.open(path("/d/none")),
        "append": lambda: fs.append(path("/d/b.txt")),
        "delete_dir_not_recursive": lambda: fs.delete(path("/d"), False),
        "delete_dir": lambda: fs.delete(path("/d"), True),
        "gone": lambda: fs.exists(path("/d/b.txt")) or fs.exists(path("/d")),
        "bad_name": lambda: jvm.org.apache.hadoop.fs.Path("ring://bad+name/x").getFileSystem(conf),
    }
    got: dict[str, Any] = {}
    for name, step in steps.items():
        try:
            value = step()
            got[name] = list(value) if isinstance(value, tuple) else value
            if not isinstance(got[name], bool | list):
                got[name] = "ok"
        except Exception as exc:
            java = getattr(exc, "java_exception", None)
            got[name] = str(java.getClass().getSimpleName()) if java is not None else repr(exc)
    return got


# a processing-time transformWithState (what a TTL needs) runs no-data batches forever, so
# availableNow never ends: these run on a timer and stop once every input file was read
TRIGGERS = {"tws_ttl": {"processingTime": "500 milliseconds"}}


def until_all_files_read(query: Any, source: Path, timeout: float = 300.0) -> None:
    last = len(list(source.glob("*.json"))) - 1  # the file source's logOffset of the last one
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in query.recentProgress:
            end = (p.get("sources") or [{}])[0].get("endOffset") or {}
            if isinstance(end, str):
                end = json.loads(end)
            if end.get("logOffset", -1) >= last and p.get("numInputRows", 0) == 0:
                query.stop()  # the batch after the last file's: every file's output is written
                return
        time.sleep(0.5)
    query.stop()
    raise TimeoutError(f"{source}: not every file was read in {timeout:.0f}s")


def sink(out_dir: Path, kill: dict[str, Any], die: dict[str, Any]) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        rows = [r.asDict(recursive=True) for r in df.collect()]  # runs the batch: state commits
        if die and batch_id == die["batch"]:
            os.kill(os.getpid(), signal.SIGKILL)  # the offsets are logged, the batch is not done
        tmp = out_dir / f".batch-{batch_id}.tmp"
        tmp.write_text(json.dumps(rows, default=str, sort_keys=True))
        os.replace(tmp, out_dir / f"batch-{batch_id}.json")
        if kill and batch_id == kill["after_batch"]:
            os.kill(kill["pid"], signal.SIGKILL)

    return write


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    run(json.loads(Path(sys.argv[1]).read_text()))
