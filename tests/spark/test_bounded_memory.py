"""Bounded memory (issue 38, item 1): the ring provider keeps at most
``spark.statestore.cacheBytes`` of state on the executor's heap and spills the rest to a local
RocksDB store, so a partition larger than the heap does not fail with OutOfMemoryError.

Real Spark (local mode, the driver is the executor) in a subprocess with a small heap, a real
ring node; the job is tests/spark/bounded_job.py (a count-and-max aggregation whose payload
makes each row of state one or two kilobytes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statestore.cli.local import LocalRing
from tests.spark.bounded_job import write_input
from tests.spark.boundedkit import check_batches, log_of, progress, run

# 256 MiB is about the smallest heap in which Spark's own sort-based aggregation (max of a
# string) runs its batches here; 10 batches of 55k new keys, each row of state ~2 KB
# (a 1,925-byte payload), make 1.1 GB of state: 4.3x the heap (110k keys of ~1 KB each
# made the same state in 133 s against 111 s alone, 2026-11-29)
HEAP, KEYS, BATCHES, REPEAT = "256m", 55_000, 10, 30


@pytest.mark.timeout(3000)
def test_state_four_times_the_heap_spills_where_hdfs_backed_runs_out_of_memory(
    tmp_path: Path, ring1: LocalRing
) -> None:
    write_input(tmp_path, KEYS, range(1, BATCHES + 1))
    spec = {
        "seeds": ring1.seeds,
        "heap": HEAP,
        "keys": KEYS,
        "repeat": REPEAT,
        "partitions": 2,
        # commit parts bounded too: two tasks each hold one part while it is sent
        "conf": {"spark.statestore.maxCommitBytes": str(8 << 20)},
    }
    done = run(tmp_path, "ring", {**spec, "provider": "ring"})
    assert done.returncode == 0, log_of(tmp_path, "ring")[-6000:]
    check_batches(tmp_path, "ring", KEYS, range(BATCHES))
    heap = json.loads((tmp_path / "out" / "ring" / "jvm.json").read_text())["maxMemory"]
    last = progress(tmp_path, "ring")[-1]
    custom = last["customMetrics"]
    state = custom["cacheBytes"] + custom["spillBytes"]
    assert last["numRowsTotal"] == KEYS * BATCHES
    assert state >= 4 * heap, (state, heap, last)
    assert custom["spillBytes"] > 0, last
    # what is on the heap is within the cache (default: 20% of the heap)
    assert last["memoryUsedBytes"] == custom["cacheBytes"] <= 0.2 * heap + (1 << 20), last

    done = run(tmp_path, "hdfs", {**spec, "provider": "hdfs"})
    assert done.returncode != 0, "HDFS-backed was to run out of memory"
    assert "java.lang.OutOfMemoryError" in log_of(tmp_path, "hdfs")
    assert not (tmp_path / "out" / "hdfs" / "done").exists()


@pytest.mark.timeout(900)
def test_spilled_state_is_exact_across_batches_and_a_restart(
    tmp_path: Path, ring1: LocalRing
) -> None:
    keys = 10_000
    write_input(tmp_path, keys, range(1, 4))
    spec = {
        "seeds": ring1.seeds,
        "provider": "ring",
        "heap": "512m",
        "keys": keys,
        "repeat": 4,
        "partitions": 2,
        # a 1 MB cache: each partition's version (and the first batch's overlay) spills; the
        # restart restores every row (into the spill store), not lazily
        "conf": {
            "spark.statestore.cacheBytes": str(1_000_000),
            "spark.statestore.lazyRestore": "false",
        },
    }
    done = run(tmp_path, "first", spec)
    assert done.returncode == 0, log_of(tmp_path, "first")[-6000:]
    check_batches(tmp_path, "ring", keys, range(3))
    first = progress(tmp_path, "ring")
    assert all(p["customMetrics"]["spillBytes"] > 0 for p in first), first
    assert first[-1]["customMetrics"]["ringBytesFetched"] == 0  # served from the cache

    # a fresh JVM: the restore streams into the spill store, batch 3 builds on it
    write_input(tmp_path, keys, range(4, 5))
    done = run(tmp_path, "second", spec)
    assert done.returncode == 0, log_of(tmp_path, "second")[-6000:]
    check_batches(tmp_path, "ring", keys, range(3, 4))
    (after,) = progress(tmp_path, "ring")
    custom = after["customMetrics"]
    assert custom["ringRestoredRows"] >= 3 * keys, after  # rows of every delta applied
    assert custom["ringBytesFetched"] > 0 and custom["spillBytes"] > 0, after
    assert after["numRowsTotal"] == 4 * keys
