"""Spark state larger than memory: the ring provider against Spark's RocksDB provider (changelog
checkpointing on, bounded memory) and HDFS-backed, at several state sizes (issue 38).

A count-and-max aggregation by key with a ``--payload``-byte string per row (the state keeps
each key's count and largest string), 8 shuffle partitions, ``local[2]``, a small driver heap
(``--memory``, 1 GiB by default). For each size in ``--sizes`` (MiB of state: key count =
size / (payload + 48 bytes)):

- **build**: every provider, in its own JVM and on its defaults, builds the state from two
  batches of distinct keys (half the keys each); rows/s, or the error a provider failed with
  (HDFS-backed keeps the whole state on the heap);
- the ring provider runs as ``ring`` (its defaults: lazy restore, the base prefetched in
  the background), ``ring-lazy`` (lazy restore, no prefetch: only what the batch touches
  is read), ``ring-whole`` (``lazyRestore=false``: every row restored up front) and
  ``ring-lazy-jdk`` (``ring-lazy`` with the direct path's GETs through java.net.http, as
  before pooled connections: ``-Dstatestore.spark.httpClient=jdk``) and ``ring-lazy-one``
  (``ring-lazy`` without the read-ahead, ``spark.statestore.readAhead=false``: each key a
  batch touches read alone, as before) and, with ``--before-jar``, ``ring-lazy-before``
  (``ring-lazy`` on another build's provider jar, first in ``spark.jars``: the build before
  a change, side by side with it), each
  with its own stores; with ``--rounds``, the ring's state is built once more, timed apart,
  with the second batch written as a snapshot (``snapshotInterval=2``): the base a lazy
  restart reads by blocks, as the ring's compaction makes one every ``--snapshot-every``
  versions (two batches make none);
- **restart**: then ``--rounds`` times, two new batches each touching 1% of the keys at
  random are added and every provider that built its state restarts in a fresh JVM with no
  local files (the ring and RocksDB's local copies live in the JVM's temp dirs) and runs
  them; the query's time to the end of the first (the restart), the JVM's wall time, and
  ``ringBytesFetched`` (the ring provider's bytes read from the ring for that batch, against
  the state's nominal size); then the second batch's own time and ``ringBytesFetched`` (the
  batch after a restart: what a lazy version still reads, or what the prefetch read).
  ``memoryUsedBytes`` is each provider's own measure (the ring's counts its heap cache only,
  not what it spilled). Providers alternate, the order reversed every round; medians with
  their range.

    .venv/bin/python bench/spark_large_state.py [--sizes 100,400] [--rounds 3] [--memory 1g]
        [--providers ring,ring-lazy,ring-whole,rocksdb,hdfs] [--payload 200] [--partitions 8]

``--query windowed`` runs a windowed count instead: by hour and key (``window(ts, "1
hour")``, no watermark, so the state keeps every hour), ``--window-keys`` keys an hour (the
build's first batch the older hours, its second the later ones), and each new batch touches
a tenth of an hour's keys among the latest two hours' keys: the same few thousand at every
size, where the state grows with the hours kept (a stream whose events fall in the current
windows).

One build per provider and size (a build at 400 MiB takes minutes on 2 cores): its rows/s is
one run, not a median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from spark_state import PROVIDERS as _BASE  # noqa: E402

# the ring provider restarting lazily (its default, with the prefetch; without it) and with a
# whole restore, side by side
PROVIDERS = {
    **_BASE,
    "ring-lazy": _BASE["ring"],
    "ring-whole": _BASE["ring"],
    "ring-lazy-jdk": _BASE["ring"],
    "ring-lazy-one": _BASE["ring"],
    "ring-lazy-before": _BASE["ring"],
}
RING_CONF = {
    "ring": {"spark.statestore.lazyRestore": "true"},
    "ring-lazy": {
        "spark.statestore.lazyRestore": "true",
        "spark.statestore.prefetchBytesPerSec": "0",
    },
    "ring-whole": {"spark.statestore.lazyRestore": "false"},
    # ring-lazy with the direct path's GETs through java.net.http (the build before pooled
    # Apache HttpClient connections): the baseline of that change, in the same run
    "ring-lazy-jdk": {
        "spark.statestore.lazyRestore": "true",
        "spark.statestore.prefetchBytesPerSec": "0",
        "spark.driver.extraJavaOptions": "-Dstatestore.spark.httpClient=jdk",
    },
    # ring-lazy without the read-ahead (ReadAhead.scala): each key a batch touches read
    # alone, one block from the task's thread (the build before): its baseline, in the run
    "ring-lazy-one": {
        "spark.statestore.lazyRestore": "true",
        "spark.statestore.prefetchBytesPerSec": "0",
        "spark.statestore.readAhead": "false",
    },
    # ring-lazy on the jar --before-jar names (first in spark.jars, so its classes win)
    "ring-lazy-before": {
        "spark.statestore.lazyRestore": "true",
        "spark.statestore.prefetchBytesPerSec": "0",
    },
}

MiB = 1 << 20
ROW_OVERHEAD = 48  # bytes of a state row besides its payload: key, count, framing


def write_batch(path: Path, keys: Any, payload: int, seed: int, window_keys: int = 0) -> None:
    """One Parquet file with a row per key in ``keys`` and a ``payload``-letter string; with
    ``window_keys``, a timestamp ``ts`` too, in hour ``key // window_keys`` (the key's window)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n = len(keys)
    letters = rng.integers(97, 123, n * payload, dtype=np.uint8)
    offsets = np.arange(0, n * payload + 1, payload, dtype=np.int64)
    p = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(letters))
    columns = {"key": keys, "v": rng.integers(0, 100, n), "p": p.cast(pa.string())}
    if window_keys:
        seconds = np.asarray(keys, dtype=np.int64) // window_keys * 3600 + 1800
        columns["ts"] = pa.array(seconds * 1_000_000, type=pa.timestamp("us", tz="UTC"))
    table = pa.table(columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    # row groups of 128k rows (~30 MiB): Spark reads a row group at a time, and one group of
    # the whole file would not fit a small heap at 2 GiB of state, whatever the provider
    pq.write_table(table, path, row_group_size=128 * 1024)


# -- the JVM side --------------------------------------------------------------------------
def worker(spec: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_connector

    provider = spec["provider"]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-large-state")
        .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", spec["memory"])
        .config("spark.local.dir", spec["local"])  # a fresh one per JVM: no local files
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage", "true")
    )
    for k, v in {**RING_CONF.get(provider, {}), **spec.get("conf", {})}.items():
        builder = builder.config(k, v)
    spark = spark_connector.configure(builder, seeds=spec["seeds"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # after configure(), which names the ring's provider
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    windowed = spec.get("query") == "windowed"
    df = (
        spark.readStream.schema("key long, v long, p string" + (", ts timestamp" * windowed))
        .option("maxFilesPerTrigger", 1)
        .parquet(spec["input"])
    )
    # the windowed count keeps a row per (hour, key), no watermark: the state holds every
    # window, and a new batch touches the latest ones only
    by = [F.window("ts", "1 hour"), "key"] if windowed else ["key"]
    counted = df.groupBy(*by).agg(F.count("*").alias("count"), F.max("p").alias("p"))
    started = time.perf_counter()
    q = (
        counted.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", spec["ckpt"])
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    elapsed = time.perf_counter() - started
    fetched = rows = state = 0
    each: list[dict[str, int]] = []  # per batch: its trigger's ms and ringBytesFetched
    ring = False  # the ring's metrics in the progress: the provider that ran is the ring's
    for p in q.recentProgress:
        obj = json.loads(p.json) if hasattr(p, "json") else p
        got = 0
        for op in obj.get("stateOperators", []):
            ring |= "ringBytesFetched" in op.get("customMetrics", {})
            got += int(op.get("customMetrics", {}).get("ringBytesFetched", 0))
            rows = int(op.get("numRowsTotal", rows))
            state = int(op.get("memoryUsedBytes", state))
        fetched += got
        ms = int(obj.get("durationMs", {}).get("triggerExecution", 0))
        each.append({"ms": ms, "fetched": got})
    ahead = {}
    if ring:  # what the read-ahead (ReadAhead.scala) brought in this JVM
        jvm = spark.sparkContext._jvm
        provider_class = jvm.statestore.spark.RingStateStoreProvider  # type: ignore[union-attr]
        ahead = {
            "keys": int(provider_class.readAheadKeys()),
            "lookups": int(provider_class.readAheadLookups()),
            "failed": int(provider_class.readAheadFailed()),
        }
        try:  # of the keys, those read from their blocks (not in a --before-jar's build)
            ahead["from_blocks"] = int(provider_class.readAheadBlockKeys())
        except Exception:  # py4j's error for a method the jar lacks
            pass
        try:  # puts that took the read store's answer, and those that read the version again
            ahead["recalled"] = int(provider_class.recalledReads())
            ahead["recall_misses"] = int(provider_class.recallMisses())
        except Exception:  # a build before these counters
            pass
    spark.stop()
    if ring != provider.startswith("ring"):
        raise SystemExit(f"the query ran on another provider than {provider}")
    out = {"seconds": elapsed, "fetched": fetched, "rows": rows, "state": state, "each": each}
    out["ahead"] = ahead
    print("RESULT " + json.dumps(out), flush=True)


def call(spec: dict[str, Any], log: Path) -> tuple[dict[str, Any] | str, float]:
    """Run one JVM (this file's worker); its result, or what it failed with."""
    return run_jvm(__file__, spec, log, f"{spec['provider']} {spec['what']}")


def run_jvm(
    script: str, spec: dict[str, Any], log: Path, title: str
) -> tuple[dict[str, Any] | str, float]:
    """Run ``script --worker spec`` (a Spark session in its own process and session group,
    killed at ``spec["timeout"]``), its stderr appended to ``log`` under ``title``; the
    worker's ``RESULT`` line, or what it failed with ("OutOfMemoryError", "failed", "not
    done in N s"), and the wall time."""
    local = Path(tempfile.mkdtemp(prefix="statestore-bench-local-"))
    started = time.perf_counter()
    try:
        with open(log, "a") as f:
            f.write(f"\n=== {title}\n")
            f.flush()
            proc = subprocess.Popen(
                [sys.executable, script, "--worker", json.dumps({**spec, "local": str(local)})],
                stdout=subprocess.PIPE,
                stderr=f,
                text=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                start_new_session=True,  # its JVM too is killed at the timeout
            )
            try:
                stdout, _ = proc.communicate(timeout=spec["timeout"])
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return f"not done in {spec['timeout']:.0f} s", time.perf_counter() - started
    finally:
        shutil.rmtree(local, ignore_errors=True)
    wall = time.perf_counter() - started
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        text = log.read_text(errors="replace")
        why = "OutOfMemoryError" if "OutOfMemoryError" in text.split("=== ")[-1] else "failed"
        return why, wall
    return json.loads(lines[-1][len("RESULT ") :]), wall


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100,400", help="MiB of state, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="restart rounds (medians; 0: none)")
    p.add_argument(
        "--build-rounds",
        type=int,
        default=1,
        help="builds per provider, alternated (medians of the rows/s ratios)",
    )
    p.add_argument("--memory", default="1g", help="the Spark driver's heap (local mode)")
    p.add_argument("--providers", default="ring,ring-lazy,ring-whole,rocksdb,hdfs")
    p.add_argument("--payload", type=int, default=200)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--timeout", type=float, default=1200, help="seconds a JVM may run")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--jfr",
        type=Path,
        help="a directory for a Java Flight Recording (settings=profile) of each JVM, named "
        "by provider and what it ran",
    )
    p.add_argument(
        "--query",
        choices=("count", "windowed"),
        default="count",
        help="count: by key, each new batch touching 1%% of the keys at random; windowed: by "
        "hour and key, each new batch touching --window-keys / 10 keys of the latest 2 hours",
    )
    p.add_argument("--window-keys", type=int, default=32768, help="windowed: the keys of each hour")
    p.add_argument(
        "--before-jar",
        type=Path,
        help="another build's provider jar (`statestore spark-jar` in its checkout), run as "
        "ring-lazy-before",
    )
    args = p.parse_args()
    providers = [x for x in args.providers.split(",") if x]
    unknown = [x for x in providers if x not in PROVIDERS]
    if unknown or not providers:
        raise SystemExit(f"unknown provider(s) {unknown}: choose from {list(PROVIDERS)}")
    if ("ring-lazy-before" in providers) != (args.before_jar is not None):
        raise SystemExit("ring-lazy-before runs with --before-jar, and --before-jar with it")
    before_jar: dict[str, str] = {}
    if args.before_jar is not None:
        if not args.before_jar.is_file():
            raise SystemExit(f"--before-jar {args.before_jar}: no such file")
        before_jar = {"spark.jars": str(args.before_jar.resolve())}
    sizes = [int(x) for x in args.sizes.split(",")]
    if (
        any(s < 1 for s in sizes)
        or args.rounds < 0
        or args.payload < 1
        or args.build_rounds < 1
        or args.window_keys < 10
    ):
        raise SystemExit(
            "--sizes, --build-rounds and --payload must be positive, --rounds >= 0, "
            "--window-keys >= 10"
        )
    if args.jfr is not None and " " in str(args.jfr.resolve()):
        raise SystemExit("--jfr: a directory whose path has no spaces (a JVM option names it)")
    windowed = args.query == "windowed"
    wk = args.window_keys if windowed else 0

    def nodes_seconds(pids: list[int]) -> float:
        """The nodes' CPU seconds so far (nan once one of them is gone)."""
        try:
            return sum(cpu_seconds(pid) for pid in pids)
        except FileNotFoundError:
            return float("nan")

    def jfr(provider: str, what: str) -> dict[str, str]:
        if args.jfr is None:
            return {}
        args.jfr.mkdir(parents=True, exist_ok=True)
        name = args.jfr.resolve() / f"{provider}-{what.replace(' ', '-')}.jfr"
        extra = RING_CONF.get(provider, {}).get("spark.driver.extraJavaOptions", "")
        record = f"-XX:StartFlightRecording=filename={name},settings=profile"
        return {"spark.driver.extraJavaOptions": f"{extra} {record}".strip()}

    import numpy as np
    from _common import cpu_seconds, local_ring, machine, quiet, table

    print(machine(), flush=True)
    if windowed:
        print(f"windowed count: {args.window_keys:,} keys an hour", flush=True)
    work = Path(tempfile.mkdtemp(prefix="statestore-bench-large-"))
    log = work / "spark.log"
    print(f"log: {log}", flush=True)
    rows_out = []
    notes: list[str] = []
    try:
        with local_ring(3) as ring:
            for size in sizes:
                keys = size * MiB // (args.payload + ROW_OVERHEAD)
                rng = np.random.default_rng(size)
                half = keys // 2
                if windowed:  # the first batch writes the older hours, the second the later
                    order = np.concatenate(
                        [rng.permutation(half), half + rng.permutation(keys - half)]
                    ).astype(np.int64)
                else:
                    order = rng.permutation(keys).astype(np.int64)
                inp = work / f"input-{size}"
                write_batch(inp / "part-0.parquet", order[:half], args.payload, 0, wk)
                write_batch(inp / "part-1.parquet", order[half:], args.payload, 1, wk)
                built: dict[str, dict[str, Any] | str] = {}
                builds: dict[str, list[float]] = {x: [] for x in providers}  # seconds a round

                def job(
                    provider: str,
                    what: str,
                    inp: Path = inp,
                    size: int = size,
                    conf: dict[str, str] | None = None,
                    tag: str = "",
                ) -> dict[str, Any]:
                    return {
                        "conf": {
                            **(before_jar if provider == "ring-lazy-before" else {}),
                            **(conf or {}),
                            **jfr(provider, what),
                        },
                        "provider": provider,
                        "what": what,
                        "seeds": ring.seeds,
                        "partitions": args.partitions,
                        "memory": args.memory,
                        "input": str(inp),
                        "query": args.query,
                        "ckpt": str(work / f"ckpt-{size}" / f"{provider}{tag}"),
                        "timeout": args.timeout,
                    }

                # every build runs the providers' defaults, as a user's query would (the ring's
                # provider writes deltas and its nodes fold snapshots in the background); build
                # round 0 makes the state the restarts read, later rounds (their own checkpoints
                # and stores) only time the build again, the order alternated
                for b_round in range(args.build_rounds):
                    turn = providers if b_round % 2 == 0 else providers[::-1]
                    for provider in turn:
                        if isinstance(built.get(provider), str):
                            continue  # it failed once (out of memory): it fails again
                        # each build starts on quiet nodes: a ring build before it leaves
                        # them folding snapshots, which would take CPU from the next build
                        waited = quiet(ring)
                        print(
                            f"{size} MiB ({keys:,} keys): build {provider} (nodes quiet "
                            f"after {waited:.0f} s) ...",
                            flush=True,
                        )
                        tag = f"-build{b_round}" if b_round else ""
                        what = f"build {size} MiB round {b_round}"
                        pids = [p.proc.pid for p in ring.procs if p.proc is not None and p.alive]
                        nodes_cpu = nodes_seconds(pids)
                        got, wall = call(job(provider, what, tag=tag), log)
                        nodes_cpu = nodes_seconds(pids) - nodes_cpu
                        print(f"  the nodes' CPU during it: {nodes_cpu:.1f} s", flush=True)
                        if b_round == 0:
                            built[provider] = got
                        if not isinstance(got, str):
                            builds[provider].append(got["seconds"])
                        elif b_round:
                            raise SystemExit(f"{provider} build failed ({got}); see {log}")
                        print(f"  {got if isinstance(got, str) else round(got['seconds'], 1)}")
                        if not isinstance(got, str) and "recalled" in got.get("ahead", {}):
                            a = got["ahead"]
                            print(
                                f"  puts recalling a read: {a['recalled']:,}, reading again: "
                                f"{a['recall_misses']:,}"
                            )
                # the ring's restarts read a state whose second batch was written as a snapshot
                # (snapshotInterval=2): the base a lazy restart reads by blocks, as the nodes'
                # compaction (every --snapshot-every versions) makes one in a longer run, where
                # two batches make none. Built once more, on its own stores, and timed apart
                bases: dict[str, str] = {}
                for provider in providers if args.rounds else []:
                    if not provider.startswith("ring") or isinstance(built[provider], str):
                        continue
                    quiet(ring)
                    print(f"{size} MiB: the restarts' base {provider} ...", flush=True)
                    conf = {"spark.statestore.snapshotInterval": "2"}
                    what = f"base {size} MiB"
                    got, wall = call(job(provider, what, conf=conf, tag="-base"), log)
                    if isinstance(got, str):
                        raise SystemExit(f"{provider} base build failed ({got}); see {log}")
                    bases[provider] = "-base"
                    print(f"  {got['seconds']:.1f}")
                    notes.append(
                        f"{size} MiB: {provider} build with the second batch a snapshot "
                        f"{keys / got['seconds']:,.0f} rows/s ({got['seconds']:.1f} s)"
                    )
                ok = [x for x in providers if not isinstance(built[x], str)]
                restarts: dict[str, list[dict[str, Any]]] = {x: [] for x in ok}
                for r in range(args.rounds):
                    # the restart batch, then the next one: each 1% of the keys at random,
                    # or (windowed) a tenth of an hour's keys among the latest 2 hours' keys
                    latest = keys - (keys - 1) // wk * wk + wk if windowed else keys
                    latest = min(latest, keys)
                    for n in (2 + 2 * r, 3 + 2 * r):
                        touched = (
                            keys - latest + rng.choice(latest, min(latest, wk // 10), replace=False)
                            if windowed
                            else rng.choice(keys, max(1, keys // 100), replace=False)
                        )
                        write_batch(
                            inp / f"part-{n:04d}.parquet",
                            touched.astype(np.int64),
                            args.payload,
                            n,
                            wk,
                        )
                    for provider in ok if r % 2 == 0 else ok[::-1]:
                        # each restart starts on quiet nodes (they fold what was written
                        # before in the background). The first restart of a run was once
                        # ~10 s slower; the nodes proved quiet within 5-20 s, so that was
                        # not it (docs/benchmarks.md)
                        waited = quiet(ring)
                        print(f"  the nodes quiet after {waited:.0f} s", flush=True)
                        got, wall = call(
                            job(
                                provider,
                                f"restart {size} MiB round {r}",
                                tag=bases.get(provider, ""),
                            ),
                            log,
                        )
                        if isinstance(got, str):
                            raise SystemExit(f"{provider} restart failed ({got}); see {log}")
                        # the restart: the query's time to the end of its first batch; the
                        # next batch on its own
                        last = got["each"][-1]
                        got = {
                            **got,
                            "seconds": got["seconds"] - last["ms"] / 1000,
                            "fetched": got["fetched"] - last["fetched"],
                            "next": last["ms"] / 1000,
                            "next_fetched": last["fetched"],
                        }
                        restarts[provider].append({**got, "wall": wall})
                        print(
                            f"  restart {provider} round {r}: {got['seconds']:.1f} s "
                            f"(JVM {wall:.1f} s), fetched {got['fetched'] / MiB:.1f} MiB; next "
                            f"batch {got['next']:.1f} s, "
                            f"fetched {got['next_fetched'] / MiB:.1f} MiB"
                            + (f"; read-ahead {got['ahead']}" if got.get("ahead") else ""),
                            flush=True,
                        )
                for lazy in ("ring", "ring-lazy"):
                    if lazy in restarts and "ring-whole" in restarts:
                        lazy_vs = [
                            a["seconds"] / b["seconds"]
                            for a, b in zip(restarts[lazy], restarts["ring-whole"], strict=True)
                        ]
                        notes.append(f"{size} MiB: restart {lazy} / ring-whole {spread(lazy_vs)}x")
                for other in ("ring-lazy-jdk", "ring-lazy-one", "ring-lazy-before"):
                    if "ring-lazy" not in restarts or other not in restarts:
                        continue
                    pairs = list(zip(restarts["ring-lazy"], restarts[other], strict=True))
                    for what in ("seconds", "next", "fetched"):
                        vs = [a[what] / max(b[what], 1e-9) for a, b in pairs]
                        name = {"seconds": "restart", "next": "next batch"}.get(what, what)
                        notes.append(f"{size} MiB: {name} ring-lazy / {other} {spread(vs)}x")
                # what a restart costs beyond a batch: the query's start (planning, the first
                # batch's code generation, the provider's load) as the restart batch's time
                # less the next batch's, per provider
                for provider in ok:
                    starts = [x["seconds"] - x["next"] for x in restarts[provider]]
                    notes.append(f"{size} MiB: {provider} restart - next batch {spread(starts)} s")
                base = "rocksdb" if "rocksdb" in ok else None
                for provider in providers:
                    b = built[provider]
                    if isinstance(b, str):
                        rows_out.append([size, provider, b] + ["-"] * 9)
                        continue
                    rs = restarts[provider]
                    q = [x["seconds"] for x in rs]
                    walls = [x["wall"] for x in rs]
                    vs = (
                        [a / c["seconds"] for a, c in zip(q, restarts[base], strict=True)]
                        if base
                        else []
                    )
                    fetched = [x["fetched"] / MiB for x in rs]
                    nxt = [x["next"] for x in rs]
                    nxt_vs = (
                        [a / c["next"] for a, c in zip(nxt, restarts[base], strict=True)]
                        if base
                        else []
                    )
                    nxt_fetched = [x["next_fetched"] / MiB for x in rs]
                    rate = keys / statistics.median(builds[provider])
                    # rows/s / RocksDB's, round by round (its build seconds / ours)
                    rate_vs = (
                        spread([c / a for a, c in zip(builds[provider], builds[base], strict=True)])
                        + "x"
                        if base
                        else "-"
                    )
                    rows_out.append(
                        [
                            size,
                            provider,
                            f"{rate:,.0f}",
                            rate_vs,
                            f"{b['state'] / MiB:,.0f}",
                            spread(q),
                            spread(walls),
                            spread(vs) + "x" if vs else "-",
                            (spread(fetched) + f" of {size}")
                            if provider.startswith("ring")
                            else "-",
                            spread(nxt),
                            spread(nxt_vs) + "x" if nxt_vs else "-",
                            spread(nxt_fetched) if provider.startswith("ring") else "-",
                        ]
                    )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    headers = "MiB|provider|build rows/s|vs RocksDB|state MiB (memoryUsedBytes)|restart batch s"
    headers += "|restart incl. JVM s|restart / RocksDB|ringBytesFetched MiB (of the state's MiB)"
    headers += "|next batch s|next / RocksDB|next batch's ringBytesFetched MiB"
    print("\n" + table(headers.split("|"), rows_out))
    for line in notes:
        print(line)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(json.loads(sys.argv[2]))
    else:
        main()
