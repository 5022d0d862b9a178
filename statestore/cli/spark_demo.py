"""The Spark part of ``statestore demo``: a streaming query keeps its state on the ring.

Windowed counts over generated sensor events run in one JVM; a ring node is killed with
``kill -9``; the query restarts in a fresh JVM with its local state folders deleted and finds
its state on the ring: the final counts equal the ones computed here from all the events.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from statestore.cli.local import LocalRing

__all__ = ["run_spark_demo"]

T0 = datetime(2024, 1, 1, 12, 0, 0)


def _write_events(
    events_dir: Path, name: str, rng: random.Random, start: int
) -> list[dict[str, str]]:
    rows = []
    for _ in range(400):
        ts = T0 + timedelta(seconds=start + rng.uniform(0, 30))
        rows.append(
            {"sensor": f"s{rng.randrange(4)}", "ts": ts.isoformat(), "value": str(rng.random())}
        )
    events_dir.mkdir(parents=True, exist_ok=True)
    (events_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _window(ts: str) -> str:
    t = datetime.fromisoformat(ts)
    start = t - timedelta(seconds=t.second % 10, microseconds=t.microsecond)
    return start.strftime("%Y-%m-%d %H:%M:%S")


def _run_query(base: Path, seeds: list[str], console: Console, label: str) -> float:
    spec = json.dumps({"base": str(base), "seeds": seeds})
    started = time.perf_counter()
    with (
        console.status(f"{label}: a fresh JVM runs the query..."),
        open(base / "spark.log", "a") as log,
    ):
        done = subprocess.run(
            [sys.executable, "-m", "spark_connector._demo_job", spec],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        tail = (base / "spark.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Spark job failed ({label}):\n{tail}")
    return time.perf_counter() - started


def _final_counts(out: Path) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    batches = sorted(out.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    for b in batches:
        for r in json.loads(b.read_text()):
            counts[(r["window"], r["sensor"])] = r["n"]
    return counts


def run_spark_demo(seeds: list[str], ring: LocalRing) -> int:
    """Run the demo against ``ring`` (seeds: its addresses). Returns 0 when the restored
    query's counts equal the expected ones."""
    from spark_connector import SparkConnectorError, jar_path

    console = Console()
    console.rule("Spark on the ring")
    try:
        with console.status("building the RingStateStoreProvider jar (first use only)..."):
            jar = jar_path()
    except SparkConnectorError as exc:
        console.print(f"[red]Spark demo skipped:[/] {exc}")
        return 1
    console.print(f"provider jar: {jar}")
    base = Path(ring.base_dir) / "spark-demo"
    shutil.rmtree(base, ignore_errors=True)
    rng = random.Random(11)
    events = []
    for i in range(3):
        events += _write_events(base / "events", f"part-{i}.json", rng, 30 * i)
    took = _run_query(base, seeds, console, "run 1")
    console.print(f"run 1: 3 micro-batches of windowed counts committed to the ring ({took:.1f} s)")

    alive = [i for i, p in enumerate(ring.procs) if p.alive]
    if len(alive) >= 3:  # W=2 of R=3 still holds with one node down
        victim = ring.procs[alive[-1]]
        console.print(f"[bold red]kill -9[/] node {victim.id} at {victim.address}")
        ring.kill(alive[-1])
    else:
        console.print(f"{len(alive)} nodes up: none is killed (the ring needs W of them)")
    gone = 0
    for op_dir in (base / "checkpoint" / "state").iterdir():
        for part in op_dir.iterdir():
            if part.name.isdigit():
                shutil.rmtree(part)
                gone += 1
    console.print(f"deleted {gone} local state partition folders of the checkpoint")
    for i in range(3, 5):
        events += _write_events(base / "events", f"part-{i}.json", rng, 30 * i - 15)
    took = _run_query(base, seeds, console, "run 2")

    expected: dict[tuple[str, str], int] = {}
    for e in events:
        key = (_window(e["ts"]), e["sensor"])
        expected[key] = expected.get(key, 0) + 1
    got = _final_counts(base / "out")
    lines = (base / "out" / "metrics.jsonl").read_text().splitlines()
    metrics = json.loads(lines[-1])
    same = got == expected
    table = Table(title="run 2: a fresh JVM, state restored from the ring")
    for col in ("windows", "events", "restored rows", "restore ms", "cache misses", "identical"):
        table.add_column(col)
    table.add_row(
        str(len(got)),
        str(len(events)),
        str(metrics.get("ringRestoredRows", 0)),
        str(metrics.get("ringRestoreTimeMs", 0)),
        str(metrics.get("ringCacheMissCount", 0)),
        "[green]yes[/]" if same else "[red]NO[/]",
    )
    console.print(table)
    sample = Table(title="some windows")
    for col in ("window", "sensor", "count"):
        sample.add_column(col)
    for (w, s), n in sorted(got.items())[:6]:
        sample.add_row(w, s, str(n))
    console.print(sample)
    console.print(f"run 2 took {took:.1f} s (JVM start included); Spark log: {base / 'spark.log'}")
    return 0 if same else 1
