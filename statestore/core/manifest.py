"""Manifests: the immutable description of one commit of a store (pure).

A manifest names a store version's chunks (name, key-group range, sizes, checksum), its kind
(``delta`` on top of ``base`` = version - 1, or a full ``snapshot``), the writer epoch that
fences zombie writers, the source positions the commit covers, and the epoch of the base the
writer built on (its msgpack form is in wire/manifest.py). Chains (a snapshot plus the deltas
above it) are resolved here too, over plain dictionaries, so the node and the tests share one
rule.

**Lineage.** One version can be written at several epochs: a writer refused by most replicas
after its manifest reached one (StaleEpoch), or a writer that took over from an older head and
rewrote history from there. Replicas keep every epoch's manifest (node/replica.py), and a
manifest names the epoch of the version it was built on (``base_epoch``), so a chain follows
the writer's real base instead of whichever epoch is highest at each version
(docs/reliability.md, "A refused higher-epoch delta can shadow the acknowledged one"):

- the *head* is the manifest of the highest (epoch, version); its *lineage* is the head, then
  the manifest of version - 1 at its ``base_epoch``, and so on down;
- a version on the head's lineage resolves to the lineage's manifest of it (a version also
  written at another epoch by a writer whose branch the head does not descend from is a dead
  branch: restoring it returns what the head built on); a version off the lineage (above the
  head's version, or past where the lineage can be followed) to its highest epoch;
- below the version asked, each delta's ``base_epoch`` names the manifest of version - 1 to
  take (that exact epoch: a base that no replica answered with is VersionNotFound, never a
  guess); a manifest without one (written before base_epoch existed, or by a writer that did
  not know its base) falls back to the highest epoch there (the Java provider ports this rule
  as spark_connector/java/.../Lineage.java, cross-checked in tests/ring/test_java_codec.py);
- at one version and epoch a snapshot is preferred to the delta (same state, no chain below).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statestore.core.chunk import EncodedChunk
from statestore.core.errors import VersionNotFound
from statestore.core.ids import StoreId

__all__ = [
    "Candidates",
    "ChunkRef",
    "Head",
    "Manifest",
    "candidates",
    "chain_bytes",
    "lineage",
    "local_chain",
    "manifests_at",
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
    # a blocked chunk's index (core/chunk.py): its length and xxh3-64; 0, 0 for a whole chunk
    index_len: int = 0
    index_checksum: int = 0

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
            chunk.index_len,
            chunk.index_checksum,
        )

    def encoded(self, data: bytes) -> EncodedChunk:
        """The chunk this names, with its bytes (to send again: a hand-off, a backup's load)."""
        return EncodedChunk(
            self.name,
            self.lo,
            self.hi,
            data,
            self.checksum,
            self.raw_size,
            self.rows,
            self.index_len,
            self.index_checksum,
        )

    @property
    def blocked(self) -> bool:
        """Whether its blocks can be read one at a time (a blocked chunk with its index)."""
        return self.index_len > 0


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
    # the epoch of version - 1 as the writer restored it (None: not said; see "Lineage" above)
    base_epoch: int | None = None

    @property
    def base(self) -> int:
        """The version this one applies on top of (0 = empty state); a snapshot has none."""
        return self.version - 1 if self.kind == "delta" else -1

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.chunks)

    @property
    def whole(self) -> bool:
        """A snapshot a writer committed whole (every chunk named ``w``: the version's own
        state, no delta of it), not one a compactor folded (``s``): thinning never drops it
        (node/replica.NodeStore.apply_thinning). Before chunk format 3 (core/formats.py),
        on a ring with a member that does not read it, and from writers of builds before,
        whole snapshots are named ``s``: those are told apart only by the deltas beside
        them (core/retention.plan_compaction)."""
        return (
            self.kind == "snapshot"
            and bool(self.chunks)
            and all(c.name.startswith("w") for c in self.chunks)
        )

    def same_content(self, other: Manifest) -> bool:
        return (self.kind, [c.checksum for c in self.chunks]) == (
            other.kind,
            [c.checksum for c in other.chunks],
        )


def chain_bytes(chain: Sequence[Manifest]) -> int:
    return sum(m.bytes for m in chain)


# Manifests by version: one per version (a replica's table before lineage, a test's table) or
# every manifest held of it (one per kind and epoch).
Candidates = Mapping[int, Manifest | Sequence[Manifest]]


def manifests_at(table: Candidates, version: int) -> Sequence[Manifest]:
    """The manifests ``table`` holds of ``version`` (none, one, or one per epoch)."""
    got = table.get(version)
    if got is None:
        return ()
    return (got,) if isinstance(got, Manifest) else got


def candidates(
    manifests: Iterable[Manifest],
) -> tuple[dict[int, list[Manifest]], dict[int, list[Manifest]]]:
    """Deltas and snapshots by version, one per (version, kind, epoch) (the first seen wins:
    replicas agree on a manifest's content at one epoch, the replica rules see to it)."""
    deltas: dict[int, list[Manifest]] = {}
    snaps: dict[int, list[Manifest]] = {}
    seen: set[tuple[int, str, int]] = set()
    for m in manifests:
        if (m.version, m.kind, m.epoch) in seen:
            continue
        seen.add((m.version, m.kind, m.epoch))
        (deltas if m.kind == "delta" else snaps).setdefault(m.version, []).append(m)
    return deltas, snaps


def _pick(
    deltas: Candidates, snapshots: Candidates, version: int, epoch: int | None
) -> Manifest | None:
    """The manifest of ``version`` at ``epoch`` (None: the highest epoch held), a snapshot
    before the delta of the same epoch; None when there is none."""
    snaps, ds = manifests_at(snapshots, version), manifests_at(deltas, version)
    if epoch is None:
        if not snaps and not ds:
            return None
        epoch = max(m.epoch for m in (*snaps, *ds))
    for m in snaps:
        if m.epoch == epoch:
            return m
    for m in ds:
        if m.epoch == epoch:
            return m
    return None


