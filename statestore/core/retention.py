"""Compaction and retention decisions (pure): which snapshot to write, and the new floor.

The leader of a store folds its delta chain into a snapshot (a new *base*) when the deltas
above the last one are worth it (:func:`needs_snapshot`): at least ``snapshot_every`` of them
and, with ``rebase_at`` > 0, weighing at least that share of the base's bytes, or
``MAX_DELTAS_FACTOR`` x ``snapshot_every`` of them whatever they weigh. The deltas are the
layers above the base: they are kept anyway (the change feed and every retained version need
them), so with ``rebase_at`` a base is rewritten only once reading its layers costs
``rebase_at`` times reading the base (and at least ``snapshot_every`` of them are there).
At 0.5 a store changing 1% of its keys a version writes a base about every 50 versions, not
every 10: a full copy is most of what a retained version costs on disk, but the latest
version's restore reads more
(docs/operations.md, "Snapshots"). ``rebase_at`` 0, the nodes' default, is a snapshot every
``snapshot_every`` deltas. Retention keeps the last ``retain`` versions (Spark's
minBatchesToRetain): the floor is the newest *usable* snapshot at or below the oldest kept
version, so that every kept version stays restorable; everything below the floor is dropped
(docs/design.md, Compaction). When commits outran compaction and the oldest kept version's
chain is one the rule would have cut, a snapshot is written at the oldest kept version and
becomes the floor. ``node/compaction.py`` writes the
snapshots and sends the floor.

**Thinning** (``--thin-snapshots N``, 50 by default, off at 0). The bases between the floor
and the newest one serve only restores of the versions they sit under; the deltas are kept
anyway, so each of them is a full copy of the state bought for speed. Thinning keeps, of the
snapshots above the floor, the newest (what a restore of the latest version reads; a
restore that resolved its chain on the one before still finds its chunks for a grace:
node/compaction.py) and those at multiples of a spacing (the *rungs* the floor climbs by:
:func:`rung_spacing`), and drops the others (:class:`Thinning`). Rungs are written when
the floor needs them, not ahead: once the retention line passes a multiple of the spacing
above the floor, compaction folds the floor's base and the deltas above it into a snapshot
there, and it becomes the floor. A store then holds the floor's base, its deltas and the
newest base: two full copies, where writing rungs ahead held two or three more (each rung
was written as a head snapshot, and kept until the floor passed it). A snapshot that is its
version's only state (a writer committed it whole: no delta of its epoch) is never thinned:
a line is drawn at a floor of at least the highest version below it that may be one (a
snapshot with no delta of its epoch, or a version the compactor holds no delta of: it may
lag a node that holds one committed whole; at least 1: version 1 has nothing below it), so
the snapshots above it thin as usual, and the floor's climb drops it in time. Since chunk
format 3 a writer names a whole snapshot's chunks ``w`` (core/manifest.Manifest.whole):
no node drops one under a line, manifest or chunks, whatever line it gets (a node that
missed the line may have taken one the compactor never saw). Which folded snapshots go is
a rule of version numbers, the node's floor and four numbers per store (the line, the
spacing, the chunks' line and the floor the line was drawn at): every node and every chunk
holder applies it alike, and no path stores again a folded manifest it dropped
(node/replica.py, node/repair.py; the two steps, manifests then chunks: node/compaction.py).

A snapshot is usable for its version only when it is the state the head's lineage has there
(:func:`statestore.core.manifest.lineage`): a snapshot of another epoch is the state of a dead
branch or a stale one (a newer writer re-committed the version), and a floor on it would drop
the versions the head's chain still needs. Where the lineage cannot be followed (manifests
without base epochs) the rule is the one before lineage: a snapshot is usable when its epoch is
at least that of the delta of the same version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from statestore.core.errors import FloorWithinRetain, InvalidRequest, VersionNotFound
from statestore.core.ids import StoreId
from statestore.core.manifest import Candidates, Manifest, lineage, manifests_at, resolve_chain

__all__ = [
    "MAX_DELTAS_FACTOR",
    "MAX_RETAIN",
    "Compaction",
    "Folds",
    "Thinning",
    "check_floor",
    "needs_snapshot",
    "plan_compaction",
    "retention_floor",
    "rung_spacing",
    "usable_snapshots",
]

# deltas a chain may hold above its base whatever they weigh with ``rebase_at`` on, in units of
# ``snapshot_every`` (a store of tiny deltas still gets a base every 100 versions)
MAX_DELTAS_FACTOR = 10


def needs_snapshot(chain: Sequence[Manifest], *, snapshot_every: int, rebase_at: float) -> bool:
    """Whether the resolved ``chain`` (its base first) should be folded into a snapshot of its
    top: it holds at least ``snapshot_every`` deltas and, when ``rebase_at`` > 0, the deltas
    above the base weigh at least ``rebase_at`` of the base's bytes, or it holds
    ``MAX_DELTAS_FACTOR`` x ``snapshot_every`` deltas."""
    deltas = sum(1 for m in chain if m.kind == "delta")
    if deltas < snapshot_every:
        return False
    if rebase_at <= 0 or deltas >= MAX_DELTAS_FACTOR * snapshot_every:
        return True
    layers = sum(m.bytes for m in chain[1:])
    return layers >= rebase_at * chain[0].bytes


# The most versions a writer may ask a store to keep (``?retain=N`` on a commit), and what a
# node takes when its record of a store's retention rotted on disk: nothing dropped.
MAX_RETAIN = 1_000_000


@dataclass(frozen=True)
class Thinning:
    """Which snapshots a store keeps above its floor: every one at or above ``below`` (the
    newest snapshot when the line was drawn), and below it those at multiples of
    ``every`` (the rungs); ``every`` 0 keeps all of them. The manifests of the others go at
    ``below``; their chunks at ``chunks`` (at most ``below``), which the compactor raises
    only once every owner of the store's manifests has dropped them: a reader merges the
    manifests of every replica that answers and takes the newest snapshot it finds, so one
    owner still naming a dropped snapshot whose chunks were gone would fail its restore.
    ``floor``: the store's floor when the line was drawn, or the highest version below the
    line that may be committed whole, when higher (:func:`plan_compaction`). Nothing at or
    below it goes, whatever a node's own floor (one that missed a ``gc`` keeps the ring's
    floor snapshot, which may be no rung)."""

    below: int = 0
    every: int = 0
    chunks: int = 0
    floor: int = 0

    def drops(self, version: int, floor: int) -> bool:
        """Whether the manifests of the snapshot of ``version`` go (the node's floor at
        ``floor``)."""
        return _thinned(version, max(floor, self.floor), self.below, self.every)

    def drops_chunks(self, version: int, floor: int) -> bool:
        """Whether the chunks of the snapshot of ``version`` go."""
        return _thinned(version, max(floor, self.floor), min(self.chunks, self.below), self.every)


def rung_spacing(thin_snapshots: int, retain: int, snapshot_every: int) -> int:
    """The rung spacing of a store keeping ``retain`` versions on nodes at
    ``--thin-snapshots`` (0: no thinning): that many versions, or half of ``retain`` when
    fewer (the floor, which climbs by rungs, then lags the retention line by at most half
    of it), but at least ``snapshot_every``. A store's first line fixes it: nodes keep the
    spacing they were first sent (:meth:`NodeStore.apply_thinning`), so a snapshot one of
    them dropped is never a rung to another."""
    if thin_snapshots <= 0:
        return 0
    return max(1, snapshot_every, min(thin_snapshots, retain // 2))


def _thinned(version: int, floor: int, line: int, every: int) -> bool:
    return every > 0 and floor < version < line and version % every != 0


def usable_snapshots(snapshots: Candidates, deltas: Candidates) -> list[int]:
    """The versions of ``snapshots`` that are usable: the head's lineage's state of their
    version (or, off the lineage, not older in epoch than the delta of their version). A
    retention floor is taken only at one of them (node/repair.check_floor): a snapshot of a
    dead branch at that version (an older writer's, whose versions a newer writer committed
    again) would keep nothing of the newer writer's versions below it."""
    line = lineage(deltas, snapshots)

    def usable(v: int) -> bool:
        snaps = manifests_at(snapshots, v)
        if v in line:
            return any(s.epoch == line[v] for s in snaps)
        top = max((d.epoch for d in manifests_at(deltas, v)), default=-1)
        return any(s.epoch >= top for s in snaps)

    return sorted(v for v in snapshots if usable(v))


