"""Compaction and retention: fold delta chains into snapshots, drop versions past retention.

The first live replica of a store (its leader at this epoch) checks the chain of the head:
once the deltas above the last snapshot are worth a new one (``snapshot_every`` of them, with
``rebase_at`` also weighing that share of it: core/retention.needs_snapshot), the leader
restores the head (star plan), writes it back as a snapshot of the same version and epoch,
and so bounds what a reader must fetch. Retention keeps the last ``retain_versions``
versions (Spark's minBatchesToRetain is 100): the floor is the newest usable snapshot at or
below the oldest kept version, so every kept version stays restorable; the floor is sent to
every live node, which drops the manifests and chunks below it (docs/design.md, Compaction).
Thinning (``--thin-snapshots``, core/retention.Thinning) drops the snapshots between the
floor and the newest that are not rungs, in two steps: the line goes to every live node,
which drops their manifests; once every home replica and owner of the store's manifests
(a down one holds the step back) and every live node answered that it took it, and the line
was drawn :data:`CHUNK_GRACE_PASSES` passes before (a restore that resolved its chain just
before still reads its base), the line of their chunks follows (a reader merges the owners'
manifests: one still naming a snapshot whose chunks were gone would fail its restore).
Which snapshots, which floor and which line is decided by
:func:`statestore.core.retention.plan_compaction`; this module restores, writes and sends.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from functools import partial
from typing import Any

import xxhash

from statestore.core.chunk import EncodedChunk, encode_chunks
from statestore.core.errors import FloorWithinRetain, StaleEpoch, StateStoreError
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.retention import (
    Compaction,
    Folds,
    Thinning,
    plan_compaction,
    rung_spacing,
)
from statestore.core.view import RingView
from statestore.net.restorer import HOLD
from statestore.net.writes import write_commit
from statestore.node.budget import FoldLease, Lease
from statestore.node.daemon import Node
from statestore.node.repair import ask_owners
from statestore.node.tombstones import DropMarks

__all__ = ["compact_store", "compaction_loop"]

log = logging.getLogger(__name__)


async def _snapshot(node: Node, view: RingView, top: Manifest) -> Manifest | None:
    """Write version ``top.version`` back as a snapshot; None if a newer writer fenced us.
    The fold is held to the node's memory budget as far as there is room for it now (see
    :func:`_fold_hold`), and given back before the snapshot is written."""
    marks = DropMarks(node)
    marks.read(top.store.query)  # before the restore: a snapshot read before a drop is refused
    lease = Lease(node.budget)
    hold = HOLD.set(_fold_hold(lease))
    try:
        chain, plan = await node.restorer.plan(view, top.store, top.version, "star")
        state = (await node.restorer.run(view, top.store, chain, plan)).state
        # the snapshot is of the chain the ring resolved (its epoch and base say whose state
        # it is: core/manifest.py, "Lineage"), which this replica's own manifests may not show
        top = chain[-1]
        chunks = await asyncio.to_thread(
            partial(
                encode_chunks,
                state,
                [],
                groups=top.key_groups,
                kind="s",
                block_size=view.block_size(),
            )
        )
        del state
    finally:
        HOLD.reset(hold)
        # given back before the chunks are written: each write takes them from the budget of
        # the node it goes to, this one's too, which a fold still held here could leave no
        # room for (a review found the node refusing its own snapshot's chunks, every pass)
        await lease.close()
    return await _write_snapshot(node, view, top, chunks, marks.headers([top.store.query]))


def _fold_hold(lease: Lease) -> FoldLease:
    """How compaction takes its fold (net/restorer.HOLD): what there is room for now, up to
    half the budget, and never a wait. Background work must neither wait on the requests it
    serves (under steady load a fold waiting for its whole size never ran, and a store's
    chain and disk grew without bound) nor hold all their room; what it takes makes
    requests wait for room while the fold holds the memory, and the rest of a fold larger
    than that is outside the budget."""
    return FoldLease(lease, most=lease.budget.limit // 2)


async def _write_snapshot(
    node: Node,
    view: RingView,
    top: Manifest,
    chunks: list[EncodedChunk],
    headers: dict[str, str],
) -> Manifest | None:
    snap = Manifest(
        top.store,
        top.version,
        "snapshot",
        top.epoch,
        top.key_groups,
        tuple(ChunkRef.of(c) for c in chunks),
        top.positions,
        top.base_epoch,
    )
    try:
        await write_commit(node.transport, view, snap, chunks, compaction=True, headers=headers)
    except StaleEpoch:
        return None  # a newer writer took over meanwhile; its commits decide
    node.stats["snapshots"] += 1
    return snap


def _inputs(node: Node, store: StoreId) -> tuple[object, ...]:
    """What :func:`compact_store` decides from, cheaply: the head, the manifests' keys (kept
    as one hash, not a copy of every key), the floor, the thinning lines and the retention
    (and the live members, while a thinning line's chunks wait for an owner). Equal inputs,
    equal decision."""
    thin = node.store.thinning(store)
    # a thinning line whose chunks wait (for an owner that is down, or for the grace): tried
    # again once the live members change or a grace has passed, not every pass
    waiting: tuple[object, ...] = ()
    if thin.every and thin.chunks < thin.below:
        grace = CHUNK_GRACE_PASSES * node.config.compact_interval
        now = asyncio.get_running_loop().time()
        waiting = (tuple(node.view().live_addresses()), int(now // grace))
    return (
        node.store.head(store),
        xxhash.xxh64_intdigest(b"\0".join(node.store.manifest_names(store))),
        node.store.floor(store),
        thin,
        node.store.retain(store),
        waiting,
    )


def _plan(node: Node, store: StoreId, folds: Folds = "all") -> Compaction | None:
    """What :func:`plan_compaction` decides for ``store`` from what this node holds now
    (None: no head here). ``folds`` ``none``: the floor and the line the snapshots held
    allow, what a pass whose fold failed still sends."""
    head = node.store.head(store)
    if head is None:
        return None
    deltas, snaps = node.store.manifests(store)
    retain = node.store.retain(store) or node.config.retain_versions
    held = node.store.thinning(store)
    # a line rotted on this node's disk has lost the store's spacing, and this node refuses
    # every snapshot below its head meanwhile (NodeStore.thinned): the head is folded, the
    # floor climbs to the snapshots held, and no line is drawn until a peer gives the line
    # back (node/repair.recover_lines; on a store with no other owner, never)
    lost = node.store.thinning_lost(store)
    # a store's first line fixes its spacing on every node (NodeStore.apply_thinning); a line
    # held binds with thinning off too (every node that took it refuses what it drops)
    every = held.every or (
        rung_spacing(node.config.thin_snapshots, retain, node.config.snapshot_every)
        if node.config.thin_snapshots and not lost
        else 0
    )
    return plan_compaction(
        store,
        head.version,
        deltas,
        snaps,
        snapshot_every=node.config.snapshot_every,
        rebase_at=node.config.rebase_at,
        retain=retain,
        floor=node.store.floor(store),
        thin=Thinning(held.below, every, held.chunks, held.floor),
        draw=node.config.thin_snapshots > 0 and not lost,
        folds="head" if lost and folds == "all" else folds,
    )


async def compact_store(node: Node, view: RingView, store: StoreId) -> bool:
    """One compaction pass of ``store``: what :func:`plan_compaction` decides, performed.
    Returns whether there was anything to do."""
    todo = _plan(node, store)
    if todo is None:
        return False
    failed: StateStoreError | None = None
    fenced = False
    for top in todo.snapshots:
        try:
            # None: fenced, by a newer writer or by a replica whose lineage lags
            fenced = await _snapshot(node, view, top) is None
        except StateStoreError as exc:  # too few replicas took it: full, down, refusing
            failed, fenced = exc, True
        if fenced:
            # the floor and the line the snapshots held allow still go, planned from what
            # is held now (a newer writer's head may have come meanwhile): a fold that
            # failed holds back no gc (on full replicas the gc may be what gives room back)
            todo = _plan(node, store, "none")
            break
    if todo is None:
        return True  # the store was dropped meanwhile
    held = node.store.thinning(store)
    thin = todo.thin or (held if held.every and held.chunks < held.below else None)
    gc: dict[str, int] = {}
    if todo.floor is not None:
        gc["floor"] = todo.floor
    if thin is not None:
        gc |= {"thin_below": thin.below, "thin_every": thin.every, "thin_floor": thin.floor}
    if gc:
        answers = await _send_gc(node, view, store, gc)
        if thin is not None:
            await _drop_chunks(node, view, store, thin, answers)
    if failed is not None:
        raise failed  # counted and logged by the loop, and tried again next pass
    # a fenced fold is tried again next pass (a lagging replica's repair changes nothing
    # here); a second step still waiting (on an owner, or on the grace) is not work done:
    # the store settles, and is planned again when its inputs change
    return fenced or bool(todo.snapshots) or todo.floor is not None or todo.thin is not None


# Lines drawn per (node, store): (line, when), oldest first; the chunks of a line go once it
# was drawn this long ago (in compaction passes), so that a restore which resolved its chain
# just before the line moved still reads its base's chunks.
CHUNK_GRACE_PASSES = 10
_drawn: weakref.WeakKeyDictionary[Node, dict[StoreId, list[tuple[int, float]]]] = (
    weakref.WeakKeyDictionary()
)


async def _drop_chunks(
    node: Node,
    view: RingView,
    store: StoreId,
    thin: Thinning,
    answers: dict[str, dict[str, Any]],
) -> None:
    """The second step of a line (core/retention.Thinning): once every home replica and
    owner of the store's manifests (a down one too: it answers nothing, so the step waits)
    and every live node answered that it took the line, the chunks of what it drops go too,
    up to the highest line drawn at least :data:`CHUNK_GRACE_PASSES` compaction passes
    ago."""
    now = asyncio.get_running_loop().time()
    lines = _drawn.setdefault(node, {}).setdefault(store, [])
    if not lines or lines[-1][0] < thin.below:
        lines.append((thin.below, now))
    # every owner, a down one too, and every live node: one holding manifests it no longer
    # owns takes the whole line (node/repair.check_thinning), and must have dropped them
    owners = set(view.store_write_replicas(store)) | set(view.write_homes(store.path))
    owners |= set(view.live_addresses())
    took = all(answers.get(a, {}).get("thinning", {}).get("below", 0) >= thin.below for a in owners)
    grace = CHUNK_GRACE_PASSES * node.config.compact_interval
    ripe = [line for line, at in lines if now - at >= grace]
    del lines[: max(0, len(ripe) - 1)]  # of the ripe lines only the highest counts
    if not took or not ripe:
        return
    line = max(ripe)
    gc = {
        "thin_below": thin.below,
        "thin_every": thin.every,
        "thin_chunks": line,
        "thin_floor": thin.floor,
    }
    await _send_gc(node, view, store, gc)


async def _send_gc(
    node: Node, view: RingView, store: StoreId, body: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """``POST .../gc`` to every live node: the store's other owners first, then this node
    (its compactor), then the rest (a node holding none of its manifests takes only a floor
    its home replicas took: node/repair.check_floor); their answers by address (those that
    gave one). This node takes nothing an owner refused as within the versions the writer
    keeps (FloorWithinRetain): its ``retain`` may be the stale one, and its own floor would
    drop its copies of versions the writer keeps (hostile review 71), until the writer's
    next commit gives it the writer's value (a peer's floor reaches it only once every
    other live home took it: node/repair._apply_floors)."""
    owners = {*view.store_write_replicas(store), *view.write_homes(store.path)}
    live = view.live_addresses()
    steps = (
        [a for a in live if a in owners and a != node.address],
        [a for a in live if a == node.address],
        [a for a in live if a not in owners and a != node.address],
    )
    out: dict[str, dict[str, Any]] = {}
    for step in steps:
        got = await asyncio.gather(
            *(
                node.transport.request("POST", a, f"/v1/stores/{store.path}/gc", json_body=body)
                for a in step
            ),
            return_exceptions=True,
        )
        for address, r in zip(step, got, strict=True):
            if isinstance(r, FloorWithinRetain):
                node.stats["gc_within_retain"] += 1
                log.info("gc of %s refused by %s: %s", store, address, r)
                return out  # neither this node nor the nodes holding only chunks take it
            if isinstance(r, BaseException):
                continue
            try:
                answer = r.json()
            except ValueError:
                continue
            if isinstance(answer, dict):
                out[address] = answer
    return out


async def compaction_loop(node: Node) -> None:
    # A store whose inputs have not changed since a pass found nothing to do is not planned
    # again: decoding every manifest of every store it leads, every interval, was 20-35 ms
    # of each node's event loop every 2 s at 1 GiB, in clients' p99 (docs/benchmarks.md).
    settled: dict[StoreId, tuple[object, ...]] = {}
    # stores whose other owners answered about a writer-set retain (led here with none held:
    # asked each pass until one answers, node/repair.ask_owners)
    asked: set[StoreId] = set()
    # a node started again writes no snapshot to owners before it learned the drops it
    # missed (one of a query dropped meanwhile would bring it back)
    await node.until_copies_served()
    while True:
        await asyncio.sleep(node.config.compact_interval)
        view = node.view()
        stores = node.store.stores()
        for gone in settled.keys() - set(stores):
            del settled[gone]
        asked &= set(stores)
        unknown = [
            s
            for s in stores
            if s not in asked
            and view.store_replicas(s)[:1] == [node.address]
            and node.store.retain(s, if_rotted=None) is None
        ]
        if unknown:
            asked.update(await ask_owners(node, view, unknown))
        waiting = set(unknown) - asked
        for store in stores:
            replicas = view.store_replicas(store)
            if not replicas or replicas[0] != node.address:
                settled.pop(store, None)
                continue
            if store in waiting:  # no owner answered about its retain yet: no fold, no
                continue  # floor by --retain that the writer's retain would not allow
            inputs = _inputs(node, store)
            if settled.get(store) == inputs:
                continue
            try:
                if not await compact_store(node, view, store):
                    settled[store] = inputs
            except StateStoreError as exc:
                node.stats["compaction_failed"] += 1
                log.warning("compaction of %s failed: %s", store, exc)
