"""Running tests/spark/bounded_job.py in its own JVM and reading what it wrote (the bounded
memory and lazy restore tests)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.spark.bounded_job import expect
from tests.spark.runs import run_job

JOB = Path(__file__).resolve().parent / "bounded_job.py"


def run(base: Path, name: str, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return run_job(base, spec, name, job=JOB, timeout=1500)


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
