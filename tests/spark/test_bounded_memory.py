"""Bounded memory (issue 38, item 1): the ring provider keeps at most
``spark.statestore.cacheBytes`` of state on the executor's heap and spills the rest to a local
RocksDB store, so a partition larger than the heap does not fail with OutOfMemoryError.

Real Spark (local mode, the driver is the executor) in a subprocess with a small heap, a real
ring node; the job is tests/spark/bounded_job.py (a count-and-max aggregation whose payload
makes each row of state about a kilobyte).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore.cli.local import LocalRing
from tests.ringkit import FAST
from tests.spark.bounded_job import expect, write_input

JOB = Path(__file__).resolve().parent / "bounded_job.py"


@pytest.fixture
def ring1(tmp_path: Path) -> Iterator[LocalRing]:
    """One node process, one copy of each chunk (the test is about the JVM's heap)."""
    ring = LocalRing(str(tmp_path / "ring"), 1, args=[*FAST, "--replicas", "1"]).start()
    try:
        yield ring
    finally:
        ring.stop()


def run(base: Path, name: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    spec_path = base / f"{name}.json"
    spec_path.write_text(json.dumps({"base": str(base), **spec}))
    with open(base / f"{name}.log", "w") as log:
        return subprocess.run(
            [sys.executable, str(JOB), str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1500,
            check=False,
        )


def log_of(base: Path, name: str) -> str:
    return (base / f"{name}.log").read_text(errors="replace")


def batch(base: Path, provider: str, batch_id: int) -> dict[str, int]:
    out: dict[str, int] = json.loads(
        (base / "out" / provider / f"batch-{batch_id}.json").read_text()
    )
    return out


def progress(base: Path, provider: str) -> list[dict[str, Any]]:
    lines = (base / "out" / provider / "progress.jsonl").read_text().splitlines()
    return [json.loads(line)[0] for line in lines]


def check_batches(base: Path, provider: str, keys: int, ids: range) -> None:
    for i in ids:
        got = batch(base, provider, i)
        want = expect(keys, i + 1)
        assert {k: got[k] for k in want} == want, (i, got)


# 256 MiB is about the smallest heap in which Spark's own sort-based aggregation (max of a
# string) runs its batches here; 10 batches of 110k new keys, each row of state ~1 KB
# (a 896-byte payload), make 1.1 GB of state: 4.2x the heap
HEAP, KEYS, BATCHES, REPEAT = "256m", 110_000, 10, 14


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
        # a 1 MB cache: each partition's version (and the first batch's overlay) spills
        "conf": {"spark.statestore.cacheBytes": str(1_000_000)},
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
