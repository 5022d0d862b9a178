"""Pure-core builders shared by tests: recovery-plan tasks (the planner and its calibration)
and lineage manifests (the Python chain resolver and its Java port, tests/ring/test_java_codec.py).
No node, no socket: plain values."""

from __future__ import annotations

from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.core.plan import ChunkTask

SID = StoreId("q1", 0, 3, "default")
NODES = [f"10.0.0.{i}:7400" for i in range(1, 6)]  # a plan's holders


# -- recovery plans ------------------------------------------------------------------------
def tasks(
    chain: int, per_version: int, size: int = 1 << 20, snap_factor: int = 1
) -> list[ChunkTask]:
    out = []
    for pos in range(chain):
        for i in range(per_version * (snap_factor if pos == 0 else 1)):
            k = f"q/0/0/default/{pos + 1}/d{i}-{pos:08x}{i:08x}"
            holders = tuple(NODES[(pos + i + j) % len(NODES)] for j in range(len(NODES)))
            out.append(
                ChunkTask(
                    k, pos, pos + 1, f"d{i}-{pos:08x}{i:08x}", i, size, 2 * size, 100, holders
                )
            )
    return out


# -- manifests and lineages ------------------------------------------------------------------
def manifest(version: int, kind: str = "delta", epoch: int = 1, digest: int = 1) -> Manifest:
    ref = ChunkRef(f"{kind[0]}0-{digest:016x}", 0, 127, 10, 20, 1, digest)
    return Manifest(SID, version, kind, epoch, 128, (ref,), {"src": version})


def lm(version: int, epoch: int, base: int | None = None, kind: str = "delta") -> Manifest:
    """A manifest of ``version`` written at ``epoch`` on top of ``base`` (its content digest
    says which, so two epochs of one version differ)."""
    m = manifest(version, kind, epoch, digest=version * 100 + epoch)
    return Manifest(m.store, m.version, m.kind, m.epoch, m.key_groups, m.chunks, m.positions, base)


# (case, manifests every replica answered together, version asked, chain as (version, epoch,
# kind), or the VersionNotFound message expected). docs/reliability.md, "Lineage".
LINEAGE_CASES = [
    (
        "the simulator's bug: w3's refused v1 (e2) must not shadow w2's under w4's v2",
        [lm(1, 1), lm(1, 2), lm(2, 3, base=1)],
        2,
        [(1, 1, "delta"), (2, 3, "delta")],
    ),
    (
        "restoring the shadowed version itself returns the head's lineage (w2's)",
        [lm(1, 1), lm(1, 2), lm(2, 3, base=1)],
        1,
        [(1, 1, "delta")],
    ),
    (
        "without base_epoch (older writers): the highest epoch, as before",
        [lm(1, 1), lm(1, 2), lm(2, 3)],
        2,
        [(1, 2, "delta"), (2, 3, "delta")],
    ),
    (
        "seed 252360137555522: a refused v2 at e3 between the acked v2 (e1) and v3 (e4)",
        [lm(1, 1), lm(2, 1, 1), lm(2, 3, 1), lm(3, 4, 1), lm(4, 4, 4), lm(5, 4, 4)],
        2,
        [(1, 1, "delta"), (2, 1, "delta")],
    ),
    (
        "the head's chain through it",
        [lm(1, 1), lm(2, 1, 1), lm(2, 3, 1), lm(3, 4, 1), lm(4, 4, 4), lm(5, 4, 4)],
        5,
        [(1, 1, "delta"), (2, 1, "delta"), (3, 4, "delta"), (4, 4, "delta"), (5, 4, "delta")],
    ),
    (
        "a writer that took over from a refused commit's manifest builds on it: so does its chain",
        [lm(1, 1), lm(2, 1, 1), lm(2, 2, 1), lm(3, 3, 2)],
        3,
        [(1, 1, "delta"), (2, 2, "delta"), (3, 3, "delta")],
    ),
    (
        "a snapshot of the lineage's epoch ends the chain; the dead branch's delta is skipped",
        [lm(1, 1), lm(2, 1, 1), lm(3, 1, 1), lm(3, 1, 1, "snapshot"), lm(3, 2, 1), lm(4, 3, 1)],
        4,
        [(3, 1, "snapshot"), (4, 3, "delta")],
    ),
    (
        "a snapshot of another epoch is not the base",
        [lm(1, 1), lm(2, 1, 1), lm(2, 2, 1, "snapshot"), lm(3, 3, 1)],
        3,
        [(1, 1, "delta"), (2, 1, "delta"), (3, 3, "delta")],
    ),
    (
        "a version above the head's (a fenced writer's) follows its own bases",
        [lm(1, 1), lm(2, 1, 1), lm(3, 1, 1), lm(2, 2, 1)],
        3,
        [(1, 1, "delta"), (2, 1, "delta"), (3, 1, "delta")],
    ),
    (
        "the exact base is missing: an error, never another epoch's state",
        [lm(1, 1), lm(2, 3, base=2)],
        2,
        "needs version 1 as written at epoch 2",
    ),
    (
        "the base version is gone altogether",
        [lm(2, 1, 1)],
        2,
        "needs version 1, which is gone",
    ),
]
