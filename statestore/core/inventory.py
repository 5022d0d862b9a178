"""What the ring holds, seen from the operator's side (pure): merging what each node says it
holds into one listing of stores, and checking a store's copies against its placement.

Each node answers for itself (``GET /v1/inventory`` and ``GET /v1/inventory/{store}``,
node/inventory.py); the admin CLI and the dashboard ask every live member and merge here, so
both agree on the rule: a store's head is the highest ``(epoch, version)`` any node holds, its
versions are the union of what the nodes retain, and a replica "holds its copies" when it has
every manifest of the store and every chunk whose placement names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statestore.core.errors import MalformedData, StoreNotFound, VersionNotFound
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Head, Manifest, candidates, resolve_chain
from statestore.core.quorum import merge_heads
from statestore.core.view import RingView

__all__ = [
    "StoreSummary",
    "head_from_json",
    "inspect_store",
    "manifest_from_json",
    "manifest_to_json",
    "merge_listings",
    "summaries_json",
]


def head_from_json(obj: Any) -> Head | None:
    """``{"version", "epoch"}`` (or null) as a Head; raises MalformedData otherwise."""
    if obj is None:
        return None
    try:
        return Head(int(obj["version"]), int(obj["epoch"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedData(f"a head must be {{'version', 'epoch'}}, got {obj!r}") from exc


def manifest_to_json(m: Manifest) -> dict[str, Any]:
    """A manifest as the inventory endpoints show it (JSON, for people and scripts)."""
    return {
        "version": m.version,
        "kind": m.kind,
        "epoch": m.epoch,
        "key_groups": m.key_groups,
        "chunks": [
            {
                "name": c.name,
                "lo": c.lo,
                "hi": c.hi,
                "size": c.size,
                "raw_size": c.raw_size,
                "rows": c.rows,
                "checksum": c.checksum,
            }
            | ({"index_len": c.index_len, "index_checksum": c.index_checksum} if c.blocked else {})
            for c in m.chunks
        ],
        "positions": dict(m.positions),
    } | ({} if m.base_epoch is None else {"base_epoch": m.base_epoch})


def manifest_from_json(store: StoreId, obj: Any) -> Manifest:
    """The inverse of :func:`manifest_to_json`; raises MalformedData on anything else."""
    try:
        chunks = tuple(
            ChunkRef(
                str(c["name"]),
                int(c["lo"]),
                int(c["hi"]),
                int(c["size"]),
                int(c["raw_size"]),
                int(c["rows"]),
                int(c["checksum"]),
                int(c.get("index_len", 0)),
                int(c.get("index_checksum", 0)),
            )
            for c in obj["chunks"]
        )
        return Manifest(
            store,
            int(obj["version"]),
            str(obj["kind"]),
            int(obj["epoch"]),
            int(obj["key_groups"]),
            chunks,
            dict(obj.get("positions") or {}),
            None if obj.get("base_epoch") is None else int(obj["base_epoch"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedData(f"inventory of {store}: a manifest is malformed ({exc})") from exc


@dataclass
class StoreSummary:
    """One store across the ring: its head, the versions some node retains, who holds it."""

    store: StoreId
    head: Head | None = None
    versions: set[int] = field(default_factory=set)
    holders: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        head = self.head
        return {
            "store": self.store.path,
            "head": None if head is None else {"version": head.version, "epoch": head.epoch},
            "versions": len(self.versions),
            "oldest": min(self.versions) if self.versions else None,
            "holders": sorted(self.holders),
        }


def merge_listings(listings: Mapping[str, Any], query: str | None = None) -> list[StoreSummary]:
    """Merge each node's ``GET /v1/inventory`` answer (by node address) into one summary per
    store, sorted by store path; ``query`` keeps only that query's stores.

    Raises:
        MalformedData: a listing is not the shape the endpoint documents.
    """
    out: dict[str, StoreSummary] = {}
    for address, listing in listings.items():
        try:
            entries = listing["stores"]
            for e in entries:
                store = StoreId.parse(str(e["store"]))
                if query is not None and store.query != query:
                    continue
                s = out.setdefault(store.path, StoreSummary(store))
                s.head = merge_heads([s.head, head_from_json(e.get("head"))])
                s.versions.update(int(v) for v in e.get("versions", []))
                s.holders.append(address)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedData(f"inventory from {address} is malformed ({exc})") from exc
    return [out[k] for k in sorted(out)]


def _merged_manifests(
    store: StoreId, details: Mapping[str, Any]
) -> tuple[dict[int, list[Manifest]], dict[int, list[Manifest]]]:
    """Every manifest some node holds, one per (version, kind, epoch) (core/manifest.py,
    "Lineage": a version may be held at several epochs)."""
    return candidates(
        manifest_from_json(store, obj)
        for detail in details.values()
        if detail is not None
        for obj in detail.get("manifests", [])
    )


def _held(detail: Any) -> tuple[set[tuple[int, str]], set[str]]:
    """(version, kind) of the manifests and the chunk keys a node's detail says it holds."""
    if detail is None:
        return set(), set()
    manifests = {(int(m["version"]), str(m["kind"])) for m in detail.get("manifests", [])}
    return manifests, {str(k) for k in detail.get("chunks", [])}


