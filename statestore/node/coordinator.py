"""The node as coordinator: commit and restore on behalf of a caller that has no ring client.

The Spark provider (Java) and any HTTP-only client send framed rows to one node; that node
chunks them, writes them to the replicas at W, or restores a version and streams it back. It
is the same write and read path the Python client runs itself (replication.py, restore.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from statestore.core.chunk import DEFAULT_CHUNK_SIZE, DEFAULT_KEY_GROUPS
from statestore.core.commit import build_commit
from statestore.core.errors import StoreNotFound
from statestore.core.ids import StoreId
from statestore.core.manifest import Manifest
from statestore.core.plan import check_plan
from statestore.net.reads import read_head
from statestore.net.writes import write_commit
from statestore.node.daemon import Node

__all__ = [
    "POSITIONS_HEADER",
    "STATS_HEADER",
    "VERSION_HEADER",
    "WRITER_EPOCH_HEADER",
    "coordinate_commit",
    "coordinate_restore",
]

POSITIONS_HEADER = "X-Statestore-Positions"
VERSION_HEADER = "X-Statestore-Version"
WRITER_EPOCH_HEADER = "X-Statestore-Writer-Epoch"
STATS_HEADER = "X-Statestore-Stats"


async def coordinate_commit(
    node: Node,
    store: StoreId,
    version: int,
    epoch: int,
    puts: Mapping[bytes, bytes],
    deletes: list[bytes],
    positions: Mapping[str, Any],
    snapshot: bool,
    retain: int | None = None,
    base_epoch: int | None = None,
) -> dict[str, Any]:
    manifest, chunks = await asyncio.to_thread(
        build_commit,
        store,
        version,
        puts,
        deletes,
        positions,
        epoch,
        snapshot,
        key_groups=DEFAULT_KEY_GROUPS,
        chunk_size=DEFAULT_CHUNK_SIZE,
        max_chunk=node.config.max_chunk,
        base_epoch=base_epoch,
    )
    stats = await write_commit(node.transport, node.view(), manifest, chunks, retain=retain)
    return {
        "version": version,
        "epoch": epoch,
        "kind": manifest.kind,
        "chunks": stats.chunks,
        "bytes": stats.bytes,
    }


async def coordinate_restore(
    node: Node, store: StoreId, version: int | None, plan: str
) -> tuple[dict[bytes, bytes], Manifest, dict[str, Any]]:
    """Restore for a caller along ``plan`` (star, line, tree or auto), with the node's own
    link measurements feeding the planner."""
    check_plan(plan)
    view = node.view()
    if version is None:
        version = (await read_head(node.transport, view, store)).version
    chain, p = await node.restorer.plan(view, store, version, plan)
    if not chain:
        raise StoreNotFound(f"store {store} has no version {version}")
    result = await node.restorer.run(view, store, chain, p)
    stats = {k: v for k, v in result.stats.items() if k != "hops"}
    return result.state, chain[-1], stats
