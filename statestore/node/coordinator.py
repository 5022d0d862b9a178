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
from statestore.core.errors import InvalidRequest, StoreNotFound
from statestore.core.ids import StoreId
from statestore.core.manifest import Manifest
from statestore.core.plan import check_plan
from statestore.core.quorum import check_consistency, read_answers, write_acks
from statestore.net.reads import read_chain, read_head
from statestore.net.tentative import commit_within, read_reachable, write_hints
from statestore.net.writes import write_commit
from statestore.node.daemon import Node

__all__ = [
    "POSITIONS_HEADER",
    "STATS_HEADER",
    "TENTATIVE_HEADER",
    "VERSION_HEADER",
    "WRITER_EPOCH_HEADER",
    "coordinate_commit",
    "coordinate_restore",
    "coordinate_restore_within",
]

POSITIONS_HEADER = "X-Statestore-Positions"
VERSION_HEADER = "X-Statestore-Version"
WRITER_EPOCH_HEADER = "X-Statestore-Writer-Epoch"
STATS_HEADER = "X-Statestore-Stats"
TENTATIVE_HEADER = "X-Statestore-Tentative"  # "true": what the nodes that answered hold


def check_tentative(allow_tentative: bool, delay_bound: float | None) -> None:
    if allow_tentative and delay_bound is None:
        raise InvalidRequest(
            "allow_tentative=1 needs delay_bound=SECONDS: the time after which the commit is "
            "acknowledged as tentative by the nodes it reached"
        )


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
    consistency: str = "quorum",
    delay_bound: float | None = None,
    allow_tentative: bool = False,
) -> dict[str, Any]:
    """Write for the caller; ``consistency`` (one, quorum, all) is how many replicas must
    acknowledge (core/quorum.write_acks); within ``delay_bound`` seconds, tentative (hints on
    the nodes this node reaches) with ``allow_tentative`` (net/tentative.commit_within)."""
    check_consistency(consistency)
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
        block_size=node.view().block_size(),
        snapshot_kind=node.view().snapshot_kind(),
    )
    view = node.view()
    acks = write_acks(consistency, view.replicas, view.write_quorum)

    def answer(tentative: bool) -> dict[str, Any]:
        return {
            "version": version,
            "epoch": epoch,
            "kind": manifest.kind,
            "chunks": len(chunks),
            "bytes": sum(len(c.data) for c in chunks),
            "consistency": consistency,
            "tentative": tentative,
        }

    async def stable() -> dict[str, Any]:
        await write_commit(node.transport, view, manifest, chunks, retain=retain, acks=acks)
        return answer(False)

    async def hints(deadline: float) -> dict[str, Any] | None:
        held = await write_hints(
            node.transport, view, manifest, chunks, deadline, enough=view.write_quorum
        )
        return answer(True) if held else None

    return await commit_within(
        stable, hints, delay_bound, allow_tentative, f"commit of {store} v{version}"
    )


async def coordinate_restore(
    node: Node, store: StoreId, version: int | None, plan: str, consistency: str = "quorum"
) -> tuple[dict[bytes, bytes], Manifest, dict[str, Any]]:
    """Restore for a caller along ``plan`` (star, line, tree or auto), with the node's own
    link measurements feeding the planner; the head and chain reads hear from as many
    replicas as ``consistency`` says (core/quorum.read_answers)."""
    check_plan(plan)
    check_consistency(consistency)
    view = node.view()
    answers = read_answers(consistency, view.replicas, view.write_quorum)
    if version is None:
        version = (await read_head(node.transport, view, store, answers)).version
    if consistency != "quorum":  # the planner's own chain read takes the default quorum
        await read_chain(node.transport, view, store, version, answers)
    chain, p = await node.restorer.plan(view, store, version, plan)
    if not chain:
        raise StoreNotFound(f"store {store} has no version {version}")
    result = await node.restorer.run(view, store, chain, p)
    stats = {k: v for k, v in result.stats.items() if k != "hops"}
    return result.state, chain[-1], stats


async def coordinate_restore_within(
    node: Node, store: StoreId, plan: str, consistency: str, delay_bound: float
) -> tuple[dict[bytes, bytes], Manifest, dict[str, Any], bool]:
    """The latest version within ``delay_bound``: the stable restore if it finishes in half
    of it, else the best version the nodes this node reaches hold (tentative: the last
    value is True), as the client does (net/tentative.read_reachable)."""

    async def stable() -> tuple[dict[bytes, bytes], Manifest, dict[str, Any], bool]:
        data, top, stats = await coordinate_restore(node, store, None, plan, consistency)
        return data, top, stats, False

    async def reachable(
        _deadline: float,
    ) -> tuple[dict[bytes, bytes], Manifest, dict[str, Any], bool] | None:
        data, top, stats, _ = await read_reachable(
            node.transport, node.view(), node.restorer, store, max_raw=node.config.max_chunk
        )
        return data, top, {k: v for k, v in stats.items() if k != "hops"}, True

    return await commit_within(stable, reachable, delay_bound, True, f"restore of {store}")
