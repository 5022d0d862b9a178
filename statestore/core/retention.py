"""Compaction and retention decisions (pure): which snapshot to write, and the new floor.

The leader of a store folds its delta chain into a snapshot once the head's chain holds
``snapshot_every`` deltas above the last snapshot, so a reader never fetches more than that
many deltas. Retention keeps the last ``retain`` versions (Spark's minBatchesToRetain): the
floor is the newest *usable* snapshot at or below the oldest kept version, so that every kept
version stays restorable; everything below the floor is dropped (DESIGN.md, Compaction).
When commits outran compaction and no snapshot lies close below the retention line, one is
written at the oldest kept version and becomes the floor. ``node/compaction.py`` writes the
snapshots and sends the floor.

A snapshot is usable for its version only when its epoch is at least that of the delta of the
same version (:func:`statestore.core.manifest.resolve_chain`): a newer writer that re-committed
the version made the older snapshot stale, and a floor on a stale snapshot would drop the
versions the re-committed delta still needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from statestore.core.errors import VersionNotFound
from statestore.core.ids import StoreId
from statestore.core.manifest import Manifest, resolve_chain

__all__ = ["Compaction", "plan_compaction", "retention_floor"]


def retention_floor(
    head: int,
    snapshots: Mapping[int, Manifest],
    retain: int,
    deltas: Mapping[int, Manifest] | None = None,
) -> int:
    """The lowest version to keep (0: keep all): the newest snapshot at or below the oldest
    kept version (``head - retain + 1``) that is usable, i.e. not older in epoch than the
    delta of its version in ``deltas``."""
    oldest_kept = head - retain + 1
    deltas = deltas or {}
    below = [
        v
        for v, s in snapshots.items()
        if v <= oldest_kept and (v not in deltas or s.epoch >= deltas[v].epoch)
    ]
    return max(below) if below else 0


@dataclass(frozen=True)
class Compaction:
    """What one compaction pass of a store does, in order.

    ``snapshots``: the manifests to write back as snapshots (same version and epoch), in
    order; if a write is fenced (a newer writer took over) the pass stops there. ``floor``:
    the retention floor to send to every live node once they are written, or None when it
    would not rise above the current one (or the chain is incomplete here).
    """

    snapshots: tuple[Manifest, ...]
    floor: int | None


def plan_compaction(
    store: StoreId,
    head: int,
    deltas: Mapping[int, Manifest],
    snapshots: Mapping[int, Manifest],
    *,
    snapshot_every: int,
    retain: int,
    floor: int,
) -> Compaction:
    """The snapshots to write and the new floor for ``store`` at ``head``.

    Args:
        store: the store.
        head: its head version on this replica.
        deltas: the delta manifests this replica holds, by version.
        snapshots: the snapshot manifests it holds, by version.
        snapshot_every: the deltas a chain may hold above its snapshot.
        retain: how many versions to keep restorable (the last ``retain``).
        floor: the floor already applied here.

    A chain this replica cannot resolve (a version missing: repair will bring it) yields
    nothing to do.
    """
    try:
        chain = resolve_chain(store, head, deltas, snapshots)
    except VersionNotFound:
        return Compaction((), None)
    todo: list[Manifest] = []
    snaps = dict(snapshots)
    if sum(1 for m in chain if m.kind == "delta") >= snapshot_every:
        top = chain[-1]
        todo.append(top)
        snaps[top.version] = _as_snapshot(top)
    oldest_kept = head - retain + 1
    new_floor = retention_floor(head, snaps, retain, deltas)
    if oldest_kept > max(new_floor, floor, 1) + snapshot_every:
        # no snapshot close below the retention line (commits outran compaction): make one
        try:
            base = resolve_chain(store, oldest_kept, deltas, snaps)[-1]
        except VersionNotFound:
            return Compaction(tuple(todo), None)
        todo.append(base)
        new_floor = base.version
    return Compaction(tuple(todo), new_floor if new_floor > floor else None)


def _as_snapshot(m: Manifest) -> Manifest:
    return Manifest(m.store, m.version, "snapshot", m.epoch, m.key_groups, (), m.positions)
