"""``statestore backup``'s plans (statestore/cli/backup.py) over a scripted ring: the network
calls it makes (``read_versions``, ``read_chains``, ``fetch_chunk``) answer from a script of
what the ring holds at each plan, so that what a long backup meets (a snapshot thinned away
under it, a version retention dropped, a store dropped, a holder that cannot answer) happens
at a chosen point. tests/ring/test_backup.py runs the same against real nodes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import statestore.cli.backup as backup_mod
from statestore.core.chunk import checksum
from statestore.core.errors import NodeUnavailable, StoreNotFound, VersionNotFound
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.net.reads import Retention

A = StoreId("q", 0, 0, "default")
B = StoreId("q", 1, 0, "default")


def _manifest(store: StoreId, v: int, kind: str, tags: list[str]) -> Manifest:
    refs = []
    for tag in tags:
        data = f"{store.path}/{tag}".encode() * 20
        name = f"{kind[0]}{v}-{checksum(data):016x}"
        _DATA[name] = data
        refs.append(ChunkRef(name, 0, 0, len(data), len(data), 1, checksum(data)))
    return Manifest(store, v, kind, 1, 1, tuple(refs), {"p": v}, 1 if kind == "delta" else None)


_DATA: dict[str, bytes] = {}


class _Script:
    """What the ring holds: per store, the plans' answers in turn (versions, chains), the
    chunk names no holder serves, and the calls made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stores: dict[StoreId, list[Any]]):
        self.stores = stores
        self.plan: Counter[StoreId] = Counter()
        self.gone: set[str] = set()
        self.unreachable: set[int] = set()  # versions whose chain read fails (no holder)
        self.fetched: Counter[str] = Counter()
        ring = self

        class Ring:
            def __init__(self, *_: Any) -> None:
                self.transport = None

            async def view(self, fresh: bool = False) -> Any:
                return type("View", (), {"epoch": 1})()

            async def routed(self, op: Any) -> Any:
                return await op(None)

            async def stores_of(self, query: str) -> tuple[list[StoreId], list[str]]:
                return sorted(ring.stores, key=lambda s: s.path), []

            async def close(self) -> None:
                pass

        async def read_retention(transport: Any, view: Any, store: StoreId) -> Retention:
            ring.plan[store] += 1
            answer = ring.stores[store][ring.plan[store] - 1]
            if answer is None:
                raise StoreNotFound(f"store {store} has no committed version")
            return Retention(sorted(answer), None)

        async def read_chains(transport: Any, view: Any, pairs: Any) -> list[list[Manifest]]:
            out = []
            for store, v in pairs:
                if v in ring.unreachable:
                    raise NodeUnavailable(f"{store} v{v}: no holder answered")
                chains = ring.stores[store][ring.plan[store] - 1]
                if v not in chains:
                    raise VersionNotFound(f"{store} v{v}")
                out.append(chains[v])
            return out

        async def fetch_chunk(
            transport: Any, view: Any, store: StoreId, version: int, ref: ChunkRef, stats: Any
        ) -> bytes:
            if ref.name in ring.gone:
                raise NodeUnavailable(f"item {ref.name} could not be read from any live holder")
            ring.fetched[ref.name] += 1
            return _DATA[ref.name]

        monkeypatch.setattr(backup_mod, "_Ring", Ring)
        monkeypatch.setattr(backup_mod, "read_retention", read_retention)
        monkeypatch.setattr(backup_mod, "read_chains", read_chains)
        monkeypatch.setattr(backup_mod, "fetch_chunk", fetch_chunk)


def _files(out: Path) -> tuple[dict[str, Any], set[str], set[str]]:
    index = json.loads((out / "backup.json").read_text())
    named = {f["path"] for f in index["files"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    return index, named, on_disk - {"backup.json"}


def test_a_thinned_snapshot_reads_again_only_its_store_and_fetches_each_chunk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s1, d2, d3 = (_manifest(A, 1, "snapshot", ["a"]), _manifest(A, 2, "delta", ["b"]),
                  _manifest(A, 3, "delta", ["c"]))  # fmt: skip
    s2 = _manifest(A, 2, "snapshot", ["s"])
    b1 = _manifest(B, 1, "snapshot", ["x", "y"])
    first = {1: [s1], 2: [s1, d2], 3: [s1, d2, d3]}
    # the second plan: version 1 dropped by retention, a new floor at 2
    second = {2: [s2], 3: [s2, d3]}
    ring = _Script(monkeypatch, {A: [first, second], B: [{1: [b1]}]})
    ring.gone = {s1.chunks[0].name}  # thinned away while the first plan copied
    out = tmp_path / "bk"
    assert backup_mod.backup(["n:1"], "q", str(out)) == 0
    said = capsys.readouterr()
    err = " ".join(said.err.split())  # rich wraps its lines
    assert "reading their chains again" in err
    assert f"{A} v1 left out: retention dropped it during the backup" in err
    assert "(the chains of 1 stores read again)" in said.out
    assert ring.plan == {A: 2, B: 1}  # B's chains were not read again
    assert set(ring.fetched.values()) == {1}  # d3's chunk, copied in the first plan, once
    index, named, on_disk = _files(out)
    assert on_disk == named  # s1's and d2's files are gone with the plan that named them
    assert {e["store"]: e["versions"] for e in index["stores"]} == {A.path: [2, 3], B.path: [1]}
    assert backup_mod.verify_backup(out)["manifests"][A] == [s2, d3]


def test_a_store_dropped_during_the_backup_is_left_out_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a1, b1 = _manifest(A, 1, "snapshot", ["a"]), _manifest(B, 1, "snapshot", ["b"])
    ring = _Script(monkeypatch, {A: [{1: [a1]}, None], B: [{1: [b1]}]})
    ring.gone = {a1.chunks[0].name}  # the drop took its chunks first
    out = tmp_path / "bk"
    assert backup_mod.backup(["n:1"], "q", str(out)) == 0
    assert f"warning: {A} left out" in " ".join(capsys.readouterr().err.split())
    index, named, on_disk = _files(out)
    assert [e["store"] for e in index["stores"]] == [B.path] and on_disk == named


def test_a_chunk_no_holder_serves_through_every_plan_fails_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a1 = _manifest(A, 1, "snapshot", ["a"])
    ring = _Script(monkeypatch, {A: [{1: [a1]}] * backup_mod.PLANS})
    ring.gone = {a1.chunks[0].name}
    out = tmp_path / "bk"
    with pytest.raises(NodeUnavailable):
        backup_mod.backup(["n:1"], "q", str(out))
    assert ring.plan[A] == backup_mod.PLANS
    assert not out.exists() and not (tmp_path / ("bk" + backup_mod.PARTIAL)).exists()


def test_a_version_no_holder_answers_for_is_no_version_retention_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build before took any error reading an older version's chain for retention
    dropping it: a backup missing a retained version said only a warning, and exited 0."""
    s1, d2 = _manifest(A, 1, "snapshot", ["a"]), _manifest(A, 2, "delta", ["b"])
    ring = _Script(monkeypatch, {A: [{1: [s1], 2: [s1, d2]}]})
    ring.unreachable = {1}
    with pytest.raises(NodeUnavailable):
        backup_mod.backup(["n:1"], "q", str(tmp_path / "bk"))
