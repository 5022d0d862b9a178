"""Lazy restore (issue 38, item 2): with ``spark.statestore.lazyRestore=true`` a restarted query
loads nothing of a partition's base but its chunks' indexes; a batch reads, of the keys it
touches, the one block each can be in (blocked chunks, core/chunk.py).

Real Spark (local mode) in a subprocess, a real ring node; the job is tests/spark/bounded_job.py
(a count-and-max aggregation). Three batches in a first JVM, then a fresh JVM (no local
state) runs batch 4, which revisits every thousandth earlier key, lazily without a prefetch;
a third runs batch 5 lazily with the background prefetch (the default); a fourth runs batch 6
with a whole restore. Every output is exact, the lazy batch fetched a small part of what the
whole restore did, and the prefetch merged the base.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from statestore.cli.local import LocalRing, http_json
from tests.spark.bounded_job import write_input
from tests.spark.boundedkit import check_batches, log_of, progress, run


@pytest.mark.timeout(1200)
def test_a_restart_reads_what_the_batch_touches(tmp_path: Path, ring1: LocalRing) -> None:
    keys = 20_000
    write_input(tmp_path, keys, range(1, 4))
    spec = {
        "seeds": ring1.seeds,
        "provider": "ring",
        "heap": "512m",
        "keys": keys,
        "repeat": 2,
        "partitions": 2,
        # version 3 is a snapshot (the base the restart loads lazily), 4 and 5 deltas; each
        # partition's version (~6 MB) is split in 4 shards, whose chains and indexes a lazy
        # load reads at once
        "conf": {
            "spark.statestore.lazyRestore": "true",
            "spark.statestore.snapshotInterval": "3",
            "spark.statestore.maxCommitBytes": str(2 << 20),
        },
    }
    done = run(tmp_path, "first", spec)
    assert done.returncode == 0, log_of(tmp_path, "first")[-6000:]
    check_batches(tmp_path, "ring", keys, range(3))
    held = http_json(ring1.seeds[0], "/v1/stores")
    assert isinstance(held, dict)
    shards = [m.group(1) for p in held["stores"] if (m := re.search(r"\.s(\d+)$", p))]
    assert sorted(shards) == sorted(["1", "2", "3"] * 2), held  # 4 shards a partition

    write_input(tmp_path, keys, range(4, 5))
    # a small cache: its block LRU (1/8 of it, at least 256 KiB) holds fewer blocks than the
    # task touches, so a key's block must be read once, not again at the write store's get
    # and the commit (the memo of looked-up rows); the version spills to the local store
    # (the background prefetch is off: it would read the whole base while the batch runs)
    small = {
        **spec["conf"],
        "spark.statestore.cacheBytes": str(2 << 20),
        "spark.statestore.prefetchBytesPerSec": "0",
    }
    done = run(tmp_path, "lazy", {**spec, "conf": small})
    assert done.returncode == 0, log_of(tmp_path, "lazy")[-6000:]
    check_batches(tmp_path, "ring", keys, range(3, 4))
    (lazy,) = progress(tmp_path, "ring")
    assert lazy["numRowsTotal"] == 4 * keys, lazy  # the count the commit recorded, kept
    # loaded lazily: no row of the base (the snapshot of version 3) was restored
    assert lazy["customMetrics"]["ringRestoredRows"] == 0, lazy

    # the default: lazy, and the base prefetched in the background while the batch runs (its
    # merges race the batch's reads and its commit); the output is exact either way, and by
    # the end the prefetch merged the base's chunks
    write_input(tmp_path, keys, range(5, 6))
    done = run(tmp_path, "prefetch", {**spec, "prefetch": True})
    assert done.returncode == 0, log_of(tmp_path, "prefetch")[-6000:]
    check_batches(tmp_path, "ring", keys, range(4, 5))
    (fetched,) = progress(tmp_path, "ring")
    assert fetched["numRowsTotal"] == 5 * keys, fetched
    # loaded lazily: the rows of version 4's delta, not the base's 60,000
    assert fetched["customMetrics"]["ringRestoredRows"] < 2 * keys, fetched
    prefetch = json.loads((tmp_path / "out" / "ring" / "prefetch.json").read_text())
    assert prefetch["idle"] and prefetch["merged"] >= 2, prefetch  # a chunk a partition at least

    write_input(tmp_path, keys, range(6, 7))
    whole_spec = {**spec, "conf": {**spec["conf"], "spark.statestore.lazyRestore": "false"}}
    done = run(tmp_path, "whole", whole_spec)
    assert done.returncode == 0, log_of(tmp_path, "whole")[-6000:]
    check_batches(tmp_path, "ring", keys, range(5, 6))
    (whole,) = progress(tmp_path, "ring")
    assert whole["numRowsTotal"] == 6 * keys, whole
    assert whole["customMetrics"]["ringRestoredRows"] >= 5 * keys, whole
    fetched_lazy = lazy["customMetrics"]["ringBytesFetched"]
    fetched_whole = whole["customMetrics"]["ringBytesFetched"]
    # batch 4 read its deltas, the indexes and a block per revisited key; batch 5 everything
    assert 0 < fetched_lazy < 0.25 * fetched_whole, (fetched_lazy, fetched_whole)