def retention_floor(
    head: int,
    snapshots: Candidates,
    retain: int,
    deltas: Candidates | None = None,
) -> int:
    """The lowest version to keep (0: keep all): the newest usable snapshot at or below the
    oldest kept version (``head - retain + 1``)."""
    oldest_kept = head - retain + 1
    below = [v for v in usable_snapshots(snapshots, deltas or {}) if v <= oldest_kept]
    return max(below) if below else 0


def check_floor(
    store: StoreId, floor: int, head: int, snapshot_held: bool | None, keep: int | None = None
) -> None:
    """Whether a retention floor raised to ``floor`` may be applied, wherever it comes from
    (a compactor's ``gc``, a peer's ``sync/have`` answer): never above the store's ``head``
    (it would erase the store), and where this node holds the store's manifests
    (``snapshot_held`` not None) a version it holds a snapshot of, so that every version at
    or above it stays restorable, and (``keep``: the versions its writer keeps, its
    ``retain`` as this node holds it) not above the oldest of those: a compactor that missed
    the writer's raise of ``retain`` plans with the lower value, and its floor would drop,
    on every replica, versions the writer keeps. InvalidRequest names what is wrong."""
    if floor > head:
        raise InvalidRequest(
            f"gc floor {floor} is above the head of {store} (version {head}): refused, it "
            "would erase the store"
        )
    if snapshot_held is False:
        raise InvalidRequest(
            f"gc floor {floor} of {store} is not a snapshot this node holds: refused, the "
            "versions above it would not be restorable (repair brings the floor later)"
        )
    if keep is not None and floor > head - keep + 1:
        raise FloorWithinRetain(
            f"gc floor {floor} of {store} is within the {keep} versions this node keeps "
            f"(its head is {head}): refused, a compactor with an older retain sent it"
        )