def inspect_store(
    view: RingView, store: StoreId, details: Mapping[str, Any], *, missing_listed: int = 10
) -> dict[str, Any]:
    """What an operator wants to know about one store, from every live member's
    ``GET /v1/inventory/{store}`` answer (``None`` for a member that did not answer).

    Returns a JSON-able report: the merged head, retained versions with their sizes, the chain
    a restore of the head would read, and for each replica (the first R live nodes of the
    store's manifests, and of each chunk) how many of its copies it holds and which it lacks.
    Nodes that hold copies without being a replica (a hand-off not finished) are listed apart.

    Raises:
        StoreNotFound: no node holds anything of the store.
    """
    deltas, snaps = _merged_manifests(store, details)
    heads = [head_from_json(d.get("head")) for d in details.values() if d is not None]
    head = merge_heads(heads)
    if head is None and not deltas and not snaps:
        raise StoreNotFound(f"no live node holds any version of {store}; check the store name")
    versions = sorted(set(deltas) | set(snaps))
    floor = max((int(d.get("floor", 0)) for d in details.values() if d is not None), default=0)
    chain: list[Manifest] = []
    chain_error = None
    if head is not None:
        try:
            chain = resolve_chain(store, head.version, deltas, snaps)
        except VersionNotFound as exc:
            chain_error = str(exc)
    # what each node should hold: every manifest on the store's replicas, each chunk on its own
    manifest_owners = view.store_replicas(store)
    want: dict[str, tuple[set[tuple[int, str]], set[str]]] = {
        a: (set(), set()) for a in view.live_addresses()
    }
    all_manifests = [m for t in (deltas, snaps) for ms in t.values() for m in ms]
    for m in all_manifests:
        for a in manifest_owners:
            want[a][0].add((m.version, m.kind))
        for ref in m.chunks:
            key = chunk_key(store, m.version, ref.name)
            for a in view.replicas_of(key):
                want[a][1].add(key)
    status = {view.address(mi.id): mi.status for mi in view.members}
    replicas: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for address in sorted(set(want) | set(details)):
        wm, wc = want.get(address, (set(), set()))
        hm, hc = _held(details.get(address))
        row = {
            "address": address,
            "status": status.get(address, "unknown"),
            "answered": details.get(address) is not None,
            "manifests": {"expected": len(wm), "held": len(wm & hm)},
            "chunks": {"expected": len(wc), "held": len(wc & hc)},
            "complete": wm <= hm and wc <= hc,
            "missing": sorted(
                [f"manifest v{v} {k}" for v, k in wm - hm] + [f"chunk {c}" for c in wc - hc]
            )[:missing_listed],
            "extra": len(hm - wm) + len(hc - wc),
        }
        if wm or wc:
            replicas.append(row)
        elif hm or hc:
            others.append(row)
    return {
        "store": store.path,
        "epoch": view.epoch,
        "head": None if head is None else {"version": head.version, "epoch": head.epoch},
        "floor": floor,
        "versions": [_version_row(deltas.get(v, []), snaps.get(v, []), v) for v in versions],
        "chain": [{"version": m.version, "kind": m.kind, "bytes": m.bytes} for m in chain],
        "chain_error": chain_error,
        "chain_bytes": sum(m.bytes for m in chain),
        "replicas": replicas,
        "other_holders": others,
    }


def _version_row(deltas: list[Manifest], snaps: list[Manifest], version: int) -> dict[str, Any]:
    """A version's row: the highest epoch of each kind (the ones a higher epoch replaced,
    kept for the lineage, are listed in ``epochs``)."""
    kinds = [max(ms, key=lambda m: m.epoch) for ms in (deltas, snaps) if ms]
    return {
        "version": version,
        "kinds": [m.kind for m in kinds],
        "epoch": max(m.epoch for m in kinds),
        "epochs": sorted({m.epoch for m in (*deltas, *snaps)}),
        "chunks": sum(len(m.chunks) for m in kinds),
        "bytes": sum(m.bytes for m in kinds),
        "raw_bytes": sum(c.raw_size for m in kinds for c in m.chunks),
        "rows": sum(c.rows for m in kinds for c in m.chunks),
    }


def summaries_json(summaries: Iterable[StoreSummary]) -> list[dict[str, Any]]:
    """The merged listing as ``GET /v1/inventory?scope=ring`` and ``stores ls --json`` show it."""
    return [s.to_json() for s in summaries]
