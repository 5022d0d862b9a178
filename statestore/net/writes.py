"""The write path, shared by the client and the node's compactor: chunks then manifest, at W.

Each chunk goes to its own R replicas (its key has its own token, so a store's chunks spread
over the whole ring); the manifest goes to the store's R replicas last, so a manifest that
any node holds only ever names chunks that were already acknowledged at W (DESIGN.md, Write
path). A fencing refusal from any replica fails the commit with StaleEpoch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from statestore.core.chunk import EncodedChunk
from statestore.core.errors import StaleEpoch, StateStoreError, VersionConflict
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import Manifest
from statestore.core.quorum import check_write
from statestore.core.view import RingView
from statestore.net.transport import Transport
from statestore.wire.manifest import encode_manifest

__all__ = ["WriteStats", "put_chunks", "put_manifest", "write_commit"]


@dataclass
class WriteStats:
    chunks: int = 0
    bytes: int = 0
    replica_writes: int = 0


async def _put_everywhere(
    transport: Transport,
    addresses: list[str],
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, list[BaseException]]:
    results = await asyncio.gather(
        *(transport.request("PUT", a, path, body=body, headers=headers) for a in addresses),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, StateStoreError):
            raise e
    return len(results) - len(errors), errors


async def put_chunks(
    transport: Transport,
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
            acks, errors = await _put_everywhere(
                transport, targets, f"/v1/chunks/{key}", chunk.data
            )
        check_write(f"chunk {key}", acks, view.write_quorum, len(targets), errors)
        if stats is not None:
            stats.chunks += 1
            stats.bytes += len(chunk.data)
            stats.replica_writes += acks

    await asyncio.gather(*(one(c) for c in chunks))


async def put_manifest(transport: Transport, view: RingView, m: Manifest) -> int:
    """Store the manifest on the store's replicas; returns the acks. Fencing errors win."""
    targets = view.store_replicas(m.store)
    path = f"/v1/manifests/{m.store.path}/{m.version}/{m.kind}"
    acks, errors = await _put_everywhere(
        transport, targets, path, encode_manifest(m), {"Content-Type": "application/msgpack"}
    )
    for e in errors:
        if isinstance(e, StaleEpoch | VersionConflict):
            raise e
    check_write(
        f"manifest of {m.store} v{m.version}", acks, view.write_quorum, len(targets), errors
    )
    return acks


async def write_commit(
    transport: Transport,
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
