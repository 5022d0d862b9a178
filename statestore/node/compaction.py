"""Compaction and retention: fold delta chains into snapshots, drop versions past retention.

The first live replica of a store (its leader at this epoch) checks the chain of the head:
once it holds ``snapshot_every`` deltas above the last snapshot, the leader restores the head
(star plan), writes it back as a snapshot of the same version and epoch, and so bounds what a
reader must fetch. Retention keeps the last ``retain_versions`` versions (Spark's
minBatchesToRetain is 100): the floor is the newest snapshot at or below the oldest kept
version, so every kept version stays restorable; the floor is sent to every live node, which
drops the manifests and chunks below it (DESIGN.md, Compaction).
"""

from __future__ import annotations

import asyncio
import logging

from statestore.core.chunk import encode_chunks
from statestore.core.errors import StaleEpoch, StateStoreError, VersionNotFound
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest, resolve_chain
from statestore.core.view import RingView
from statestore.net.writes import write_commit
from statestore.node.daemon import Node

__all__ = ["compact_store", "compaction_loop", "retention_floor"]

log = logging.getLogger(__name__)


def retention_floor(head: int, snapshots: list[int], retain: int) -> int:
    """The lowest version to keep (0: keep all). Pure."""
    oldest_kept = head - retain + 1
    below = [s for s in snapshots if s <= oldest_kept]
    return max(below) if below else 0


async def _snapshot(node: Node, view: RingView, top: Manifest) -> Manifest | None:
    """Write version ``top.version`` back as a snapshot; None if a newer writer fenced us."""
    chain, plan = await node.restorer.plan(view, top.store, top.version, "star")
    state = (await node.restorer.run(view, top.store, chain, plan)).state
    chunks = await asyncio.to_thread(encode_chunks, state, [], groups=top.key_groups, kind="s")
    snap = Manifest(
        top.store,
        top.version,
        "snapshot",
        top.epoch,
        top.key_groups,
        tuple(ChunkRef.of(c) for c in chunks),
        top.positions,
    )
    try:
        await write_commit(node.transport, view, snap, chunks)
    except StaleEpoch:
        return None  # a newer writer took over meanwhile; its commits decide
    node.stats["snapshots"] += 1
    return snap


async def compact_store(node: Node, view: RingView, store: StoreId) -> None:
    head = node.store.head(store)
    if head is None:
        return
    deltas, snaps = node.store.manifests(store)
    try:
        chain = resolve_chain(store, head.version, deltas, snaps)
    except VersionNotFound:
        return  # this replica misses part of the chain; repair will bring it
    if sum(1 for m in chain if m.kind == "delta") >= node.config.snapshot_every:
        snap = await _snapshot(node, view, chain[-1])
        if snap is None:
            return
        snaps[snap.version] = snap
    oldest_kept = head.version - node.config.retain_versions + 1
    floor = retention_floor(head.version, sorted(snaps), node.config.retain_versions)
    if oldest_kept > max(floor, node.store.floor(store), 1) + node.config.snapshot_every:
        # no snapshot close below the retention line (commits outran compaction): make one
        try:
            base = resolve_chain(store, oldest_kept, deltas, snaps)[-1]
        except VersionNotFound:
            return
        snap = await _snapshot(node, view, base)
        if snap is None:
            return
        floor = snap.version
    if floor > node.store.floor(store):
        await asyncio.gather(
            *(
                node.transport.request(
                    "POST", a, f"/v1/stores/{store.path}/gc", json_body={"floor": floor}
                )
                for a in view.live_addresses()
            ),
            return_exceptions=True,
        )


async def compaction_loop(node: Node) -> None:
    while True:
        await asyncio.sleep(node.config.compact_interval)
        view = node.view()
        for store in node.store.stores():
            replicas = view.store_replicas(store)
            if not replicas or replicas[0] != node.address:
                continue
            try:
                await compact_store(node, view, store)
            except StateStoreError as exc:
                log.warning("compaction of %s failed: %s", store, exc)
