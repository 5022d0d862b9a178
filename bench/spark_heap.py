"""The ring provider's heap use against ``spark.statestore.cacheBytes`` (issue 38: "the
provider's heap use at its high-water mark / cacheBytes", goal <= 1.2x).

The aggregation of bench/spark_large_state.py (count-and-max by key with a ``--payload``-byte
string per row, 8 shuffle partitions, ``local[2]``, a ``--memory`` driver heap: in local mode
the driver is the executor) on a local ring of 3 nodes, its state built from ``--batches``
batches of distinct new keys (``--keys`` in all), so the state grows to several times the
cache and the cache fills. The same query runs in a fresh JVM, with its own checkpoint, for
``cacheBytes=0`` (every version and overlay spilled to the local RocksDB store: the baseline)
and for each ``C`` in ``--caches`` (MiB).

At the end of each batch (in ``foreachBatch``, after the batch's write: the state stores have
committed and no task runs) the JVM is collected twice (``System.gc()``: a full, compacting
collection with the default G1) and its live heap read (``MemoryMXBean`` heap used). The
provider's heap at that point is the live heap with ``C`` minus the live heap with ``0`` at the
same batch (everything else, Spark's own structures for the same plan and batch, is the same
in both JVMs); its high-water is the largest such difference over the batches, reported
against ``C``. Beside it, the provider's own count: the executor-wide total it holds against
the limit (``StateBudget.used()``, read at the same moment) and the query progress's
``memoryUsedBytes`` and custom metrics ``cacheBytes`` / ``spillBytes`` (summed over
partitions), and the peak of ``StateBudget.used()`` while the batch ran (sampled every 0.2 s:
the overlays in flight). At each batch's end a class histogram (``jcmd GC.class_histogram``)
is taken too, and the classes that differ most between ``C`` and ``0`` at the high-water
batch and at the build's last batch are listed: what the difference is made of.

After the build, each of ``--restarts`` adds a batch touching ``--touch`` of the keys at random
and runs it in a fresh JVM per cache size, on the checkpoint that cache size built: ``whole``
(``lazyRestore=false``, the default: every row restored, into the cache up to ``C`` and the
rest spilled) and ``lazy`` (``lazyRestore=true`` without the background prefetch: the batch
reads what it touches through the block LRU, 1/8 of ``C``, and the memo, 1/16). Each is
measured the same way.

    .venv/bin/python bench/spark_heap.py [--caches 32,128] [--keys 1200000] [--batches 6]
        [--restarts whole,lazy] [--touch 0.01] [--memory 1g] [--payload 200] [--partitions 8]

One JVM per cache size and phase (memory is measured, not time: CPU contention does not change
it); ``--keep`` keeps the work directory with every figure and histogram in ``results.json``.
The end of a batch is not the provider's own peak: while a batch runs, its count reaches ``C``
(the peak column) with tasks' own buffers live beside it, where no clean baseline exists; the
heap then is about ``C`` times the difference / count ratio of the rows at rest. Which versions
spill, and so the count at a batch's end, depends on the order the two task threads commit in:
the figures per batch vary between runs, the ratio to the count much less.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
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

from spark_large_state import run_jvm, write_batch  # noqa: E402

MiB = 1 << 20
# the restarts after the build: a whole restore (the default) and a lazy one without the
# background prefetch (the batch reads only what it touches, through the block LRU and memo)
RESTARTS = {
    "whole": {"spark.statestore.lazyRestore": "false"},
    "lazy": {
        "spark.statestore.lazyRestore": "true",
        "spark.statestore.prefetchBytesPerSec": "0",
    },
}
ROW_COUNTED = 160  # bytes per row the provider counts besides key and value (64 before)


def _histogram(pid: int) -> dict[str, list[int]]:
    """``jcmd <pid> GC.class_histogram`` (after a full GC): class -> [instances, bytes]."""
    out = subprocess.run(
        ["jcmd", str(pid), "GC.class_histogram"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    got: dict[str, list[int]] = {}
    for line in out.splitlines():
        parts = line.split()
        # "   1:   123   4567   [B (java.base@17)"
        if len(parts) >= 4 and parts[0].endswith(":") and parts[0][:-1].isdigit():
            # a lambda's class name carries its address, different in every JVM
            name = re.sub(r"/0x[0-9a-f]+", "", parts[3])
            have = got.setdefault(name, [0, 0])
            have[0] += int(parts[1])
            have[1] += int(parts[2])
    return got


# -- the JVM side --------------------------------------------------------------------------
def worker(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_connector

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-heap")
        .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", spec["memory"])
        .config("spark.local.dir", spec["local"])
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.statestore.cacheBytes", str(spec["cache"]))
    )
    for k, v in spec.get("conf", {}).items():
        builder = builder.config(k, v)
    spark = spark_connector.configure(builder, seeds=spec["seeds"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", spark_connector.PROVIDER_CLASS)
    jvm = spark.sparkContext._jvm
    gw = spark.sparkContext._gateway
    assert jvm is not None and gw is not None
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    mx = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    max_heap = int(jvm.java.lang.Runtime.getRuntime().maxMemory())

    def budget(name: str) -> int:
        # StateBudget is package-private: its static counters through reflection (the class
        # the tasks use: in local mode the jar is on the driver's class path)
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        cls = jvm.java.lang.Class.forName("statestore.spark.StateBudget", True, loader)
        m = cls.getDeclaredMethod(name, gw.new_array(jvm.java.lang.Class, 0))
        m.setAccessible(True)
        return int(m.invoke(None, gw.new_array(jvm.java.lang.Object, 0)))

    df = (
        spark.readStream.schema("key long, v long, p string")
        .option("maxFilesPerTrigger", 1)
        .parquet(spec["input"])
    )
    counted = df.groupBy("key").agg(F.count("*").alias("count"), F.max("p").alias("p"))
    marks: dict[int, dict[str, Any]] = {}
    # the provider's count sampled while the batch runs (its overlays in flight): the peak
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            try:
                peak[0] = max(peak[0], budget("used"))
            except Exception:  # the JVM going down at the end
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def measure(batch: Any, batch_id: int) -> None:
        batch.write.format("noop").mode("append").save()
        # the batch's tasks are done and its stores committed: the live heap now
        for _ in range(2):
            jvm.java.lang.System.gc()
        live = int(mx.getHeapMemoryUsage().getUsed())
        used = budget("used")
        mark: dict[str, Any] = {
            "live": live,
            "used": used,
            "peak": max(peak[0], used),
            "limit": budget("limit"),
        }
        peak[0] = 0
        mark["histogram"] = _histogram(pid)
        marks[batch_id] = mark

    started = time.perf_counter()
    q = (
        counted.writeStream.outputMode("update")
        .foreachBatch(measure)
        .option("checkpointLocation", spec["ckpt"])
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    each = []
    for p in q.recentProgress:
        obj = json.loads(p.json) if hasattr(p, "json") else p
        op = obj["stateOperators"][0]
        custom = op.get("customMetrics", {})
        if "ringBytesCommitted" not in custom:
            raise SystemExit("the query ran on another provider than the ring's")
        bid = int(obj["batchId"])
        each.append(
            {
                "batch": bid,
                "ms": int(obj.get("durationMs", {}).get("triggerExecution", 0)),
                "rows": int(op["numRowsTotal"]),
                "memoryUsedBytes": int(op["memoryUsedBytes"]),
                "cacheBytes": int(custom.get("cacheBytes", 0)),
                "spillBytes": int(custom.get("spillBytes", 0)),
                **marks.get(bid, {}),
            }
        )
    spark.stop()
    out = {"seconds": elapsed, "maxHeap": max_heap, "each": each}
    print("RESULT " + json.dumps(out), flush=True)


def call(spec: dict[str, Any], log: Path) -> tuple[dict[str, Any], float]:
    """Run one JVM (this file's worker); its result."""
    got, wall = run_jvm(__file__, spec, log, f"cacheBytes={spec['cache']}")
    if isinstance(got, str):
        raise SystemExit(f"cacheBytes={spec['cache']}: {got}; see {log}")
    return got, wall


def mib(n: float) -> str:
    return f"{n / MiB:,.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caches", default="32,128", help="cacheBytes in MiB, comma-separated")
    p.add_argument("--keys", type=int, default=1_200_000, help="keys of state in all")
    p.add_argument("--batches", type=int, default=6, help="batches of new keys")
    p.add_argument("--memory", default="1g", help="the Spark driver's heap (local mode)")
    p.add_argument("--payload", type=int, default=200)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--timeout", type=float, default=1800, help="seconds a JVM may run")
    p.add_argument(
        "--restarts",
        default="whole,lazy",
        help="after the build, restarts in fresh JVMs (whole: lazyRestore=false, the default; "
        "lazy: lazyRestore=true without the prefetch), each running one batch that touches "
        "--touch of the keys",
    )
    p.add_argument("--touch", type=float, default=0.01, help="share of keys a restart touches")
    p.add_argument("--top", type=int, default=8, help="classes listed from the histograms")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    caches = [int(x) for x in args.caches.split(",") if x]
    restarts = [x for x in args.restarts.split(",") if x]
    if any(x not in RESTARTS for x in restarts):
        raise SystemExit(f"--restarts: choose from {list(RESTARTS)}")
    if not caches or any(c < 1 for c in caches) or args.batches < 1 or args.keys < args.batches:
        raise SystemExit("--caches, --batches and --keys must be positive")

    import numpy as np
    from _common import local_ring, machine, table

    print(machine(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="statestore-bench-heap-"))
    log = work / "spark.log"
    print(f"log: {log}", flush=True)
    order = np.random.default_rng(0).permutation(args.keys).astype(np.int64)
    inp = work / "input"
    step = args.keys // args.batches
    for b in range(args.batches):
        hi = args.keys if b == args.batches - 1 else (b + 1) * step
        write_batch(inp / f"part-{b:04d}.parquet", order[b * step : hi], args.payload, b)
    runs: dict[int, dict[str, Any]] = {}
    walls: dict[int, dict[str, float]] = {}
    try:
        with local_ring(3) as ring:
            # the build (one JVM per cache size), then each restart (one JVM per cache size,
            # on the checkpoint its build wrote)
            for phase in ["build", *restarts]:
                if phase != "build":
                    n = len(list(inp.iterdir()))
                    rng = np.random.default_rng(n)
                    touched = rng.choice(args.keys, max(1, int(args.keys * args.touch)), False)
                    write_batch(
                        inp / f"part-{n:04d}.parquet", touched.astype(np.int64), args.payload, n
                    )
                for cache in [0, *caches]:
                    spec = {
                        "cache": cache * MiB,
                        "conf": RESTARTS.get(phase, {}),
                        "seeds": ring.seeds,
                        "partitions": args.partitions,
                        "memory": args.memory,
                        "input": str(inp),
                        "ckpt": str(work / f"ckpt-{cache}"),
                        "timeout": args.timeout,
                    }
                    print(f"{phase}, cacheBytes={cache} MiB ...", flush=True)
                    got, wall = call(spec, log)
                    walls.setdefault(cache, {})[phase] = wall
                    run = runs.setdefault(cache, {"each": []})
                    for e in got["each"]:
                        e["phase"] = phase
                        run["each"].append(e)
                        print(
                            f"  batch {e['batch']}: live heap {mib(e['live'])} MiB, counted "
                            f"{mib(e['used'])} MiB (peak {mib(e['peak'])}, limit "
                            f"{mib(e['limit'])}), spilled "
                            f"{mib(e['spillBytes'])} MiB, {e['ms'] / 1000:.1f} s",
                            flush=True,
                        )
                    print(f"  query {got['seconds']:.1f} s, JVM {wall:.1f} s", flush=True)
        if args.keep:
            (work / "results.json").write_text(json.dumps({"runs": runs, "walls": walls}))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    base = {e["batch"]: e for e in runs[0]["each"]}
    body = []
    high: list[list[object]] = []
    for cache in caches:
        c = cache * MiB
        best: tuple[float, int, int, int] = (float("-inf"), -1, 0, 0)
        peak = max(e["peak"] for e in runs[cache]["each"])
        for e in runs[cache]["each"]:
            zero = base[e["batch"]]
            diff = e["live"] - zero["live"]
            best = max(best, (diff, e["batch"], e["used"], e["cacheBytes"]))
            body.append(
                [
                    cache,
                    e["batch"] if e["phase"] == "build" else f"{e['batch']} ({e['phase']} restart)",
                    f"{e['rows']:,}",
                    mib(e["cacheBytes"] + e["spillBytes"]),
                    mib(e["live"]),
                    mib(zero["live"]),
                    mib(diff),
                    f"{diff / c:.2f}x",
                    mib(e["used"]),
                    mib(e["peak"]),
                    mib(e["cacheBytes"]),
                    f"{diff / e['used']:.2f}x" if e["used"] else "-",
                ]
            )
        diff, batch, used, _ = best
        high.append(
            [
                cache,
                batch,
                mib(diff),
                f"{diff / c:.2f}x",
                mib(used),
                f"{diff / used:.2f}x" if used else "-",
                f"{mib(peak)} ({peak / c:.2f}x C)",
                " / ".join(f"{w:.0f}" for w in walls[cache].values()),
            ]
        )
    headers = "C MiB|batch|rows of state|state MiB (counted: cache + spill)|live heap with C MiB"
    headers += "|live heap with 0 MiB|difference MiB|difference / C|provider's count MiB"
    headers += " (StateBudget.used)|provider's peak count in the batch MiB"
    headers += "|progress cacheBytes MiB|difference / provider's count"
    print("\n" + table(headers.split("|"), body))
    headers = "C MiB|batch of the high-water|difference MiB|difference / C"
    headers += "|provider's count MiB|difference / count"
    headers += "|provider's peak count in any batch MiB|JVM wall s (" + ", ".join(walls[0]) + ")"
    print("\n" + table(headers.split("|"), high))
    print(
        "\nbaseline (cacheBytes=0) JVM wall s: "
        + ", ".join(f"{k} {v:.0f}" for k, v in walls[0].items())
    )
    # what the difference is made of: at the high-water batch, and at the build's last batch
    # (what stays once the versions have spilled)
    marks = [(c, int(row[1])) for c, row in zip(caches, high, strict=True)]  # type: ignore[call-overload]
    marks += [(c, args.batches - 1) for c in caches if (c, args.batches - 1) not in marks]
    for cache, last in marks:
        zero_h = base[last].get("histogram", {})
        e = next(x for x in runs[cache]["each"] if x["batch"] == last)
        h = e.get("histogram", {})
        names = set(h) | set(zero_h)
        diffs = {
            n: (h.get(n, [0, 0])[0] - zero_h.get(n, [0, 0])[0])
            for n in names
            if h.get(n, [0, 0])[1] != zero_h.get(n, [0, 0])[1]
        }
        sizes = {n: h.get(n, [0, 0])[1] - zero_h.get(n, [0, 0])[1] for n in names}
        total = sum(sizes.values())
        rows_h = [
            [n, f"{diffs.get(n, 0):+,}", mib(sizes[n])]
            for n in sorted(names, key=lambda n: -abs(sizes[n]))[: args.top]
        ]
        print(
            f"\nC={cache} MiB, batch {last}: class histogram, C minus 0 "
            f"(all classes: {mib(total)} MiB)"
        )
        print(table(["class", "instances", "MiB"], rows_h))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(json.loads(sys.argv[2]))
    else:
        main()
