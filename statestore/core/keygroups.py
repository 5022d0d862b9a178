"""Key-group ranges (pure): restoring part of a store, and rescaling an operator from N to M
partitions by key group (SEEP's state partitioning).

Every key falls in one of G key groups (``core.chunk.key_group``). An operator that routes
each key to partition ``partition_of(key, M, G)`` gives partition i the contiguous range
``groups_of(i, M, G)``, so rescaling from N to M partitions is: new partition i restores that
range from every old partition's store and commits it as its first snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from statestore.core.chunk import key_group
from statestore.core.errors import InvalidRequest
from statestore.core.manifest import Manifest

__all__ = [
    "chain_for_groups",
    "check_groups",
    "groups_of",
    "merge_positions",
    "only_groups",
    "partition_of",
]


def check_groups(key_groups: object, groups: int) -> range:
    """``key_groups`` as a non-empty step-1 range within ``0..groups-1``, or InvalidRequest."""
    if (
        not isinstance(key_groups, range)
        or key_groups.step != 1
        or not 0 <= key_groups.start < key_groups.stop <= groups
    ):
        raise InvalidRequest(
            f"key_groups must be a range(a, b) with 0 <= a < b <= {groups} (the store's key "
            f"groups), got {key_groups!r}"
        )
    return key_groups


def chain_for_groups(chain: Iterable[Manifest], key_groups: range) -> list[Manifest]:
    """The chain with only the chunks that hold rows of ``key_groups`` (chunks cover
    contiguous group ranges ``lo..hi``), in the numbering of the chain's newest manifest. A
    manifest cut by another number of key groups (a delta written by a client with another
    ``key_groups``) keeps every chunk: its ranges are in another numbering, so none can be
    ruled out (the caller keeps the rows of ``key_groups`` afterwards: :func:`only_groups`)."""
    manifests = list(chain)
    if not manifests:
        return []
    groups = manifests[-1].key_groups
    lo, hi = key_groups.start, key_groups.stop - 1
    return [
        m
        if m.key_groups != groups
        else replace(m, chunks=tuple(c for c in m.chunks if c.lo <= hi and c.hi >= lo))
        for m in manifests
    ]


def only_groups(state: Mapping[bytes, bytes], key_groups: range, groups: int) -> dict[bytes, bytes]:
    """The rows of ``state`` whose key falls in ``key_groups``."""
    return {k: v for k, v in state.items() if key_group(k, groups) in key_groups}


def partition_of(key: bytes, partitions: int, groups: int = 128) -> int:
    """The partition (of ``partitions``) that owns ``key`` when partitions own contiguous
    key-group ranges."""
    return key_group(key, groups) * partitions // groups


def groups_of(partition: int, partitions: int, groups: int = 128) -> range:
    """The key groups partition ``partition`` of ``partitions`` owns: exactly the groups g
    with ``g * partitions // groups == partition``."""
    if not 0 <= partition < partitions <= groups:
        raise InvalidRequest(
            f"partition {partition} of {partitions} is out of range (at most {groups} partitions)"
        )
    start = -(-partition * groups // partitions)  # ceil(partition * groups / partitions)
    stop = -(-(partition + 1) * groups // partitions)
    return range(start, stop)


def merge_positions(positions: Iterable[Mapping[str, object]]) -> dict[str, object]:
    """Source positions of several old partitions carried to a new one: per source, the
    smallest (replaying from there loses nothing; the operator's state is keyed, so replayed
    input it already holds must be idempotent or filtered by the operator, as on any restore)."""
    out: dict[str, object] = {}
    for pos in positions:
        for src, value in pos.items():
            cur = out.get(src)
            try:
                out[src] = value if cur is None or value < cur else cur  # type: ignore[operator]
            except TypeError:
                out[src] = cur if cur is not None else value
    return out
