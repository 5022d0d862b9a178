"""The write path, shared by the client and the node's compactor: chunks then manifest, at W.

Each chunk goes to its own R replicas (its key has its own token, so a store's chunks spread
over the whole ring); the manifest goes to the store's R replicas last, so a manifest that
any node holds only ever names chunks that were already acknowledged at W (DESIGN.md, Write
path). A commit waits for the W fastest replicas of each; the writes past W finish in the
background. A fencing refusal among the answers fails the commit with StaleEpoch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .chunk import EncodedChunk
from .errors import StaleEpoch, StateStoreError, VersionConflict
from .ids import StoreId, chunk_key
from .manifest import Manifest, encode_manifest
from .quorum import check_write
from .transport import HttpTransport
from .view import RingView

__all__ = ["WriteStats", "put_chunks", "put_manifest", "write_commit"]


@dataclass
class WriteStats:
    chunks: int = 0
    bytes: int = 0
    replica_writes: int = 0


async def _put_quorum(
    transport: HttpTransport,
    addresses: list[str],
    path: str,
    body: bytes,
    need: int,
    headers: dict[str, str] | None = None,
) -> tuple[int, list[BaseException]]:
    """PUT to every address and return once ``need`` acknowledged (or that can no longer
    happen): the commit waits for the W fastest replicas, not the slowest. The writes past W
    go on in the background (``transport.trail``); one that fails is left to repair."""
    pending = {
        asyncio.ensure_future(transport.request("PUT", a, path, body=body, headers=headers))
        for a in addresses
    }
    acks = 0
    errors: list[BaseException] = []
    try:
        while pending and acks < need and len(errors) <= len(addresses) - need:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                exc = f.exception()
                if exc is None:
                    acks += 1
                elif isinstance(exc, StateStoreError):
                    errors.append(exc)
                else:
                    raise exc
    finally:
        transport.trail(pending)
    return acks, errors


async def put_chunks(
    transport: HttpTransport,
    view: RingView,
    store: StoreId,
    version: int,
    chunks: list[EncodedChunk],
    *,
    concurrency: int = 8,
    stats: WriteStats | None = None,
) -> None:
    """Store every chunk on its R replicas; raises QuorumNotReached below W for any chunk."""
    sem = asyncio.Semaphore(concurrency)

    async def one(chunk: EncodedChunk) -> None:
        key = chunk_key(store, version, chunk.name)
        targets = view.replicas_of(key)
        async with sem:
            acks, errors = await _put_quorum(
                transport, targets, f"/v1/chunks/{key}", chunk.data, view.write_quorum
            )
        check_write(f"chunk {key}", acks, view.write_quorum, len(targets), errors)
        if stats is not None:
            stats.chunks += 1
            stats.bytes += len(chunk.data)
            stats.replica_writes += acks

    await asyncio.gather(*(one(c) for c in chunks))


async def put_manifest(transport: HttpTransport, view: RingView, m: Manifest) -> int:
    """Store the manifest on the store's replicas; returns the acks. Fencing errors win."""
    targets = view.store_replicas(m.store)
    path = f"/v1/manifests/{m.store.path}/{m.version}/{m.kind}"
    # A stale writer cannot collect W acks when W > R/2: any W replicas include one that
    # holds the newer writer's manifest and refuses. Below that, hear from every replica.
    w = view.write_quorum
    need = w if 2 * w > view.replicas else len(targets)
    acks, errors = await _put_quorum(
        transport,
        targets,
        path,
        encode_manifest(m),
        need,
        {"Content-Type": "application/msgpack"},
    )
    for e in errors:
        if isinstance(e, StaleEpoch | VersionConflict):
            raise e
    check_write(
        f"manifest of {m.store} v{m.version}", acks, view.write_quorum, len(targets), errors
    )
    return acks


async def write_commit(
    transport: HttpTransport,
    view: RingView,
    manifest: Manifest,
    chunks: list[EncodedChunk],
    *,
    concurrency: int = 8,
) -> WriteStats:
    stats = WriteStats()
    await put_chunks(
        transport,
        view,
        manifest.store,
        manifest.version,
        chunks,
        concurrency=concurrency,
        stats=stats,
    )
    await put_manifest(transport, view, manifest)
    return stats
