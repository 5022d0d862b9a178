"""Storage of the same update stream in Spark's RocksDB state store provider: the anchor of
bench/storage.py (issue 37).

bench/storage.py's stream (its ``update_stream``: one store of ``--live-mib`` MiB, 16-byte
keys and ``--value``-byte random values; version 1 writes every key, ``--versions`` - 1 more
each replace ``rate`` of the keys at random, seeded by the case) is written as one Parquet
file per version (``key binary, value binary, version int``, modification times one second
apart, in version order) and read by a Spark Structured Streaming query with
``maxFilesPerTrigger=1``: one micro-batch per version, state version N = the stream's
version N, a micro-batch every ``--pace`` seconds (a processingTime trigger; 1, as
bench/storage.py's default: the maintenance below runs by the clock, so the pace decides
how many versions it sees). The query keeps one row of state per key holding its latest value,
``groupBy("key").agg(last("value"))`` by default (Spark accepts ``last`` in a streaming
aggregation; the state holds per key the key and last's buffer, the value and a flag; its
result depends on the order rows reach the aggregate, which the read-back check at the end
verifies), or ``--agg max``: ``max(struct(version, value))``, the latest value whatever the
order, 4 bytes more a row; written to the ``noop`` sink in update mode. Spark runs ``local[2]`` in
its own JVM (a worker subprocess) with
``spark.sql.streaming.stateStore.providerClass=...RocksDBStateStoreProvider``, changelog
checkpointing on, ``minBatchesToRetain=100`` (Spark's default, as the ring's default
retention of 100 versions), ``--partitions`` shuffle partitions (1: one store, as the
ring's bench), the maintenance interval ``--maintenance-s`` (Spark's default 60 s: uploads of
snapshots and deletion of old versions happen in it). After the last batch it waits
``--settle`` seconds (maintenance passes, as bench/storage.py waits 45 s), then measures,
by the files' sizes:

- ``state/``: the checkpoint's state subtree (snapshots ``*.zip``, changelogs, ``SSTs/``,
  Hadoop's ``.crc`` files, metadata), and the whole checkpoint directory (with the file
  source's log, offsets and commits);
- ``local``: the executor's RocksDB working directories (a file hard-linked into RocksDB's
  local checkpoints counted once), under ``spark.local.dir``
  (``spark-*/StateStoreId(...)-*``: its working dir, local snapshots; a fresh
  ``spark.local.dir`` per run);
- each against ``live`` (the latest version's state) and ``perfect`` (the oldest retained
  version's state plus every row the 99 later retained versions wrote), computed as
  bench/storage.py computes them (``live_and_perfect``);
- the last progress report's ``numRowsTotal``, ``memoryUsedBytes`` and the provider's
  ``rocksdbSstFileSize`` (its own figure of its live SST files).

The sizes are also sampled as each batch's progress report arrives (printed every
``--sample-every`` batches; the peak is in the table). At the end the state is read back
(Spark's ``statestore`` data source) and checked against the stream: one row per key, each
holding the key's latest value.

    .venv/bin/python bench/storage_rocksdb.py [--live-mib 16] [--rates 0.01 0.2]
        [--versions 200] [--partitions 1] [--agg last] [--pace 1] [--maintenance-s 60]
        [--settle 70]

Spark deletes old versions in its maintenance only once a snapshot older than the oldest
snapshot a retained version needs is on disk (RocksDBFileManager.deleteOldVersions): the
printed list of the versions kept at the end says whether it did.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
MiB = 1 << 20
RETAIN = 100  # spark.sql.streaming.minBatchesToRetain: Spark's default, the ring's --retain


def tree_bytes(root: Path, seen: set[tuple[int, int]] | None = None) -> dict[str, int]:
    """Bytes of the files under ``root`` (their sizes; a file hard-linked several times,
    as RocksDB's local checkpoints link its SST files, counted once, ``seen`` holding the
    inodes counted), in total and by kind: RocksDB's snapshots (``.zip``), changelogs, SST
    files, Hadoop's ``.crc`` checksums, the rest."""
    seen = set() if seen is None else seen
    out = {"total": 0, "files": 0, "zip": 0, "changelog": 0, "sst": 0, "crc": 0, "other": 0}
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except FileNotFoundError:  # deleted by maintenance while we walk
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            size = st.st_size
            kind = (
                "crc"
                if name.endswith(".crc")
                else "zip"
                if name.endswith(".zip")
                else "changelog"
                if name.endswith(".changelog")
                else "sst"
                if name.endswith(".sst")
                else "other"
            )
            out[kind] += size
            out["total"] += size
            out["files"] += 1
    return out


