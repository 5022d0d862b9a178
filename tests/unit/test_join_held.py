"""What a joining node counts as held (node/moves/join._held): what it holds, and what lies
below its retention floor, which it must not fetch (a manifest copy there is not kept, so
fetching it again every round never ended a join: simulator seed 87846624326268)."""

from __future__ import annotations

from types import SimpleNamespace

from statestore.core.chunk import encode_chunks
from statestore.core.ids import StoreId, chunk_key
from statestore.core.items import ChunkItem, ManifestItem
from statestore.core.manifest import Manifest
from statestore.node.backends import open_backend
from statestore.node.moves.join import _held
from statestore.node.replica import NodeStore

SID = StoreId("q", 0, 0)


def test_held_counts_what_is_below_the_floor_and_what_is_here() -> None:
    store = NodeStore(open_backend("memory://"))
    store.put_manifest(Manifest(SID, 5, "snapshot", 1, 1, (), {}))
    (chunk,) = encode_chunks({b"k": b"v"}, [], groups=1, kind="s")
    store.put_chunk(chunk_key(SID, 5, chunk.name), chunk.data)
    store.apply_floor(SID, 5)
    node = SimpleNamespace(store=store)
    names = {
        "old manifest": ManifestItem(SID, 3, "delta", 1).name(),
        "old chunk": ChunkItem(chunk_key(SID, 3, "d0-" + "1" * 16)).name(),
        "held manifest": ManifestItem(SID, 5, "snapshot", 1).name(),
        "held chunk": ChunkItem(chunk_key(SID, 5, chunk.name)).name(),
        "new manifest": ManifestItem(SID, 6, "delta", 1).name(),
        "new chunk": ChunkItem(chunk_key(SID, 6, "d0-" + "2" * 16)).name(),
        "other store": ManifestItem(StoreId("q", 0, 1), 3, "delta", 1).name(),
    }
    held = _held(node, set(names.values()))  # type: ignore[arg-type]
    assert {k for k, n in names.items() if n in held} == {
        "old manifest",
        "old chunk",
        "held manifest",
        "held chunk",
    }


def test_held_counts_a_folded_snapshot_under_the_line_once_offered_and_never_a_whole_one() -> None:
    """A snapshot manifest under our thinning line is not held until a copy of it was
    offered and refused (a folded one: its name does not say so): one round fetches it,
    and the next counts it held. A whole one (``w`` chunks, core/manifest.Manifest.whole)
    is taken when offered, so it is fetched, and held after. The build before counted
    every one held at once: a node joining while it held a line never fetched a whole
    snapshot's manifest (repair brought it later)."""
    from statestore.core.commit import build_commit
    from statestore.core.retention import Thinning

    store = NodeStore(open_backend("memory://"))
    store.apply_thinning(SID, Thinning(below=10, every=4, chunks=0, floor=0))
    node = SimpleNamespace(store=store)

    def snapshot(version: int, kind: str) -> Manifest:
        return build_commit(
            SID, version, {b"k": b"v"}, [], {}, 1, True, key_groups=1, chunk_size=1 << 20,
            max_chunk=1 << 20, snapshot_kind=kind,
        )[0]  # fmt: skip

    folded, whole = snapshot(5, "s"), snapshot(6, "w")
    names = {ManifestItem.of(m).name(): m for m in (folded, whole)}
    assert _held(node, set(names)) == set()  # type: ignore[arg-type]
    assert store.copy_manifests([folded, whole]) == [False, True]  # a round's copies
    assert _held(node, set(names)) == set(names)  # type: ignore[arg-type]
