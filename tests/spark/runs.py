"""Running the suite's Spark jobs from a test: the inputs of each phase, one job in its own
JVM (``jobs.py``, its log kept), and what it wrote (the final output per provider and operator,
the provider's local partition folders)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

JOBS = Path(__file__).with_name("jobs.py")
T0 = datetime(2024, 1, 1)
LAST_PER_KEY = {"agg": "user", "pandas": "user"}


def _ts(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def event_rows(rng: random.Random, lo: int, hi: int, n: int = 24) -> list[dict[str, Any]]:
    ids = [rng.randrange(lo, hi) for _ in range(n)]
    return [
        {"user": f"u{(i * 7 + rng.randrange(2)) % 5}", "id": i, "ts": _ts(i * 0.5), "v": i % 9 + 1}
        for i in ids
    ]


def _side(prefix: str, ids: list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "ts": _ts(i), "x": f"{prefix}{i}"} for i in ids]


def write_inputs(base: Path, phase: int) -> list[dict[str, Any]]:
    """Two files per source and phase (one micro-batch each); returns the events written."""
    rng = random.Random(phase)
    inp = base / "input"
    if phase == 1:
        files = {"f0": event_rows(rng, 0, 60), "f1": event_rows(rng, 40, 120)}
        left = {"l0": list(range(0, 30)), "l1": list(range(30, 60))}
        right = {"r0": list(range(10, 20))}
    elif phase == 2:
        files = {"f2": event_rows(rng, 100, 180), "f3": event_rows(rng, 300, 400)}
        left = {"l2": list(range(60, 70))}
        right = {"r1": [*range(0, 10), *range(40, 50)], "r2": [*range(60, 65), *range(20, 26)]}
    elif phase == 3:
        files = {"f4": event_rows(rng, 150, 350), "f5": event_rows(rng, 380, 460)}
        left = {"l3": list(range(70, 90))}
        right = {"r3": [*range(26, 30), *range(66, 80)]}
    else:
        files = {"f6": event_rows(rng, 440, 520)}
        left = {"l4": list(range(90, 95))}
        right = {"r4": [*range(84, 96)]}
    for name, rows in files.items():
        write_rows(inp / "events" / f"{name}.json", rows)
    for name, ids in left.items():
        write_rows(inp / "left" / f"{name}.json", _side("l", ids))
    for name, ids in right.items():
        write_rows(inp / "right" / f"{name}.json", _side("r", ids))
    return [r for rows in files.values() for r in rows]


def run_job(
    base: Path, spec: dict[str, Any], name: str, *, job: Path = JOBS, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    """Run ``job`` (a Spark job script) in its own JVM on ``spec`` (written as
    ``base/<name>.json``, with ``base`` added); its output goes to ``base/<name>.log``."""
    spec_path = base / f"{name}.json"
    spec_path.write_text(json.dumps({"base": str(base), **spec}))
    args = [sys.executable, str(job), str(spec_path)]
    with open(base / f"{name}.log", "w") as log:
        # its own session: the JVM spark-submit starts may outlive the Python driver, still
        # running its shutdown hooks (deleting spark.local.dir's spark-* folders), and so may
        # PySpark's workers (in groups of their own); the job is over when every process of
        # the session is
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except BaseException:  # timed out, interrupted: nothing of the job left running
            _end_session(proc.pid, grace=0)
            proc.wait()
            raise
        _end_session(proc.pid)
    return subprocess.CompletedProcess(args, code)


def _end_session(sid: int, grace: float = 60.0) -> None:
    """Wait up to ``grace`` seconds for every process of session ``sid`` to end; kill what
    is left, and wait for it to go."""
    deadline = time.monotonic() + grace
    killed = False
    while pids := _running_in_session(sid):
        if time.monotonic() >= deadline:
            if killed:
                return  # not gone 30 s after SIGKILL (stuck in the kernel): left to it
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + 30
        time.sleep(0.1)


def _running_in_session(sid: int) -> list[int]:
    """The processes of session ``sid`` still running (a zombie no one reaps is over)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def log_tail(base: Path, name: str) -> str:
    return (base / f"{name}.log").read_text(errors="replace")[-6000:]


def final_output(base: Path, provider: str, op: str) -> Any:
    out = base / "out" / provider / op
    batches = sorted(out.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    assert batches, f"{provider}/{op} wrote no batch"
    if op in LAST_PER_KEY:
        key = LAST_PER_KEY[op]
        last: dict[str, Any] = {}
        for b in batches:
            for row in json.loads(b.read_text()):
                last[row[key]] = row
        return last
    rows = [json.dumps(r, sort_keys=True) for b in batches for r in json.loads(b.read_text())]
    return sorted(rows)


def drop_partition_folders(ckpt: Path) -> int:
    """Delete state/<op>/<partition> (keep state/<op>/_metadata): all the provider could
    have left on local disk. Returns how many folders went."""
    gone = 0
    for op_dir in (ckpt / "state").iterdir():
        for part in op_dir.iterdir():
            if part.name.isdigit():
                shutil.rmtree(part)
                gone += 1
    return gone
