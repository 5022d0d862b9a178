"""Repartitioning a stopped ring-backed query (``spark_connector.repartition``) under real
Spark against real nodes.

Each operator runs at 4 partitions on the ring and on Spark's HDFS-backed provider, over three
phases of input. After phase 1 a repartition of the ring's checkpoints to 8 is refused half-way
(the ring takes no new data: a per-query quota of 0): the checkpoint must be as it was, at 4.
Before phase 2 they are repartitioned to 8 (from the checkpoint the refusal left), before phase
3 to 3. The HDFS-backed queries never change: the final outputs must be equal, and the ring's
state must sit in 4, then 8, then 3 partitions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_connector import SparkConnectorError, repartition
from statestore.cli.local import LocalRing
from tests.ringkit import FAST
from tests.spark.runs import final_output, log_tail, run_job, write_inputs

OPS = ["agg", "dedup", "dedup_wm", "join", "session", "pandas"]


def _repartitioned(base: Path, op: str, n: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        (base / "out" / "ring" / op / f"repartition-{n}.json").read_text()
    )
    return result


def _state_partitions(base: Path, provider: str, op: str) -> set[int]:
    rows = json.loads((base / "out" / provider / op / "state-0.json").read_text())
    return {json.loads(r)["partition_id"] for r in rows}


def _offsets(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())


def _offset_partitions(ckpt: Path) -> int:
    """spark.sql.shuffle.partitions in the newest offset log entry."""
    last = ckpt / "offsets" / str(_offsets(ckpt)[-1])
    meta = json.loads(last.read_text().splitlines()[1])
    return int(meta["conf"]["spark.sql.shuffle.partitions"])


def _run(base: Path, spec: dict[str, Any], name: str) -> None:
    done = run_job(base, spec, name)
    assert done.returncode == 0, log_tail(base, name)


def test_repartition_refuses_bad_arguments_before_spark() -> None:
    for n in (0, -3, True, 2.0):
        with pytest.raises(SparkConnectorError, match="num_partitions"):
            repartition(None, "/tmp/x", n)  # type: ignore[arg-type]
    with pytest.raises(SparkConnectorError, match="threads"):
        repartition(None, "/tmp/x", 4, threads=0)  # type: ignore[arg-type]
    with pytest.raises(SparkConnectorError, match="checkpoint"):
        repartition(None, "", 4)  # type: ignore[arg-type]


@pytest.mark.timeout(2400)
def test_repartition_to_8_then_3_matches_an_unrepartitioned_run(tmp_path: Path) -> None:
    quotas = tmp_path / "quotas.json"
    quotas.write_text("{}")
    ring = LocalRing(str(tmp_path / "ring"), 3, args=[*FAST, "--quota-file", str(quotas)])
    ring.start()
    try:
        spec: dict[str, Any] = {
            "seeds": ring.seeds,
            "providers": ["ring", "hdfs"],
            "operators": OPS,
            "partitions": 4,
            "read_state": [0],
        }
        write_inputs(tmp_path, 1)
        ckpt = tmp_path / "ckpt"
        probes = [
            {"name": "hdfs", "checkpoint": str(ckpt / "hdfs" / "agg"), "partitions": 8},
            {"name": "same", "checkpoint": str(ckpt / "ring" / "agg"), "partitions": 4},
            {"name": "none", "checkpoint": str(tmp_path / "nothing"), "partitions": 8},
        ]
        _run(tmp_path, {**spec, "repartition_probes": probes}, "phase1")
        said = json.loads((tmp_path / "out" / "probes.json").read_text())
        assert "HDFSBackedStateStoreProvider" in said["hdfs"]["error"], said
        assert "SHUFFLE_PARTITIONS_ALREADY_MATCH" in said["same"]["error"], said
        assert "NO_COMMITTED_BATCH" in said["none"]["error"], said
        before = {op: _offsets(tmp_path / "ckpt" / "ring" / op) for op in OPS}

        quotas.write_text(json.dumps({"*": {"max_bytes": 0}}))
        refused = {"provider": "ring", "partitions": 8, "only": True}
        _run(tmp_path, {**spec, "providers": ["ring"], "repartition": refused}, "refused")
        for op in OPS:
            result = _repartitioned(tmp_path, op, 8)
            assert "checkpoint is as it was" in result.get("error", ""), (op, result)
            assert _offsets(tmp_path / "ckpt" / "ring" / op) == before[op], op
            assert _offset_partitions(tmp_path / "ckpt" / "ring" / op) == 4, op
        quotas.write_text("{}")

        for phase, n in ((2, 8), (3, 3)):
            write_inputs(tmp_path, phase)
            step = {**spec, "repartition": {"provider": "ring", "partitions": n}}
            _run(tmp_path, step, f"phase{phase}")
            for op in OPS:
                assert "batch" in _repartitioned(tmp_path, op, n), op
                assert _offset_partitions(tmp_path / "ckpt" / "ring" / op) == n, op
                parts = _state_partitions(tmp_path, "ring", op)
                assert parts <= set(range(n)), (op, parts)
                if n == 8:
                    assert parts - set(range(4)), f"{op}: no state in partitions 4-7"
                assert _state_partitions(tmp_path, "hdfs", op) <= set(range(4)), op

        for op in OPS:
            ring_out = final_output(tmp_path, "ring", op)
            assert ring_out, f"{op} produced no rows"
            assert ring_out == final_output(tmp_path, "hdfs", op), op
    finally:
        ring.stop()


def test_cli_refuses_bad_arguments_without_starting_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from statestore.cli.main import main

    assert (
        main(
            [
                "spark-repartition",  # --seeds left out: $STATESTORE_SEEDS, else the default
                "--checkpoint",
                str(tmp_path / "missing"),
                "--partitions",
                "3",
            ]
        )
        == 2
    )
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "spark-repartition",
                "--seeds",
                "127.0.0.1:7400",
                "--checkpoint",
                str(tmp_path),
                "--partitions",
                "0",
            ]
        )
    assert exit_.value.code == 2
    assert "not a positive integer" in capsys.readouterr().err
