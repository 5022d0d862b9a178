"""Scrub: what a node holds at rest, re-verified at a bounded rate (``--scrub-mbps``).

A chunk is verified whenever it is read, so bit rot in a chunk nobody reads (an old
version, a replica that is never the first to answer) stays hidden until a restore needs
it, possibly after the other copies were lost too. The scrub loop walks every chunk this node
holds in key order, re-computes its checksum (the one in its name) and decodes every manifest,
reading at most ``--scrub-mbps`` MB/s (default 8; a pass over 10 GiB takes about 20 min)
and resting ``--scrub-interval`` seconds between passes. A bad chunk is deleted (reads fail
over at once and repair sees the copy missing) and fetched again, verified, from another
replica of it; a manifest that no longer decodes is replaced by a replica's copy of the same
version, kind and epoch (a version's main record, whose epoch the rot hid: the highest epoch a
replica holds, above those kept beside it here), written only over the rotted bytes still
there (a drop or gc meanwhile is not undone; a chunk's copy likewise only while its query's
tombstone and floor are as they were). Counted in ``/metrics`` (``statestore_node_events``:
``scrubbed``, ``scrub_corrupt``, ``scrub_replaced``).

Manifests are stored sealed with a checksum of their bytes (node/replica.py, disk format 2):
one whose seal does not match is never read, and the scrub replaces it. One written before
seals (disk format 1) is checked as before (it decodes, and its chunks' names and checksums
agree: the simulator once found a flip there that left acknowledged versions unreadable) and
then sealed, so a data dir from the previous build is sealed within one pass; a flip in such
a record that still decodes and agrees is sealed as it is, as before seals it was kept.

Costs: one read of every byte held per pass (disk), one chunk in memory at a time, one
checksum per byte (xxh3: a few GB/s a core), network only for what is bad.
"""

from __future__ import annotations

import asyncio
import logging

from statestore.core.chunk import verify
from statestore.core.errors import CorruptChunk, MalformedData, StateStoreError
from statestore.core.ids import StoreId, parse_chunk_key
from statestore.node.daemon import Node
from statestore.wire.manifest import decode_manifest

__all__ = ["scrub_loop", "scrub_pass"]

log = logging.getLogger(__name__)


async def scrub_loop(node: Node) -> None:
    """Scrub passes forever (a supervised loop: node/server.py); off at ``--scrub-mbps 0``."""
    if not node.config.scrub_mbps > 0:
        return
    await asyncio.sleep(node.config.down_after)  # let gossip find the replicas first
    while True:
        await scrub_pass(node, node.config.scrub_mbps * 1e6)
        await asyncio.sleep(node.config.scrub_interval)


async def scrub_pass(node: Node, rate: float) -> int:
    """Verify everything held once, at ``rate`` bytes/s; returns the bad copies found."""
    bad = 0
    sizes = await asyncio.to_thread(node.store.chunk_sizes)
    for key, size in sizes:
        if not await _scrub_chunk(node, key):
            bad += 1
        await asyncio.sleep(size / rate)
    for record in await asyncio.to_thread(node.store.manifest_records):
        try:
            raw = await asyncio.to_thread(node.store.manifest_record, record)
        except MalformedData as exc:  # its seal does not match
            _found(node, f"manifest {record.decode(errors='replace')}", exc)
            store, version, kind, epoch = node.store.manifest_record_names(record)
            await _replace_manifest(node, record, store, version, kind, epoch)
            bad += 1
            continue
        if raw is None:
            continue
        if not await _scrub_manifest(node, record, raw):
            bad += 1
        await asyncio.sleep(len(raw) / rate)
    return bad


async def _scrub_chunk(node: Node, key: str) -> bool:
    """Verify one chunk (True: good, or gone meanwhile); a bad one is replaced."""
    try:
        await asyncio.to_thread(node.store.get_chunk, key)  # re-verifies
    except CorruptChunk as exc:
        _found(node, f"chunk {key}", exc)
        await node.write(node.store.delete_chunks, [key])
        await _replace_chunk(node, key)
        return False
    node.stats["scrubbed"] = node.stats.get("scrubbed", 0) + 1
    return True


def _found(node: Node, what: str, exc: Exception) -> None:
    node.stats["scrub_corrupt"] = node.stats.get("scrub_corrupt", 0) + 1
    log.error("scrub: %s is corrupt on disk (%s); fetching a good copy", what, exc)


