"""A Spark savepoint moved to another ring (``statestore spark-savepoint`` and
``spark-restore-savepoint``, docs/spark.md "Savepoints"), under real Spark against real nodes.

A counting aggregation runs two batches on ring A; a savepoint of its last batch is taken and
ring A is stopped for good. A damaged copy of the savepoint is refused with nothing loaded.
The savepoint is restored into ring B and a new checkpoint location, and the same query
started there runs batch 2 (not batch 0) over one more file: its counts continue exactly from
the saved state, and the state it leaves is the count over all three files.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from client import RingClient, StoreId
from statestore.cli.local import LocalRing
from statestore.cli.main import main
from statestore.cli.savepoint import ring_query_name
from tests.ringkit import FAST
from tests.spark.runs import event_rows, log_tail, run_job, write_rows


def _totals(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        acc[r["user"]][0] += 1
        acc[r["user"]][1] += r["v"]
    return {u: (n, t) for u, (n, t) in acc.items()}


@pytest.mark.timeout(1200)
def test_a_savepoint_resumes_the_query_on_another_ring_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(39)
    events = tmp_path / "input" / "events"
    first = [event_rows(rng, 0, 60), event_rows(rng, 40, 120)]
    for i, rows in enumerate(first):
        write_rows(events / f"f{i}.json", rows)
    out = tmp_path / "out" / "ring" / "agg"
    spec: dict[str, Any] = {"providers": ["ring"], "operators": ["agg"], "read_state": [0]}
    ring_a = LocalRing(str(tmp_path / "ring-a"), 3, args=FAST)
    ring_a.start()
    try:
        done = run_job(tmp_path, {**spec, "seeds": ring_a.seeds}, "on-a")
        assert done.returncode == 0, log_tail(tmp_path, "on-a")
        assert sorted(p.name for p in out.glob("batch-*.json")) == ["batch-0.json", "batch-1.json"]
        saved = tmp_path / "savepoint"
        argv = ["--checkpoint", str(tmp_path / "ckpt" / "ring" / "agg"), "--out", str(saved)]
        assert main(["spark-savepoint", "--seeds", ",".join(ring_a.seeds), *argv]) == 0
    finally:
        ring_a.stop()  # the old cluster is gone: the state must come from the savepoint
    said = capsys.readouterr()
    assert "saved batch 1 of" in said.out, said
    index = json.loads((saved / "savepoint.json").read_text())
    assert (index["batch_id"], index["store_version"]) == (1, 2)

    new_root = tmp_path / "new-ckpt"
    new_ckpt = new_root / "ring" / "agg"
    ring_b = LocalRing(str(tmp_path / "ring-b"), 3, args=FAST)
    ring_b.start()
    try:
        b_seeds = ",".join(ring_b.seeds)
        restore = ["spark-restore-savepoint", "--seeds", b_seeds, "--checkpoint", str(new_ckpt)]
        bad = tmp_path / "damaged"
        shutil.copytree(saved, bad)
        offsets = bad / "checkpoint" / "offsets" / "1"
        offsets.write_text(offsets.read_text().replace('"logOffset":1', '"logOffset":7'))
        assert main([*restore, "--from", str(bad)]) == 1
        assert "refused, nothing loaded" in capsys.readouterr().err
        assert not new_ckpt.exists()

        assert main([*restore, "--from", str(saved)]) == 0
        said = capsys.readouterr()
        assert "runs batch 2" in said.out, said
        query_id = json.loads((new_ckpt / "metadata").read_text())["id"]
        query = ring_query_name(f"file:{new_ckpt}", query_id)
        assert query != index["source"]["ring_query"]

        extra = event_rows(rng, 100, 200)
        write_rows(events / "f2.json", extra)
        shutil.rmtree(out)
        resumed = {**spec, "seeds": ring_b.seeds, "ckpt_root": str(new_root)}
        done = run_job(tmp_path, resumed, "on-b")
        assert done.returncode == 0, log_tail(tmp_path, "on-b")
        assert sorted(p.name for p in out.glob("batch-*.json")) == ["batch-2.json"]
        with RingClient(ring_b.seeds) as client:
            for part in (0, 1):
                head = client.latest(StoreId(query, 0, part, "default"))
                assert head.version == 3, (part, head)
    finally:
        ring_b.stop()

    everything = _totals([r for rows in first for r in rows] + extra)
    got = {r["user"]: (r["n"], r["total"]) for r in json.loads((out / "batch-2.json").read_text())}
    assert got == {u: everything[u] for u in _totals(extra)}
    state = [json.loads(r) for r in json.loads((out / "state-0.json").read_text())]
    assert {s["key"]["user"] for s in state} == set(everything)
    for s in state:
        n, total = everything[s["key"]["user"]]
        assert s["value"] == {"count": n, "sum": total}, s
