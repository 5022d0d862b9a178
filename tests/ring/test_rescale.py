"""Rescaling a keyed operator by key group on a real ring: 4 -> 7 -> 2 partitions, exact state.

Also the pure parts: the key-group ranges of M partitions tile 0..G-1 and agree with
``partition_of``; a key-group restore fetches only the chunks that hold the range.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client import InvalidRequest, RingClient, StoreId
from client.rescale import groups_of, partition_of, rescale
from statestore.cli.local import LocalRing
from statestore.core.chunk import key_group
from statestore.core.keygroups import check_groups, merge_positions
from tests.ringkit import local_ring


@given(st.integers(1, 128), st.binary(min_size=1, max_size=32))
def test_ranges_tile_the_groups_and_agree_with_partition_of(parts: int, key: bytes) -> None:
    ranges = [groups_of(i, parts) for i in range(parts)]
    assert [g for r in ranges for g in r] == list(range(128))
    assert key_group(key, 128) in ranges[partition_of(key, parts)]


@pytest.mark.parametrize("bad", [range(0, 0), range(5, 2), range(0, 129), range(0, 10, 2), [1, 2]])
def test_bad_key_group_ranges_are_refused(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="key_groups"):
        check_groups(bad, 128)


def test_positions_carry_the_smallest_offset_per_source() -> None:
    assert merge_positions([{"a": 5, "b": 1}, {"a": 3}, {"c": "x"}]) == {"a": 3, "b": 1, "c": "x"}


def _operator_run(
    ring: RingClient, stores: list[StoreId], events: list[tuple[bytes, int]], start: int, epoch: int
) -> int:
    """A keyed sum over ``events`` in batches of 50, partitioned with partition_of, committing
    a delta per partition per batch; returns the last version."""
    parts = len(stores)
    state = [dict(ring.restore(s)) if start > 0 else {} for s in stores]
    version = start
    for b in range(0, len(events), 50):
        version += 1
        dirty: list[dict[bytes, bytes]] = [{} for _ in stores]
        for key, amount in events[b : b + 50]:
            p = partition_of(key, parts)
            total = int(state[p].get(key, b"0")) + amount
            state[p][key] = dirty[p][key] = str(total).encode()
        for p, sid in enumerate(stores):
            ring.commit(sid, version, dirty[p], positions={"src": b + 50}, epoch=epoch)
    return version


def test_rescale_4_to_7_to_2_keeps_the_state_exact(tmp_path: object) -> None:
    rng = random.Random(7)
    keys = [f"user-{i}".encode() for i in range(400)]
    events = [(rng.choice(keys), rng.randint(1, 9)) for _ in range(1500)]
    expected: dict[bytes, bytes] = {}
    for key, amount in events:
        expected[key] = str(int(expected.get(key, b"0")) + amount).encode()

    with local_ring(tmp_path, 3, []) as local:
        _scenario(local, events, expected)


def _scenario(
    local: LocalRing, events: list[tuple[bytes, int]], expected: dict[bytes, bytes]
) -> None:
    with RingClient(local.seeds, chunk_size=2048) as ring:
        four = [StoreId("sum", 0, p, "default") for p in range(4)]
        v4 = _operator_run(ring, four, events[:500], 0, epoch=1)
        seven = [StoreId("sum-7", 0, p, "default") for p in range(7)]
        rescale(ring, four, seven, epoch=2)
        v7 = _operator_run(ring, seven, events[500:1000], 1, epoch=2)
        two = [StoreId("sum-2", 0, p, "default") for p in range(2)]
        rescale(ring, seven, two, epoch=3)
        _operator_run(ring, two, events[1000:], 1, epoch=3)

        got: dict[bytes, bytes] = {}
        for p, sid in enumerate(two):
            st_ = ring.restore(sid)
            assert all(partition_of(k, 2) == p for k in st_), "a key sits in the wrong partition"
            assert st_.positions == {"src": 500}
            got.update(st_)
        assert got == expected
        assert v4 == 10 and v7 == 11

        # a key-group restore fetches only the chunks of its groups, and exactly its keys
        # (a one-version store: compaction never rewrites it with the node's chunk size)
        kg = StoreId("kg", 0, 0, "default")
        ring.commit(kg, 1, {f"k{i}".encode(): b"v" * 20 for i in range(2000)}, snapshot=True)
        whole = ring.restore(kg)
        part = ring.restore(kg, key_groups=range(0, 8))
        assert dict(part) == {k: v for k, v in whole.items() if key_group(k, 128) < 8}
        assert 0 < part.stats["chunks"] < whole.stats["chunks"]
        with pytest.raises(InvalidRequest, match="key_groups"):
            ring.restore(four[0], key_groups=range(0, 500))
        with pytest.raises(InvalidRequest, match="must differ"):
            rescale(ring, four, [four[0]], epoch=9)


def test_the_rescale_example_runs_and_is_exact() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "rescale_operator.py")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 wrong totals" in out.stdout