def local_rocksdb_bytes(local: Path) -> int:
    """Bytes of the RocksDB provider's working directories under ``spark.local.dir``."""
    total, seen = 0, set[tuple[int, int]]()
    for base in local.glob("**/StateStoreId(*"):
        if base.is_dir():
            total += tree_bytes(base, seen)["total"]
    return total


def versions_kept(state: Path) -> dict[str, Any]:
    """The versions whose changelog and snapshot files are in the state subtree, and how
    many SST files it holds."""
    names = [p.name for p in state.rglob("*") if p.is_file() and not p.name.startswith(".")]
    changelogs = sorted(int(n.split(".")[0]) for n in names if n.endswith(".changelog"))
    return {
        "changelogs": len(changelogs),
        "changelog_versions": f"{changelogs[0]}-{changelogs[-1]}" if changelogs else "-",
        "snapshots": sorted(int(n.split(".")[0]) for n in names if n.endswith(".zip")),
        "ssts": sum(n.endswith(".sst") for n in names),
    }


def sizes(ckpt: Path, local: Path) -> dict[str, Any]:
    return {
        "state": tree_bytes(ckpt / "state"),
        "ckpt": tree_bytes(ckpt)["total"],
        "local": local_rocksdb_bytes(local),
        "local_all": tree_bytes(local)["total"],
    }


# -- the JVM side --------------------------------------------------------------------------
def _conf(spark: Any, key: str) -> str:
    """The session's value of ``key`` (its default if unset), or why there is none."""
    try:
        return str(spark.conf.get(key))
    except Exception as e:  # a key this Spark does not know
        return f"({type(e).__name__})"