@dataclass(frozen=True)
class Compaction:
    """What one compaction pass of a store does, in order.

    ``snapshots``: the manifests to write back as snapshots (same version and epoch), in
    order; if a write is fenced (a newer writer took over) the pass stops there. ``floor``:
    the retention floor to send to every live node once they are written, or None when it
    would not rise above the current one (or the chain is incomplete here). ``thin``: the
    store's new thinning line (:class:`Thinning`), sent with the floor, or None when it
    does not rise.
    """

    snapshots: tuple[Manifest, ...]
    floor: int | None
    thin: Thinning | None = None


# which folds a compaction pass may plan (plan_compaction)
Folds = Literal["all", "head", "none"]


def plan_compaction(
    store: StoreId,
    head: int,
    deltas: Candidates,
    snapshots: Candidates,
    *,
    snapshot_every: int,
    retain: int,
    floor: int,
    rebase_at: float = 0.0,
    thin: Thinning = Thinning(),
    draw: bool = True,
    folds: Folds = "all",
) -> Compaction:
    """The snapshots to write and the new floor for ``store`` at ``head``.

    Args:
        store: the store.
        head: its head version on this replica.
        deltas: the delta manifests this replica holds, by version (one, or every epoch's).
        snapshots: the snapshot manifests it holds, by version (likewise).
        snapshot_every: the deltas a chain may hold above its snapshot before one is
            considered (:func:`needs_snapshot`).
        retain: how many versions to keep restorable (the last ``retain``).
        floor: the floor already applied here.
        rebase_at: the share of the base's bytes the deltas above it must weigh before a
            new base is written (0: every ``snapshot_every`` deltas).
        thin: the store's thinning as applied here, its ``every`` the store's spacing
            (:func:`rung_spacing`, fixed by its first line; 0: every snapshot is kept).
        draw: whether a new line may be drawn (``--thin-snapshots`` on). A line already
            held binds either way: every node that took it refuses a fold it drops, so
            folds go only where it keeps a snapshot, and the floor climbs by its rungs.
        folds: which folds may be planned: ``all``; ``head`` (none below the head: a
            node whose line rotted refuses every snapshot below its head); ``none`` (the
            floor and the line the snapshots held allow: what a pass whose fold failed
            still sends).

    A chain this replica cannot resolve (a version missing: repair will bring it) yields
    nothing to do.
    """
    try:
        chain = resolve_chain(store, head, deltas, snapshots)
    except VersionNotFound:
        return Compaction((), None)
    todo: list[Manifest] = []
    snaps: dict[int, Sequence[Manifest]] = {v: manifests_at(snapshots, v) for v in snapshots}

    def _whole(v: int) -> bool:
        epochs = {d.epoch for d in manifests_at(deltas, v)}
        return any(m.epoch not in epochs for m in manifests_at(snapshots, v))

    def worth(c: Sequence[Manifest]) -> bool:
        return needs_snapshot(c, snapshot_every=snapshot_every, rebase_at=rebase_at)

    def write(m: Manifest) -> None:
        todo.append(m)
        snaps[m.version] = [*snaps.get(m.version, ()), _as_snapshot(m)]

    every = thin.every
    # a fold the line drops is refused by every node that took it (NodeStore.put_manifest):
    # the head of a newer writer that rewound below a line an older one drew. The chain
    # waits for the next version the line keeps (a rung: at most ``every`` - 1 more deltas);
    # a refused fold would fail every pass, and the line's second step behind it
    if folds != "none" and worth(chain) and not thin.drops(chain[-1].version, floor):
        write(chain[-1])
    # a snapshot above the head is a dead branch's (the head is the newest writer's): the
    # line never passes the head, or the head's own bases would be dropped as thinned
    newest = [v for v in usable_snapshots(snaps, deltas) if v <= head]
    line = max(thin.below, newest[-1] if newest else 0) if every and draw else thin.below
    kept = Thinning(line, every, thin.chunks, thin.floor)
    held = {v: s for v, s in snaps.items() if not kept.drops(v, floor) or _whole(v)}
    oldest_kept = head - retain + 1
    new_floor = retention_floor(head, held, retain, deltas)

    def unproven(top: int) -> int:
        # the highest version below the line, no rung, that may be its version's only state:
        # a snapshot held here with no delta of its epoch, or no delta held here at all (the
        # version may be whole on a node this replica lags: above the floor every version
        # has its delta but one committed whole); ``top`` when none
        for v in range(line - 1, top, -1):
            if v % every and (not manifests_at(deltas, v) or _whole(v)):
                return v
        return top

    def drawn(top: int) -> Thinning | None:
        # a snapshot that is its version's only state (a writer committed the version whole)
        # is no copy bought for speed: the line is drawn at a floor of at least the highest
        # version that may be one (rungs are kept anyway), which keeps it and every snapshot
        # below it (in steady state at most the one that was newest when it was committed:
        # the lines before thinned the others) and thins those above it. Version 1 has
        # nothing below it: the floor is at least 1
        return _risen(kept, thin, unproven(max(top, 1)))

    if every:
        # the floor climbs by rungs, each written when the retention line passes it
        at = oldest_kept - oldest_kept % every
        due = at > max(new_floor, floor)
    else:
        # the oldest kept version's chain from the floor's snapshot is one the rule would
        # have cut (commits outran compaction): a snapshot at the retention line
        at = oldest_kept
        due = oldest_kept > max(new_floor, floor, 1) + snapshot_every
    if due and folds == "all":
        try:
            below = resolve_chain(store, at, deltas, held)
        except VersionNotFound:
            return Compaction(tuple(todo), None, drawn(max(floor, thin.floor)))
        if worth(below):
            write(below[-1])
            new_floor = below[-1].version
    return Compaction(
        tuple(todo),
        new_floor if new_floor > floor else None,
        drawn(max(new_floor, floor, thin.floor)),
    )


def _risen(kept: Thinning, thin: Thinning, floor: int) -> Thinning | None:
    """The line to send: ``kept`` with the floor it was drawn at, when it rose."""
    if not kept.every or kept.below <= thin.below:
        return None
    return Thinning(kept.below, kept.every, kept.chunks, max(floor, kept.floor))


def _as_snapshot(m: Manifest) -> Manifest:
    return Manifest(
        m.store, m.version, "snapshot", m.epoch, m.key_groups, (), m.positions, m.base_epoch
    )