def _base_of(deltas: Candidates, m: Manifest) -> int | None:
    """The base epoch of ``m``; a snapshot written without one (by compaction before
    base_epoch existed) takes its delta's, which has the same version and epoch."""
    if m.base_epoch is not None or m.kind == "delta":
        return m.base_epoch
    for d in manifests_at(deltas, m.version):
        if d.epoch == m.epoch:
            return d.base_epoch
    return None


def lineage(deltas: Candidates, snapshots: Candidates) -> dict[int, int]:
    """The head's line of descent, version -> epoch: the head (the manifest of the highest
    (epoch, version)), then each manifest's base, down to the first version whose base is not
    held (a gap, the retention floor, or version 1)."""
    every = [m for t in (deltas, snapshots) for v in t for m in manifests_at(t, v)]
    if not every:
        return {}
    top = max(every, key=lambda m: (m.epoch, m.version))
    out: dict[int, int] = {}
    v, epoch = top.version, top.epoch
    m = _pick(deltas, snapshots, v, epoch)
    while m is not None:
        out[v] = m.epoch
        v -= 1
        m = _pick(deltas, snapshots, v, _base_of(deltas, m)) if v >= 1 else None
    return out


def resolve_chain(
    store: StoreId,
    version: int,
    deltas: Candidates,
    snapshots: Candidates,
) -> list[Manifest]:
    """The manifests to apply, oldest first, to rebuild ``version``.

    ``deltas`` and ``snapshots`` map a version to its manifest, or to every manifest held of it
    (one per epoch). The manifest of ``version`` is the head's lineage's (see "Lineage" in the
    module docstring), else its highest epoch; then the walk goes down: a snapshot at the
    wanted epoch ends it; otherwise the delta is taken and the walk goes on to its base, the
    manifest of ``version - 1`` at the delta's ``base_epoch`` (the highest epoch when it names
    none), until a snapshot or version 1's delta (which applies to the empty state). Without
    base epochs and with one manifest per version this is the rule before lineage: a snapshot
    of a version is used when its epoch is at least that of the delta of the same version (a
    newer writer's re-commit makes an older snapshot stale).

    Raises VersionNotFound naming the first missing version (or version and epoch).
    """
    chain: list[Manifest] = []
    v = version
    epoch = lineage(deltas, snapshots).get(version)
    while v >= 1:
        m = _pick(deltas, snapshots, v, epoch)
        if m is None:
            if v == version:
                raise VersionNotFound(
                    f"store {store} has no version {version}: list versions with "
                    "versions() and restore one of them"
                )
            if epoch is not None and (manifests_at(deltas, v) or manifests_at(snapshots, v)):
                err = VersionNotFound(
                    f"store {store} version {version} needs version {v} as written at epoch "
                    f"{epoch}, which no replica that answered holds: retry once the ring has "
                    "repaired, or restore a newer version"
                )
            else:
                err = VersionNotFound(
                    f"store {store} version {version} needs version {v}, which is gone "
                    "(past retention or never committed): restore a newer version"
                )
            err.gap = v
            raise err
        chain.append(m)
        if m.kind == "snapshot":
            break
        epoch = m.base_epoch
        v -= 1
    chain.reverse()
    return chain


def local_chain(deltas: Candidates, snapshots: Candidates, version: int) -> list[Manifest]:
    """What one replica can contribute to the chain of ``version``, for the reader to merge
    with the other replicas' answers and resolve with :func:`resolve_chain`:

    - every manifest it holds above ``version`` (the reader needs their epochs and bases to
      find the head's lineage through ``version``);
    - from ``version`` down, every manifest of each version, for as long as some line of
      descent through ``version`` may still need a lower one: each epoch followed at a version
      ends at its snapshot or goes on to its delta's base (every epoch when this replica does
      not hold the manifest that would say which). At a gap (versions it missed while it
      was down, not yet repaired) it goes on from the next version it holds below, every
      epoch: another replica may hold the gap but not what lies under it, and the merged
      answers of a read quorum must hold every acknowledged version of the chain (a rolling
      restart under a writer left each replica a different gap: tests/ring/test_upgrade.py).
    """
    out: list[Manifest] = []
    for t in (deltas, snapshots):
        for v in sorted(t):
            if v > version:
                out.extend(manifests_at(t, v))
    follow: set[int | None] | None = None  # None: every epoch; None in the set: the highest
    v = version
    below: list[int] | None = None  # the versions held under ``version``, on the first gap
    while v >= 1 and follow != set():
        ds, snaps = manifests_at(deltas, v), manifests_at(snapshots, v)
        if not ds and not snaps:
            if below is None:
                below = sorted({u for t in (deltas, snapshots) for u in t if u < version})
            i = bisect.bisect_left(below, v)
            if i == 0:
                break  # nothing held under the gap
            v, follow = below[i - 1], None
            continue
        out.extend(snaps)
        out.extend(ds)
        epochs = {m.epoch for m in (*ds, *snaps)}
        if follow is None:
            wanted: set[int | None] = set(epochs)
        else:
            wanted = {e for e in follow if e is None or e in epochs}
            if any(e is not None and e not in epochs for e in follow):
                wanted = set(epochs)  # another replica holds it: its base is anyone's guess
        nxt: set[int | None] | None = set()
        for e in wanted:
            m = _pick(deltas, snapshots, v, e)
            if m is None or m.kind == "snapshot":
                continue
            assert nxt is not None
            nxt.add(m.base_epoch)
        follow = nxt
        v -= 1
    return out
