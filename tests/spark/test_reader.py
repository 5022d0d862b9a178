"""Spark's state tools on ring-held state against the same on HDFS-backed state.

One JVM (``reader_job.py``) runs each query once on the ring provider and once on Spark's
HDFS-backed provider, 4 shuffle partitions, over the same JSON files (one file per
micro-batch), then reads every query's state with ``format("statestore")`` under each read
below and with ``format("state-metadata")``. Every read gives the same rows (sorted), or the
same error, on both providers, with two documented exceptions (docs/spark.md, "Spark's state
tools"): a change feed where Spark changed one key twice in one batch (the ring keeps a
version's net change per key) and ``snapshotStartBatchId`` at a batch without an HDFS
snapshot file (the ring has no such files: it reads the version from its chain). The ring's
nodes compact every 2 versions, so its chains hold snapshots beside the deltas the change
feed and the replay read.
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
from tests.spark.runs import log_tail, write_inputs

JOB = Path(__file__).with_name("reader_job.py")
OPS = ["agg", "dedup", "dedup_wm", "join", "session", "pandas", "dedup_count"]
JOIN_STORES = [
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
]
CHANGES = {"readChangeFeed": "true", "changeStartBatchId": 0}
SNAPSHOT = {"snapshotStartBatchId": "$snapshot_batch", "snapshotPartitionId": "$snapshot_partition"}


def _read(name: str, op: str, fmt: str = "statestore", **options: Any) -> dict[str, Any]:
    return {"name": name, "op": op, "format": fmt, "options": options}


READS = [
    # each operator's latest state, an older batch, and its change feed
    *(_read(f"{op}-latest", op) for op in ["agg", "dedup", "dedup_wm", "session", "pandas"]),
    *(_read(f"{op}-batch1", op, batchId=1) for op in ["agg", "dedup_wm", "session", "pandas"]),
    _read("dedup-batch0", "dedup", batchId=0),
    *(_read(f"{op}-changes", op, **CHANGES) for op in OPS if op != "join"),
    _read(
        "agg-changes-1-2", "agg", readChangeFeed="true", changeStartBatchId=1, changeEndBatchId=2
    ),
    _read("dedup_wm-changes-2", "dedup_wm", readChangeFeed="true", changeStartBatchId=2),
    # two stateful operators in one query
    _read("dedup_count-op0", "dedup_count", operatorId=0),
    _read("dedup_count-op1", "dedup_count", operatorId=1),
    _read("dedup_count-op1-batch1", "dedup_count", operatorId=1, batchId=1),
    _read("dedup_count-op1-changes", "dedup_count", operatorId=1, **CHANGES),
    # a stream-stream join: each side, the default store name (no such store), each store
    _read("join-left", "join", joinSide="left"),
    _read("join-right", "join", joinSide="right"),
    _read("join-left-batch0", "join", joinSide="left", batchId=0),
    _read("join-right-batch1", "join", joinSide="right", batchId=1),
    _read("join-default", "join"),
    *(_read(f"join-{s}", "join", storeName=s) for s in JOIN_STORES),
    *(_read(f"join-{s}-batch1", "join", storeName=s, batchId=1) for s in JOIN_STORES),
    *(_read(f"join-{s}-changes", "join", storeName=s, **CHANGES) for s in JOIN_STORES),
    # a snapshot the HDFS-backed provider wrote, replayed to the latest batch and to itself
    _read("agg-from-snapshot", "agg", **SNAPSHOT),
    _read("agg-from-snapshot-to-itself", "agg", **SNAPSHOT, batchId="$snapshot_batch"),
    _read("agg-at-no-snapshot-batch", "agg", batchId="$no_snapshot_batch"),
    # refused the same way by Spark on both providers
    _read("join-changes-joinside", "join", joinSide="left", **CHANGES),
    _read("join-joinside-and-store", "join", joinSide="left", storeName="left-keyToNumValues"),
    _read("agg-changes-no-start", "agg", readChangeFeed="true"),
    _read("agg-changes-and-batch", "agg", batchId=1, **CHANGES),
    _read("agg-batch-past-end", "agg", batchId=99),
    _read("agg-operator-missing", "agg", operatorId=5),
    _read("agg-store-missing", "agg", storeName="nothing"),
    _read("agg-snapshot-no-partition", "agg", snapshotStartBatchId=0),
    _read("agg-snapshot-after-batch", "agg", **SNAPSHOT, batchId=0),
    _read(
        "agg-changes-end-before-start",
        "agg",
        readChangeFeed="true",
        changeStartBatchId=2,
        changeEndBatchId=1,
    ),
    # the operators' metadata
    *(_read(f"{op}-metadata", op, "state-metadata") for op in OPS),
    # see test_snapshot_start_without_an_hdfs_snapshot
    _read(
        "agg-from-no-snapshot",
        "agg",
        snapshotStartBatchId="$no_snapshot_batch",
        snapshotPartitionId="$snapshot_partition",
    ),
]
# Spark changes some keys twice within one batch here: a session merged again, a join row
# stored and then marked matched (see test_change_feed_is_the_net_change_of_each_batch)
CHANGED_TWICE = {"session-changes", "join-left-keyWithIndexToValue-changes"}
NOT_EQUAL = {"agg-from-no-snapshot", *CHANGED_TWICE}
# the ring provider again, sending every 2nd version whole: those versions have no delta of
# their own, and their changes are the difference between two whole versions
WHOLE = {
    "provider": "ring",
    "confs": {"spark.statestore.snapshotInterval": "2"},
    "operators": ["agg", "dedup_wm", "session"],
}


@pytest.fixture(scope="module")
def reads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("reader")
    ring = LocalRing(str(base / "ring"), 3, args=[*FAST, "--snapshot-every", "2"]).start()
    try:
        write_inputs(base, 1)
        write_inputs(base, 2)
        spec = {
            "base": str(base),
            "seeds": ring.seeds,
            "providers": ["ring", "hdfs"],
            "operators": OPS,
            "partitions": 4,
            "reads": READS,
            "variants": {"ring_whole": WHOLE},
            "confs": {
                # the HDFS-backed provider writes snapshot files in its maintenance
                "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
                "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
            },
        }
        (base / "spec.json").write_text(json.dumps(spec))
        with open(base / "job.log", "w") as log:
            done = subprocess.run(
                [sys.executable, str(JOB), str(base / "spec.json")],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=1200,
                check=False,
            )
        assert done.returncode == 0, log_tail(base, "job")
        out: dict[str, Any] = {
            p: json.loads((base / "out" / p / "reads.json").read_text())
            for p in ("ring", "hdfs", "ring_whole")
        }
        out["snapshots"] = json.loads((base / "out" / "snapshots.json").read_text())
        yield out
    finally:
        ring.stop()


def _answer(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "ordered"}


def _partitions(rows: list[str]) -> set[int]:
    return {json.loads(r)["partition_id"] for r in rows}


def net_changes(ordered: list[str]) -> list[str]:
    """An oracle for the ring's change feed from HDFS-backed's (read from batch 0, in Spark's
    order): per partition, batch and key the last change, and nothing for a key that did
    not exist before the batch and was deleted within it."""
    state: dict[tuple[int, str], bool] = {}  # (partition, key) -> present
    batches: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for row in map(json.loads, ordered):
        key = json.dumps(row["key"], sort_keys=True)
        batches.setdefault((row["partition_id"], row["batch_id"]), {})[key] = row
    out = []
    for (part, _batch), last in sorted(batches.items()):
        for key, row in last.items():
            existed = state.get((part, key), False)
            deleted = row["change_type"] == "delete"
            state[(part, key)] = not deleted
            if not (deleted and not existed):
                out.append(json.dumps(row, sort_keys=True))
    return sorted(out)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", [r["name"] for r in READS if r["name"] not in NOT_EQUAL])
def test_reader_matches_hdfs(reads: dict[str, Any], name: str) -> None:
    assert _answer(reads["ring"][name]) == _answer(reads["hdfs"][name])


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "name",
    [r["name"] for r in READS if r["op"] in WHOLE["operators"] and r["name"] not in NOT_EQUAL],
)
def test_reader_matches_hdfs_on_versions_sent_whole(reads: dict[str, Any], name: str) -> None:
    assert _answer(reads["ring_whole"][name]) == _answer(reads["hdfs"][name])


@pytest.mark.timeout(1200)
def test_reads_see_state_of_every_partition(reads: dict[str, Any]) -> None:
    # a comparison of two empty answers would prove nothing: the reads that must hold rows
    for name in ["agg-latest", "dedup-latest", "join-left", "session-latest", "agg-changes"]:
        rows = reads["ring"][name]["rows"]
        assert rows, name
        assert len(_partitions(rows)) > 1, name
    changes = [json.loads(r) for r in reads["ring"]["dedup_wm-changes"]["rows"]]
    assert {c["change_type"] for c in changes} == {"update", "delete"}
    assert reads["ring"]["agg-batch1"] != reads["ring"]["agg-latest"]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", [r["name"] for r in READS if r["name"].endswith("-changes")])
def test_change_feed_is_the_net_change_of_each_batch(reads: dict[str, Any], name: str) -> None:
    """The ring keeps each version's net change per key (its delta), HDFS-backed every put
    and remove Spark made: where Spark touched a key once per batch they are the same."""
    hdfs = reads["hdfs"][name]
    assert reads["ring"][name]["rows"] == net_changes(hdfs["ordered"])
    if name in reads["ring_whole"] and name not in CHANGED_TWICE:
        # (sessions: Spark puts unchanged sessions again, which a difference cannot show)
        assert reads["ring_whole"][name]["rows"] == net_changes(hdfs["ordered"])
    if name in CHANGED_TWICE:
        assert len(hdfs["rows"]) > len(reads["ring"][name]["rows"])


@pytest.mark.timeout(1200)
def test_snapshot_start_without_an_hdfs_snapshot(reads: dict[str, Any]) -> None:
    """Where the HDFS-backed provider has no snapshot file, Spark fails the read; the ring
    rebuilds that version from its chain, so the read gives the partition's state."""
    choice = reads["snapshots"]["agg"]
    if choice["$no_snapshot_batch"] < 0:
        pytest.skip("HDFS-backed maintenance snapshotted every batch of that partition")
    hdfs = reads["hdfs"]["agg-from-no-snapshot"]
    assert "CANNOT_LOAD_STATE_STORE.UNCATEGORIZED" in hdfs["error"]["conditions"], hdfs
    assert hdfs["error"]["root"].endswith("StateStoreSnapshotFileNotFound"), hdfs
    ring = reads["ring"]["agg-from-no-snapshot"]["rows"]
    part = choice["$snapshot_partition"]
    latest = reads["hdfs"]["agg-latest"]["rows"]
    assert ring and ring == [r for r in latest if json.loads(r)["partition_id"] == part]