def worker(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    ckpt, local = Path(spec["ckpt"]), Path(spec["local"])
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-storage-rocksdb")
        .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", spec["memory"])
        .config("spark.local.dir", str(local))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={spec['tmp']}")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.minBatchesToRetain", str(RETAIN))
        .config(
            "spark.sql.streaming.stateStore.maintenanceInterval",
            f"{round(1000 * spec['maintenance'])}ms",
        )
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    conf = {
        k: _conf(spark, k)
        for k in (
            "spark.sql.streaming.stateStore.providerClass",
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
            "spark.sql.streaming.minBatchesToRetain",
            "spark.sql.streaming.stateStore.minDeltasForSnapshot",
            "spark.sql.streaming.stateStore.maintenanceInterval",
            "spark.sql.streaming.stateStore.maxVersionsToDeletePerMaintenance",
            "spark.sql.streaming.stateStore.compression.codec",
            "spark.sql.streaming.stateStore.encodingFormat",
            "spark.sql.streaming.stateStore.checkpointFormatVersion",
            "spark.sql.shuffle.partitions",
        )
    }
    df = (
        spark.readStream.schema("key binary, value binary, version int")
        .option("maxFilesPerTrigger", 1)
        .parquet(spec["input"])
    )
    if spec["agg"] == "last":
        latest = df.groupBy("key").agg(F.last("value").alias("value"))
    else:  # the row of the highest version: the latest value whatever the order of rows
        latest = df.groupBy("key").agg(F.max(F.struct("version", "value")).alias("latest"))
    started = time.perf_counter()
    q = (
        latest.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime=f"{spec['pace']:g} seconds")
        .start()
    )
    versions, expected = spec["versions"], spec["rows"]
    batches: dict[int, dict[str, Any]] = {}
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + spec["timeout"]
    while len(batches) < versions:
        if q.exception() is not None:
            raise SystemExit(f"query failed: {q.exception()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(batches)} of {versions} batches in {spec['timeout']} s")
        for p in q.recentProgress:
            obj = json.loads(p.json) if hasattr(p, "json") else p
            b = int(obj["batchId"])
            if b in batches or not obj.get("stateOperators"):
                continue
            op = obj["stateOperators"][0]
            batches[b] = {
                "rows": int(obj["numInputRows"]),
                "numRowsTotal": int(op["numRowsTotal"]),
                "numRowsUpdated": int(op["numRowsUpdated"]),
                "memoryUsedBytes": int(op["memoryUsedBytes"]),
                "customMetrics": op.get("customMetrics", {}),
                "ms": int(obj.get("durationMs", {}).get("triggerExecution", 0)),
            }
            s = sizes(ckpt, local) | {"batch": b, "s": time.perf_counter() - started}
            samples.append(s)
            if (b + 1) % spec["sample_every"] == 0 or b == 0:
                print(
                    f"PROGRESS batch {b + 1}/{versions} ({s['s']:.0f} s): state/ "
                    f"{s['state']['total'] / MiB:.1f} MiB ({s['state']['files']} files), "
                    f"checkpoint {s['ckpt'] / MiB:.1f} MiB, local {s['local'] / MiB:.1f} MiB, "
                    f"numRowsTotal {batches[b]['numRowsTotal']:,}",
                    flush=True,
                )
        time.sleep(0.2)
    stream_s = time.perf_counter() - started
    got = [batches[b]["rows"] for b in range(versions)]
    if got != expected:
        bad = [i for i, (a, e) in enumerate(zip(got, expected, strict=True)) if a != e][:5]
        raise SystemExit(f"batches do not match the versions (first batches off: {bad})")
    # the settle: maintenance passes (snapshot uploads, old versions' deletion)
    settle_end = time.monotonic() + spec["settle"]
    while time.monotonic() < settle_end:
        time.sleep(min(10.0, max(0.0, settle_end - time.monotonic())))
        s = sizes(ckpt, local) | {"batch": versions - 1, "s": time.perf_counter() - started}
        samples.append(s)
        print(
            f"PROGRESS settling ({s['s']:.0f} s): state/ {s['state']['total'] / MiB:.1f} MiB "
            f"({s['state']['files']} files), checkpoint {s['ckpt'] / MiB:.1f} MiB, "
            f"local {s['local'] / MiB:.1f} MiB",
            flush=True,
        )
    final = sizes(ckpt, local)
    state_files = versions_kept(ckpt / "state")
    q.stop()
    after_stop = sizes(ckpt, local)
    # the state as Spark reads it back, against the stream's latest value per key
    state = spark.read.format("statestore").load(str(ckpt))
    # the aggregate's buffer: last's value, or max's struct(version, value)
    first = state["value"][state.select("value.*").columns[0]]
    value = first if spec["agg"] == "last" else first["value"]
    state = state.select(state["key"]["key"].alias("key"), value.alias("value"))
    truth = (
        spark.read.schema("key binary, value binary, version int")
        .parquet(spec["input"])
        .groupBy("key")
        .agg(F.max_by("value", "version").alias("truth"))
    )
    joined = truth.join(state, "key", "full_outer")
    check = {
        "state_rows": state.count(),
        "keys": truth.count(),
        "wrong": joined.where(
            F.col("value").isNull() | F.col("truth").isNull() | (F.col("value") != F.col("truth"))
        ).count(),
    }
    out = {
        "spark": spark.version,
        "conf": conf,
        "stream_s": stream_s,
        "final": final,
        "after_stop": after_stop,
        "samples": samples,
        "last": batches[versions - 1],
        "batch_ms": [batches[b]["ms"] for b in range(versions)],
        "check": check,
        "state_files": state_files,
    }
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


