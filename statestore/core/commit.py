"""Laying out one commit (pure): check the arguments, cut the rows into chunks, describe
them in a manifest. The client runs it before writing to the replicas; a node runs it for the
callers of its coordinator endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from statestore.core.chunk import DEFAULT_BLOCK_SIZE, EncodedChunk, encode_chunks
from statestore.core.errors import InvalidRequest, PayloadTooLarge
from statestore.core.ids import StoreId, check_epoch, check_version
from statestore.core.manifest import MAX_POSITIONS_BYTES, ChunkRef, Manifest

__all__ = ["build_commit"]


def build_commit(
    store: StoreId,
    version: int,
    puts: Mapping[bytes, bytes],
    deletes: Iterable[bytes],
    positions: Mapping[str, Any] | None,
    epoch: int,
    snapshot: bool,
    *,
    key_groups: int,
    chunk_size: int,
    max_chunk: int,
    base_epoch: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    snapshot_kind: str = "s",
) -> tuple[Manifest, list[EncodedChunk]]:
    """Check the arguments and lay the commit out in chunks. CPU only.

    ``base_epoch``: the epoch of version - 1 as the writer restored (or committed) it; the
    chain of this version follows it (core/manifest.py, "Lineage"). None: not said (version 1
    has no base, so it is never recorded there). ``snapshot_kind``: the chunk kind of a
    snapshot, ``w`` (whole: core/manifest.Manifest.whole) where the ring reads it
    (RingView.snapshot_kind), else ``s``, the default: every build reads it."""
    if not isinstance(store, StoreId):
        raise InvalidRequest(f"store must be a StoreId, got {store!r}")
    check_version(version)
    check_epoch(epoch)
    if base_epoch is not None:
        check_epoch(base_epoch)  # above the writer's own epoch: the replicas fence it
        if version == 1:
            base_epoch = None  # version 1 applies to the empty state
    pos = dict(positions or {})
    try:
        encoded = json.dumps(pos, allow_nan=False)  # as wire/manifest decodes them
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"positions must be JSON-able ({exc})") from exc
    if len(encoded) > MAX_POSITIONS_BYTES:
        raise PayloadTooLarge(
            f"positions are {len(encoded)} bytes; the limit is {MAX_POSITIONS_BYTES}"
        )
    deletes = list(deletes)
    if snapshot and deletes:
        raise InvalidRequest("a snapshot holds the whole state: it takes no deletes")
    try:
        chunks = encode_chunks(
            puts,
            deletes,
            groups=key_groups,
            target_size=chunk_size,
            kind=snapshot_kind if snapshot else "d",
            max_raw=max_chunk,
            block_size=block_size,
        )
    except TypeError as exc:
        raise InvalidRequest(str(exc)) from exc
    manifest = Manifest(
        store,
        version,
        "snapshot" if snapshot else "delta",
        epoch,
        key_groups,
        tuple(ChunkRef.of(c) for c in chunks),
        json.loads(encoded),
        base_epoch,
    )
    return manifest, chunks
