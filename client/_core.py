"""The I/O-free core both clients share: argument checks, commit layout, result types."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from statestore.chunk import EncodedChunk, encode_chunks
from statestore.errors import InvalidRequest, PayloadTooLarge
from statestore.ids import StoreId, check_version
from statestore.manifest import MAX_POSITIONS_BYTES, ChunkRef, Manifest

__all__ = ["PLANS", "CommitResult", "RestoredState", "build_commit", "check_plan", "parse_seeds"]

PLANS = ("star", "line", "tree", "auto")


def parse_seeds(seeds: Iterable[str] | str) -> list[str]:
    items = [seeds] if isinstance(seeds, str) else list(seeds)
    out = []
    for s in items:
        for part in str(s).split(","):
            part = part.strip()
            if not part:
                continue
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"seed {part!r} is not HOST:PORT, e.g. 127.0.0.1:7400")
            out.append(part)
    if not out:
        raise ValueError("give at least one seed HOST:PORT of a running node")
    return out


def check_plan(plan: str) -> str:
    if plan not in PLANS:
        raise InvalidRequest(f"restore plan {plan!r} is not one of {', '.join(PLANS)}")
    return plan


def check_store(store: object) -> StoreId:
    if not isinstance(store, StoreId):
        raise InvalidRequest(
            f"store must be a StoreId(query, operator, partition, name), got {store!r}"
        )
    return store


@dataclass(frozen=True)
class CommitResult:
    store: StoreId
    version: int
    epoch: int
    kind: str
    chunks: int
    bytes: int
    raw_bytes: int


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
) -> tuple[Manifest, list[EncodedChunk]]:
    """Check the arguments and lay the commit out in chunks. CPU only."""
    check_store(store)
    check_version(version)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidRequest(f"epoch must be a non-negative integer, got {epoch!r}")
    pos = dict(positions or {})
    try:
        encoded = json.dumps(pos)
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
            kind="s" if snapshot else "d",
            max_raw=max_chunk,
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
    )
    return manifest, chunks


@dataclass
class RestoredState(Mapping[bytes, bytes]):
    """A restored version of a store: a read-only mapping of bytes to bytes."""

    data: dict[bytes, bytes]
    version: int
    epoch: int
    positions: dict[str, Any]
    plan: str
    stats: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: bytes) -> bytes:
        return self.data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)
