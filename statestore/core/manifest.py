"""Manifests: the immutable description of one commit of a store (pure).

A manifest names a store version's chunks (name, key-group range, sizes, checksum), its kind
(``delta`` on top of ``base`` = version - 1, or a full ``snapshot``), the writer epoch that
fences zombie writers, and the source positions the commit covers (its msgpack form is in
wire/manifest.py). Chains (a snapshot plus the deltas above it) are
resolved here too, over plain dictionaries, so the node and the tests share one rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statestore.core.chunk import EncodedChunk
from statestore.core.errors import VersionNotFound
from statestore.core.ids import StoreId

__all__ = [
    "ChunkRef",
    "Head",
    "Manifest",
    "chain_bytes",
    "local_chain",
    "resolve_chain",
]

MAX_POSITIONS_BYTES = 64 * 1024


@dataclass(frozen=True)
class ChunkRef:
    """Where one chunk of a version lives and how to check it."""

    name: str
    lo: int
    hi: int
    size: int
    raw_size: int
    rows: int
    checksum: int

    @classmethod
    def of(cls, chunk: EncodedChunk) -> ChunkRef:
        return cls(
            chunk.name,
            chunk.lo,
            chunk.hi,
            len(chunk.data),
            chunk.raw_size,
            chunk.rows,
            chunk.checksum,
        )


@dataclass(frozen=True)
class Head:
    """A store's latest version and the epoch of the writer that committed it."""

    version: int
    epoch: int

    def key(self) -> tuple[int, int]:
        # Heads only move forward: a higher epoch wins, then a higher version.
        return (self.epoch, self.version)


@dataclass(frozen=True)
class Manifest:
    store: StoreId
    version: int
    kind: str  # "delta" | "snapshot"
    epoch: int
    key_groups: int
    chunks: tuple[ChunkRef, ...]
    positions: Mapping[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> int:
        """The version this one applies on top of (0 = empty state); a snapshot has none."""
        return self.version - 1 if self.kind == "delta" else -1

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.chunks)

    def same_content(self, other: Manifest) -> bool:
        return (self.kind, [c.checksum for c in self.chunks]) == (
            other.kind,
            [c.checksum for c in other.chunks],
        )


def chain_bytes(chain: Sequence[Manifest]) -> int:
    return sum(m.bytes for m in chain)


def resolve_chain(
    store: StoreId,
    version: int,
    deltas: Mapping[int, Manifest],
    snapshots: Mapping[int, Manifest],
) -> list[Manifest]:
    """The manifests to apply, oldest first, to rebuild ``version``.

    Walks down from ``version``: a snapshot of a version is used when its epoch is at least
    that of the delta of the same version (a newer writer's re-commit makes an older snapshot
    stale); otherwise the delta is taken and the walk goes on to ``version - 1``, until a
    snapshot or version 1's delta (which applies to the empty state). Raises VersionNotFound
    naming the first missing version.
    """
    chain: list[Manifest] = []
    v = version
    while v >= 1:
        snap = snapshots.get(v)
        delta = deltas.get(v)
        if snap is not None and (delta is None or snap.epoch >= delta.epoch):
            chain.append(snap)
            break
        if delta is None:
            if v == version:
                raise VersionNotFound(
                    f"store {store} has no version {version}: list versions with "
                    "versions() and restore one of them"
                )
            raise VersionNotFound(
                f"store {store} version {version} needs version {v}, which is gone "
                "(past retention or never committed): restore a newer version"
            )
        chain.append(delta)
        v -= 1
    chain.reverse()
    return chain


def local_chain(
    deltas: Mapping[int, Manifest], snapshots: Mapping[int, Manifest], version: int
) -> list[Manifest]:
    """What one replica can contribute to the chain of ``version``: every manifest it holds
    from ``version`` down to the first usable snapshot or the first gap. The reader merges
    the answers of several replicas and resolves the chain with :func:`resolve_chain`."""
    out: list[Manifest] = []
    v = version
    while v >= 1:
        snap = snapshots.get(v)
        delta = deltas.get(v)
        if snap is not None:
            out.append(snap)
        if delta is not None:
            out.append(delta)
        if (snap is not None and (delta is None or snap.epoch >= delta.epoch)) or delta is None:
            break
        v -= 1
    return out
