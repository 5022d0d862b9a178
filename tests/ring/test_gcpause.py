"""The garbage collector in a node: what a daemon freezes once started, and the pauses it
reports in ``GET /metrics`` (node/gcpause.py). Real node processes on port 0: the freeze
and the timing are process-wide, so only a process of its own shows them."""

from __future__ import annotations

import gc
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from statestore.node.gcpause import Pauses
from tests.ringkit import FAST, local_ring


def figures(address: str) -> dict[tuple[str, str], float]:
    """``(sample name, generation label)`` -> value for the ``statestore_gc_*`` samples."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, s.labels.get("generation", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("statestore_gc_")
    }


def test_gc_freeze_freezes_what_a_node_started_with_and_pauses_are_timed(tmp_path: Path) -> None:
    with (
        local_ring(tmp_path / "on", 1) as on,  # the default
        local_ring(tmp_path / "off", 1, [*FAST, "--no-gc-freeze"]) as off,
    ):
        frozen = figures(on.procs[0].address)
        kept = figures(off.procs[0].address)
    # a started node's modules, classes and app: tens of thousands of objects
    assert frozen[("statestore_gc_frozen_objects", "")] > 10_000
    assert kept[("statestore_gc_frozen_objects", "")] == 0
    for f in (frozen, kept):
        # a node allocates as it starts and serves: young passes have run, and were timed
        assert f[("statestore_gc_pauses_total", "0")] > 0
        assert f[("statestore_gc_pause_seconds_total", "0")] > 0
        assert f[("statestore_gc_pause_longest_seconds", "0")] > 0
        assert ("statestore_gc_pauses_total", "2") in f


def test_pauses_count_and_time_each_pass_by_generation() -> None:
    pauses = Pauses()
    pauses.install()
    pauses.install()  # once per process: a second call adds no second hook
    try:
        assert gc.callbacks.count(pauses._on_pass) == 1
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses._on_pass)
    assert pauses.count[1] >= 1 and pauses.count[2] >= 1
    assert pauses.seconds[2] > 0 and 0 < pauses.longest[2] <= pauses.seconds[2]
