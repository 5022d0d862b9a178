"""Checkpoints on the ring (``checkpointLocation="ring://NAME/path"``, RingFileSystem) under
real Spark against real nodes.

transformWithStateInPandas queries (value, list and map state; one with event-time timers,
one in processing time with a state TTL) run on Spark's RocksDB provider twice: checkpoint on
local disk, and on the ring; an aggregation and session windows run on the ring provider with
their checkpoint on the ring too (nothing of the query on local disk at all). Between the two
phases the driver's local directories (Spark's local dir, where RocksDB keeps its working
copy) are wiped, a ring node is killed, and the event-time query's RocksDB checkpoint on the
ring is repartitioned from 4 to 8 by Spark's own runner. The outputs must equal those of the
same queries on a local checkpoint (RocksDB, resp. HDFS-backed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore.cli.local import LocalRing
from tests.spark.runs import final_output, log_tail, run_job, write_inputs


def _run(base: Path, spec: dict[str, Any], name: str) -> None:
    done = run_job(base, spec, name)
    assert done.returncode == 0, log_tail(base, name)


@pytest.mark.timeout(1800)
def test_queries_on_a_ring_checkpoint_survive_a_wiped_driver_and_a_dead_node(
    tmp_path: Path, ring3: LocalRing
) -> None:
    local = tmp_path / "local"
    spec: dict[str, Any] = {
        "seeds": ring3.seeds,
        "fs": "t-" + uuid.uuid4().hex[:12],
        "partitions": 4,
        "conf": {"spark.local.dir": str(local)},
    }
    runs = [
        (["rocksdb", "rocksdb@ringfs"], ["tws", "tws_ttl"]),
        (["hdfs", "ring@ringfs"], ["agg", "session"]),
    ]
    write_inputs(tmp_path, 1)
    for i, (providers, ops) in enumerate(runs):
        step = {**spec, "providers": providers, "operators": ops, "fs_probe": i == 0}
        _run(tmp_path, step, f"first{i}")
    probe = json.loads((tmp_path / "out" / "fs_probe.json").read_text())
    assert probe == {
        "write_read": True,
        "no_overwrite": "FileAlreadyExistsException",
        "rename": True,
        "old_name_gone": False,
        "new_name": True,
        "big": True,
        "length": True,
        "temp_then_rename": [True, True],
        "list": ["b.txt", "big.bin", "c.txt"],
        "missing": "FileNotFoundException",
        "append": "IOException",
        "delete_dir_not_recursive": "IOException",
        "delete_dir": True,
        "gone": False,
        "bad_name": "IOException",
    }, probe

    shutil.rmtree(local)
    victim = ring3.procs[2]
    assert victim.proc is not None
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait()
    assert not any((tmp_path / "ckpt").glob("*ringfs*")), "a ring checkpoint on local disk"

    write_inputs(tmp_path, 2)
    # Spark's own repartition, on a RocksDB checkpoint kept on the ring
    rep = {"provider": "rocksdb@ringfs", "partitions": 8, "operators": ["tws"]}
    again = {**spec, "spark_repartition": rep}
    for i, (providers, ops) in enumerate(runs):
        _run(tmp_path, {**again, "providers": providers, "operators": ops}, f"second{i}")
    assert (tmp_path / "out" / "rocksdb@ringfs" / "tws" / "spark-repartition-8.json").exists()

    for providers, ops in runs:
        for op in ops:
            local_out = final_output(tmp_path, providers[0], op)
            assert local_out, f"{providers[0]}/{op} produced no rows"
            assert final_output(tmp_path, providers[1], op) == local_out, (providers[1], op)
    kinds = {json.loads(row)["kind"] for row in final_output(tmp_path, "rocksdb", "tws")}
    assert kinds == {"rows", "timer"}, kinds