# -- the driver side -----------------------------------------------------------------------
def write_stream(
    inp: Path, live_mib: int, rate: float, versions: int, value: int
) -> tuple[list[int], int, int]:
    """bench/storage.py's stream as one Parquet file per version; the rows per version, and
    the live and perfect bytes as bench/storage.py computes them."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
    from storage import live_and_perfect, update_stream

    inp.mkdir(parents=True)
    written: dict[int, int] = {}
    base = time.time() - versions - 10  # modification times one second apart, in order
    for v, puts in update_stream(live_mib, rate, versions, value):
        written[v] = len(puts)
        table = pa.table(
            {
                "key": pa.array(list(puts), pa.binary()),
                "value": pa.array(list(puts.values()), pa.binary()),
                "version": pa.array([v] * len(puts), pa.int32()),
            }
        )
        path = inp / f"v{v:05d}.parquet"
        pq.write_table(table, path, compression="none")
        os.utime(path, (base + v, base + v))
    live, perfect = live_and_perfect(live_mib, versions, value, written)
    return [written[v] for v in range(1, versions + 1)], live, perfect


def call(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    """Run one JVM (its own process group: killed with its JVM at the timeout); relay its
    progress lines; its result."""
    with open(log, "a") as f:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            start_new_session=True,
        )
        timer = threading.Timer(spec["timeout"] + 600, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        result: dict[str, Any] | None = None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("PROGRESS "):
                    print("  " + line[len("PROGRESS ") :].rstrip(), flush=True)
                elif line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT ") :])
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0 or result is None:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"worker failed ({proc.returncode}); see {log}:\n" + "\n".join(tail))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live-mib", type=int, nargs="+", default=[16])
    p.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.2])
    p.add_argument("--versions", type=int, default=200)
    p.add_argument("--value", type=int, default=200)
    p.add_argument("--partitions", type=int, default=1, help="spark.sql.shuffle.partitions")
    p.add_argument("--agg", choices=["last", "max"], default="last")
    p.add_argument(
        "--pace",
        type=float,
        default=1.0,
        help="seconds between micro-batches (processingTime trigger; default 1, as "
        "bench/storage.py's --pace; 0: back to back)",
    )
    p.add_argument(
        "--maintenance-s",
        type=float,
        default=60,
        help="spark.sql.streaming.stateStore.maintenanceInterval (default Spark's 60 s)",
    )
    p.add_argument(
        "--settle", type=float, default=70, help="seconds after the last batch before measuring"
    )
    p.add_argument("--memory", default="2g", help="the Spark driver's heap (local mode)")
    p.add_argument("--sample-every", type=int, default=20, help="print sizes every N batches")
    p.add_argument("--timeout", type=float, default=3600, help="seconds a case may stream")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()

    from _common import machine, table

    print(machine(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="statestore-bench-rocksdb-"))
    log = work / "spark.log"
    print(f"work dir: {work}", flush=True)
    out: list[list[str]] = []
    provider: list[list[str]] = []
    try:
        for live_mib in args.live_mib:
            for rate in args.rates:
                case = work / f"{live_mib}mib-{rate:g}"
                t0 = time.perf_counter()
                rows, live, perfect = write_stream(
                    case / "input", live_mib, rate, args.versions, args.value
                )
                print(
                    f"{live_mib} MiB, {100 * rate:g}%: {args.versions} versions "
                    f"({rows[0]:,} keys, then {rows[-1]:,} rows a version) written in "
                    f"{time.perf_counter() - t0:.0f} s; streaming ...",
                    flush=True,
                )
                (case / "local").mkdir()
                (case / "tmp").mkdir()
                spec = {
                    "input": str(case / "input"),
                    "ckpt": str(case / "ckpt"),
                    "local": str(case / "local"),
                    "tmp": str(case / "tmp"),
                    "versions": args.versions,
                    "rows": rows,
                    "partitions": args.partitions,
                    "agg": args.agg,
                    "pace": args.pace,
                    "maintenance": args.maintenance_s,
                    "settle": args.settle,
                    "memory": args.memory,
                    "sample_every": args.sample_every,
                    "timeout": args.timeout,
                }
                t0 = time.perf_counter()
                r = call(spec, log)
                wall = time.perf_counter() - t0
                f, last, check = r["final"], r["last"], r["check"]
                st = f["state"]
                peak = max(s["state"]["total"] for s in r["samples"])
                peak_ckpt = max(s["ckpt"] for s in r["samples"])
                peak_local = max(s["local"] for s in r["samples"])
                ms = sorted(r["batch_ms"])
                print(
                    f"  Spark {r['spark']}; {r['conf']}\n"
                    f"  streamed in {r['stream_s']:.0f} s (batch median {ms[len(ms) // 2]} ms, "
                    f"max {ms[-1]} ms), JVM wall {wall:.0f} s; state read back: "
                    f"{check['state_rows']:,} rows for {check['keys']:,} keys, "
                    f"{check['wrong']} wrong or missing\n"
                    f"  state/ by kind: {st}\n"
                    f"  after stop: state/ {f['state']['total']:,} -> "
                    f"{r['after_stop']['state']['total']:,}, local {f['local']:,} -> "
                    f"{r['after_stop']['local']:,} (all of spark.local.dir {f['local_all']:,})\n"
                    f"  last progress' customMetrics: {last['customMetrics']}\n"
                    f"  kept at the end: {r['state_files']}",
                    flush=True,
                )
                label = [f"{live_mib} MiB", f"{100 * rate:g}%"]
                out.append(
                    [
                        *label,
                        f"{live:,}",
                        f"{perfect:,}",
                        f"{st['total']:,}",
                        f"{st['total'] / live:.2f}x",
                        f"{st['total'] / perfect:.2f}x",
                        f"{f['ckpt']:,}",
                        f"{f['ckpt'] / live:.2f}x",
                        f"{f['ckpt'] / perfect:.2f}x",
                        f"{f['local']:,}",
                        f"{f['local'] / live:.2f}x",
                        f"{peak / perfect:.2f}x, {peak_ckpt / perfect:.2f}x, "
                        f"{peak_local / live:.2f}x",
                    ]
                )
                cm = last["customMetrics"]
                provider.append(
                    [
                        *label,
                        f"{last['numRowsTotal']:,}",
                        f"{last['memoryUsedBytes']:,}",
                        f"{last['memoryUsedBytes'] / live:.2f}x",
                        f"{cm.get('rocksdbSstFileSize', 0):,}",
                        f"{cm.get('rocksdbSstFileSize', 0) / live:.2f}x",
                        f"{r['stream_s']:.0f} s",
                    ]
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        "\n"
        + table(
            [
                "live",
                "changed/version",
                "live bytes",
                "perfect bytes",
                "state/ bytes",
                "state/ / live",
                "state/ / perfect",
                "checkpoint bytes",
                "checkpoint / live",
                "checkpoint / perfect",
                "local RocksDB bytes",
                "local / live",
                "peak: state/ / perfect, checkpoint / perfect, local / live",
            ],
            out,
        )
    )
    print(
        "\n"
        + table(
            [
                "live",
                "changed/version",
                "numRowsTotal",
                "memoryUsedBytes",
                "memoryUsed / live",
                "rocksdbSstFileSize",
                "SST / live",
                "stream time",
            ],
            provider,
        )
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(json.loads(sys.argv[2]))
    else:
        main()
