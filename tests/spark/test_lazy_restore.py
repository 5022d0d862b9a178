"""Lazy restore (issue 38, item 2): with ``spark.statestore.lazyRestore=true`` a restarted query
loads nothing of a partition's base; a batch reads, of the keys it touches, what the nodes
answer for them (read ahead) or the one block each can be in (blocked chunks, core/chunk.py).

Real Spark (local mode) in a subprocess, a real ring node folding a snapshot every 2 deltas;
the job is tests/spark/bounded_job.py (a count-and-max aggregation). Three batches in a first
JVM, then a fresh JVM (no local state) runs batches 4-9, each revisiting every thousandth
earlier key, lazily without a prefetch (past 5 versions it loads again over a newer snapshot
the nodes folded, not whole); a third runs batch 10 lazily with the background prefetch (the
default); a fourth runs batch 11 with a whole restore. Every output is exact, the first lazy
batch fetched a small part of what the whole restore did, and the prefetch merged the base.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore.cli.local import LocalRing, http_json
from tests.ringkit import FAST
from tests.spark.bounded_job import write_input
from tests.spark.boundedkit import check_batches, log_of, progress, run


@pytest.fixture
def folding_ring(tmp_path: Path) -> Iterator[LocalRing]:
    """One node, one copy, whose compaction folds a snapshot every 2 deltas: a lazily loaded
    version kept for several batches sees newer bases appear under it."""
    ring = LocalRing(
        str(tmp_path / "ring"), 1, args=[*FAST, "--replicas", "1", "--snapshot-every", "2"]
    ).start()
    try:
        yield ring
    finally:
        ring.stop()


def local_bytes(p: dict[str, Any]) -> int:
    """What a batch's version holds itself (heap and spill), not what it reads of its base."""
    custom = p["customMetrics"]
    return int(custom["cacheBytes"]) + int(custom["spillBytes"])


@pytest.mark.timeout(1200)
def test_a_restart_reads_what_the_batch_touches(tmp_path: Path, folding_ring: LocalRing) -> None:
    ring1 = folding_ring
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
        # partition's version (~6 MB) is split in 4 shards, whose chains a lazy load reads at
        # once
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

    write_input(tmp_path, keys, range(4, 10))
    # six batches in one JVM (versions 4-9), each a delta (no snapshotInterval): the nodes
    # fold snapshots of versions 5 and 7 meanwhile. A small cache: its block LRU (1/8 of
    # it, at least 256 KiB) holds fewer blocks than the task touches, so a key's block must
    # be read once, not again at the write store's get and the commit (the memo of
    # looked-up rows); the version spills to the local store (the background prefetch is
    # off: it would read the whole base while the batch runs)
    small = {
        **spec["conf"],
        # its batches revisit a few keys of each chunk: read ahead however few
        "spark.statestore.readAheadMinKeys": "1",
        "spark.statestore.snapshotInterval": "0",
        "spark.statestore.cacheBytes": str(2 << 20),
        "spark.statestore.prefetchBytesPerSec": "0",
    }
    done = run(tmp_path, "lazy", {**spec, "conf": small})
    assert done.returncode == 0, log_of(tmp_path, "lazy")[-6000:]
    check_batches(tmp_path, "ring", keys, range(3, 9))
    batches = progress(tmp_path, "ring")
    assert [b["numRowsTotal"] for b in batches] == [n * keys for n in range(4, 10)], batches
    lazy = batches[0]  # the count the commit recorded, kept
    # the batches' revisited keys came in lookups before the restore read them one by one
    # (ReadAhead.scala), those of a chunk together
    ahead = json.loads((tmp_path / "out" / "ring" / "readahead.json").read_text())
    assert ahead["keys"] >= ahead["lookups"] > 0 and ahead["failed"] == 0, ahead
    # loaded lazily: no row of the base (the snapshot of version 3) was restored
    assert lazy["customMetrics"]["ringRestoredRows"] == 0, lazy
    # version 8 is 5 versions past its base (the horizon): its chains, read again, start at
    # a newer snapshot the nodes folded, and it is loaded lazily over that one (a miss: the
    # delta above the new base), not read whole; so the last batch's
    # version holds about what changed since that base, not every row
    horizon = batches[5]
    assert horizon["customMetrics"]["ringCacheMissCount"] > 0, horizon
    assert all(b["customMetrics"]["ringCacheMissCount"] == 0 for b in batches[1:5]), batches
    # the first lazy batch's version holds its own 20,000 rows; over the snapshot of 7, the
    # horizon's holds 2 versions' worth, over that of 5 (if the node had not folded 7 yet)
    # 4, where a whole version holds all 9
    assert local_bytes(horizon) < 6 * local_bytes(lazy), (lazy, horizon)

    # the default: lazy, and the base prefetched in the background while the batch runs (its
    # merges race the batch's reads and its commit); the output is exact either way, and by
    # the end the prefetch merged the base's chunks
    write_input(tmp_path, keys, range(10, 11))
    done = run(tmp_path, "prefetch", {**spec, "prefetch": True})
    assert done.returncode == 0, log_of(tmp_path, "prefetch")[-6000:]
    check_batches(tmp_path, "ring", keys, range(9, 10))
    (fetched,) = progress(tmp_path, "ring")
    assert fetched["numRowsTotal"] == 10 * keys, fetched
    # loaded lazily: the rows of the deltas above the newest snapshot, not the base's 180,000
    assert fetched["customMetrics"]["ringRestoredRows"] < 3 * keys, fetched
    prefetch = json.loads((tmp_path / "out" / "ring" / "prefetch.json").read_text())
    assert prefetch["idle"] and prefetch["merged"] >= 2, prefetch  # a chunk a partition at least

    write_input(tmp_path, keys, range(11, 12))
    whole_spec = {**spec, "conf": {**spec["conf"], "spark.statestore.lazyRestore": "false"}}
    done = run(tmp_path, "whole", whole_spec)
    assert done.returncode == 0, log_of(tmp_path, "whole")[-6000:]
    check_batches(tmp_path, "ring", keys, range(10, 11))
    (whole,) = progress(tmp_path, "ring")
    assert whole["numRowsTotal"] == 11 * keys, whole
    assert whole["customMetrics"]["ringRestoredRows"] >= 10 * keys, whole
    fetched_lazy = lazy["customMetrics"]["ringBytesFetched"]
    fetched_whole = whole["customMetrics"]["ringBytesFetched"]
    # batch 4 read its deltas and what its revisited keys needed; batch 5 everything
    assert 0 < fetched_lazy < 0.25 * fetched_whole, (fetched_lazy, fetched_whole)