async def _replace_chunk(node: Node, key: str) -> None:
    """Fetch ``key`` from another replica, verified, and store it (as a copy), unless its
    query was dropped or retention passed it while it was fetched (NodeStore.put_chunk_copy)."""
    store, _, name = parse_chunk_key(key)
    checksum = int(name.split("-", 1)[1], 16)
    tombstone = await asyncio.to_thread(node.store.tombstone, store.query)
    for address in node.view().read_order(key):
        if address == node.address:
            continue
        try:
            resp = await node.transport.request("GET", address, f"/v1/chunks/{key}?copy=1")
            verify(resp.body, checksum, key)
            put = await node.write(
                node.store.put_chunk_copy, key, resp.body, tombstone, order="copy"
            )
        except StateStoreError as exc:
            log.debug("scrub: %s from %s: %s", key, address, exc)
            continue
        if put:
            node.stats["scrub_replaced"] = node.stats.get("scrub_replaced", 0) + 1
        return
    log.warning("scrub: no replica had a good copy of %s yet; repair pushes one back", key)


def _matches(raw: bytes, store: StoreId, version: int, kind: str, epoch: int | None) -> bool:
    m = decode_manifest(raw)
    return (
        (m.store, m.version, m.kind) == (store, version, kind)
        and epoch in (None, m.epoch)
        and all(_named_by_checksum(c.name, c.checksum) for c in m.chunks)
    )


def _named_by_checksum(name: str, checksum: int) -> bool:
    """A chunk's name ends with its checksum (core/chunk.py: ``<kind><i>-<xxh3 hex>``)."""
    _, _, digest = name.rpartition("-")
    try:
        return int(digest, 16) == checksum
    except ValueError:
        return False


async def _scrub_manifest(node: Node, record: bytes, raw: bytes) -> bool:
    """Decode one stored manifest (True: good); a bad one is replaced from a replica."""
    store, version, kind, epoch = node.store.manifest_record_names(record)
    try:
        if not _matches(raw, store, version, kind, epoch):
            raise MalformedData(
                "it names another store, version, kind or epoch, or a chunk's name and "
                "checksum disagree"
            )
    except (MalformedData, ValueError) as exc:
        _found(node, f"manifest {record.decode(errors='replace')}", exc)
        await _replace_manifest(node, record, store, version, kind, epoch)
        return False
    node.stats["scrubbed"] = node.stats.get("scrubbed", 0) + 1
    if await asyncio.to_thread(node.store.unsealed_record, record):
        # written before seals (disk format 1) and verified now: seal it (node/replica.py)
        await node.write(node.store.seal_record, record, order="copy")
    return True


async def _replace_manifest(
    node: Node, record: bytes, store: StoreId, version: int, kind: str, epoch: int | None
) -> None:
    """Fetch the manifest from the other replicas and write it over the rotted bytes, if
    they are still there when the write runs (a drop or a gc that deleted them meanwhile is
    not undone). A side record names its epoch: the first replica's copy of it is taken. A
    version's main record holds its highest epoch, which the rot hid: every other replica
    is asked, and the highest epoch one gives is taken, if it is above the epochs kept
    beside it here (a replica still holding an older writer's attempt, or lagging, would
    otherwise put it back as the version's content: repair brings the rest)."""
    rotted = await asyncio.to_thread(node.store.backend.get, record)
    if rotted is None:
        return  # gone meanwhile
    path = f"/v1/manifests/{store.path}/{version}/{kind}?copy=1"
    if epoch is not None:
        path += f"&epoch={epoch}"
    best: tuple[int, bytes] | None = None
    for address in node.view().read_order(store.path):
        if address == node.address:
            continue
        try:
            resp = await node.transport.request("GET", address, path)
            if not _matches(resp.body, store, version, kind, epoch):
                continue
            got = decode_manifest(resp.body).epoch
        except (StateStoreError, ValueError) as exc:
            log.debug("scrub: manifest of %s v%d from %s: %s", store, version, address, exc)
            continue
        if best is None or got > best[0]:
            best = (got, resp.body)
        if epoch is not None:
            break
    if best is None:
        log.warning("scrub: no replica had manifest %s v%d/%s yet", store, version, kind)
        return
    if epoch is None:
        beside = await asyncio.to_thread(node.store.side_epochs, store, version, kind)
        if beside and best[0] <= beside[-1]:
            # no replica holds an epoch above those kept here: the highest of those takes the
            # main record's place (a higher one, this node's alone, went with the rot; a
            # replica's comes back by repair once the record reads again)
            log.warning(
                "scrub: the replicas hold manifest %s v%d/%s at epoch %d at most, not above "
                "epoch %d kept here beside its rotted main record: that one takes its place",
                store, version, kind, best[0], beside[-1],
            )  # fmt: skip
            if await node.write(node.store.promote_side_record, record, rotted, order="copy"):
                node.stats["scrub_replaced"] = node.stats.get("scrub_replaced", 0) + 1
            return
    if await node.write(node.store.restore_manifest_record, record, best[1], rotted, order="copy"):
        node.stats["scrub_replaced"] = node.stats.get("scrub_replaced", 0) + 1
