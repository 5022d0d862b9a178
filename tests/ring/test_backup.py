"""``statestore backup`` and ``restore-backup`` against real node processes (cli/backup.py).

Ring A holds a query of three stores (deltas with deletes, a snapshot commit, a writer that
took over at a higher epoch and rewrote history from v4, so a dead branch sits beside the
live one). It is backed up whole and at one point in time, dropped, and stopped. On ring B:
damaged backups (a flipped byte, a missing file, no index, an unfinished directory) are
refused with a non-zero exit before anything is written; the backup loads and every
backed-up version restores byte for byte with its epoch and positions; loading again over the
query is refused; the point-in-time backup loads under another name (--as) with each store at
its latest version <= V; and a load that fails midway (a quota too small) drops what it
loaded.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import statestore.cli.backup as backup_mod
from client import RingClient, StoreId
from statestore.cli.local import LocalRing, http_json
from statestore.core.ids import chunk_key
from statestore.core.manifest import Manifest
from statestore.net.reads import fetch_chunk
from tests.ringkit import FAST, commit_row, eventually, local_ring

Q = "q-bk"
STORES = [StoreId(Q, 0, 0, "default"), StoreId(Q, 0, 1, "default"), StoreId(Q, 1, 0, "agg")]
State = tuple[dict[bytes, bytes], int, dict[str, object]]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args], capture_output=True, text=True, timeout=180
    )


def write(ring: RingClient) -> None:
    rng = random.Random(39)
    for n, sid in enumerate(STORES):
        state: dict[bytes, bytes] = {}
        for v in range(1, 7 + n):
            puts = {f"k{rng.randrange(400):04d}".encode(): rng.randbytes(60) for _ in range(80)}
            dels = [k for k in sorted(state)[::7] if k not in puts]
            state.update(puts)
            for k in dels:
                del state[k]
            if n == 1 and v == 4:  # a snapshot commit: the whole state
                puts, dels = dict(state), []
            ring.commit(sid, v, puts, dels, {"src": v * 10, "s": sid.path}, epoch=1,
                        snapshot=(n == 1 and v == 4))  # fmt: skip
    # a writer that took over at epoch 2 from v4 of the first store: v5@1.. are a dead branch
    sid = STORES[0]
    st = ring.restore(sid, 4)
    for v in (5, 6):
        ring.commit(sid, v, {f"new{v}".encode(): b"x" * 30}, [b"k0001"], {"src": 1000 + v},
                    epoch=2, base_epoch=st.epoch if v == 5 else 2)  # fmt: skip


def states(ring: RingClient, stores: list[StoreId]) -> dict[tuple[str, int], State]:
    out: dict[tuple[str, int], State] = {}
    for sid in stores:
        for v in ring.versions(sid):
            st = ring.restore(sid, v)
            out[(f"{sid.operator}/{sid.partition}/{sid.name}", v)] = (
                dict(st), st.epoch, dict(st.positions)
            )  # fmt: skip
    return out


def held(ring: LocalRing, query: str) -> list[str]:
    out = []
    for address in ring.seeds:
        obj = http_json(address, "/v1/stores")
        assert isinstance(obj, dict)
        out += [s for s in obj["stores"] if s.startswith(query + "/")]
    return out


def refused(ring: LocalRing, directory: Path, query: str, why: str) -> None:
    r = cli("restore-backup", "--seeds", ring.seeds[0], "--from", str(directory), "--as", query)
    assert r.returncode != 0, r.stdout
    assert "refused, nothing loaded" in r.stderr and why in r.stderr, r.stderr
    assert held(ring, query) == []


def test_backup_drop_restore_into_another_ring(tmp_path: Path) -> None:
    with local_ring(tmp_path / "a", 3) as a:
        with RingClient(a.seeds) as ring:
            write(ring)
            assert ring.versions(STORES[0])[-1] == 6 and ring.latest(STORES[0]).epoch == 2
            want = states(ring, STORES)
        full, at = tmp_path / "full", tmp_path / "at5"
        r = cli("backup", "--seeds", a.seeds[0], "--query", Q, "--out", str(full))
        assert r.returncode == 0, r.stderr
        assert "backed up 3 stores" in r.stdout
        r = cli("backup", "--seeds", a.seeds[0], "--query", Q, "--version-at", "5", "--out",
                str(at))  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert not list(tmp_path.glob("*.partial-backup"))
        r = cli("backup", "--seeds", a.seeds[0], "--query", Q, "--out", str(full))
        assert r.returncode == 2 and "not empty" in r.stderr
        assert cli("drop", "--seeds", a.seeds[0], "--query", Q, "--yes").returncode == 0

    index = json.loads((full / "backup.json").read_text())
    assert index["query"] == Q and len(index["stores"]) == 3
    files = {f["path"]: f for f in index["files"]}
    assert all((full / p).stat().st_size == f["size"] for p, f in files.items())
    chunks = [p for p in files if "/chunks/" in p]
    manifests = [p for p in files if "/manifests/" in p]
    # the dead branch's v5@1, v6@1 are not on any retained version's chain: not backed up
    first = f"stores/{STORES[0].path}/manifests/"
    assert f"{first}5-delta-2.msgpack" in manifests and f"{first}5-delta-1.msgpack" not in files

    quota = tmp_path / "quota.json"
    quota.write_text(json.dumps({"q-small": {"max_bytes": 12000}}))
    with local_ring(tmp_path / "b", 3, [*FAST, "--quota-file", str(quota)]) as b:
        # damaged backups are refused before anything is written
        bad = tmp_path / "bad"
        shutil.copytree(full, bad)
        victim = bad / chunks[len(chunks) // 2]
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x40
        victim.write_bytes(bytes(data))
        refused(b, bad, Q, "does not match its checksum")
        shutil.rmtree(bad)
        shutil.copytree(full, bad)
        (bad / manifests[-1]).unlink()
        refused(b, bad, Q, "is missing")
        (bad / "backup.json").unlink()
        refused(b, bad, Q, "has no backup.json")
        shutil.rmtree(bad)
        shutil.copytree(full, bad)
        text = (bad / "backup.json").read_text().replace('"versions": [', '"versions": [99, ', 1)
        (bad / "backup.json").write_text(text)
        refused(b, bad, Q, "does not match its own checksum")
        partial = tmp_path / "x.partial-backup"
        shutil.copytree(full, partial)
        refused(b, partial, Q, "did not finish")

        # the whole backup, under its own name
        r = cli("restore-backup", "--seeds", b.seeds[0], "--from", str(full))
        assert r.returncode == 0, r.stderr
        assert "restored 3 stores into query q-bk" in r.stdout
        with RingClient(b.seeds) as ring:
            assert states(ring, STORES) == want
            assert ring.latest(STORES[0]).epoch == 2
        r = cli("restore-backup", "--seeds", b.seeds[0], "--from", str(full))
        assert r.returncode == 1 and "already holds 3 store(s)" in r.stderr

        # one point in time, under another name: each store at v5 (store 0: the epoch-2 v5)
        r = cli("restore-backup", "--seeds", b.seeds[0], "--from", str(at), "--as", "q-at")
        assert r.returncode == 0, r.stderr
        moved = [StoreId("q-at", s.operator, s.partition, s.name) for s in STORES]
        with RingClient(b.seeds) as ring:
            for sid in moved:
                head = ring.latest(sid)
                assert (head.version, head.epoch) == (5, 2 if sid == moved[0] else 1)
                st = ring.restore(sid)
                key = (f"{sid.operator}/{sid.partition}/{sid.name}", 5)
                assert (dict(st), st.epoch, dict(st.positions)) == want[key]

        # a load that fails midway (the quota) drops what it loaded
        r = cli("restore-backup", "--seeds", b.seeds[0], "--from", str(full), "--as", "q-small")
        assert r.returncode == 1, r.stdout
        assert "loading failed" in r.stderr and "dropped query q-small" in r.stderr, r.stderr
        assert held(b, "q-small") == []


def test_the_format_s_pure_rules() -> None:
    from statestore.core.manifest import Manifest
    from statestore.wire.backup import (
        BackupInvalid,
        decode_index,
        encode_index,
        load_order,
        pick_versions,
        same_line,
    )

    assert pick_versions([3, 4, 7, 9], None) == [3, 4, 7, 9]
    assert pick_versions([3, 4, 7, 9], 8) == [7]
    assert pick_versions([3, 4, 7, 9], 2) == []
    sid = STORES[0]
    keys = [(6, "delta", 2), (5, "snapshot", 1), (5, "delta", 1), (7, "delta", 1), (5, "delta", 2)]
    ms = [Manifest(sid, v, k, e, 128, ()) for v, k, e in keys]
    assert [(m.version, m.kind, m.epoch) for m in load_order(ms)] == [
        (5, "delta", 1), (5, "snapshot", 1), (7, "delta", 1), (5, "delta", 2), (6, "delta", 2)
    ]  # fmt: skip
    chain = [(3, "snapshot", 1), (4, "delta", 1), (5, "delta", 2)]
    assert same_line(chain, chain)
    assert same_line(chain, [(4, "snapshot", 1), (5, "delta", 2)])  # folded by the target
    assert same_line(chain, [(5, "snapshot", 2)])
    assert not same_line(chain, [(4, "snapshot", 2), (5, "delta", 2)])  # another epoch
    assert not same_line(chain, [(3, "snapshot", 1), (4, "delta", 1), (5, "delta", 1)])
    assert not same_line(chain, [])
    index = {"format": "statestore-backup", "format_version": 1, "query": Q, "version_at": None,
             "stores": [], "files": []}  # fmt: skip
    assert decode_index(encode_index(index))["query"] == Q
    for broken in (b"", encode_index(index)[:-20], encode_index({**index, "format_version": 2})):
        try:
            decode_index(broken)
        except BackupInvalid:
            continue
        raise AssertionError(f"accepted {broken[:40]!r}")
    evil = {**index, "files": [{"path": "../../etc/passwd", "size": 1, "xxh3_128": "0" * 32}]}
    try:
        decode_index(encode_index(evil))
    except BackupInvalid as exc:
        assert "not a path of this format" in str(exc)
    else:
        raise AssertionError("a path outside the backup was accepted")
    entry = {"store": sid.path, "versions": [1], "chains": {"1": [[1, "snapshot", 1]]},
             "manifests": []}  # fmt: skip
    for retain, ok in ((None, True), (7, True), (0, False), (True, False), ("7", False)):
        one = {**entry, "retain": retain} if retain is not None else entry
        try:
            got = decode_index(encode_index({**index, "stores": [one]}))["stores"][0].retain
        except BackupInvalid as exc:
            assert not ok and "retain" in str(exc), exc
        else:
            assert ok and got == retain, (retain, got)
    # versions and epochs are whole numbers (an infinity made int() raise OverflowError, a
    # traceback where the index should be refused); a file is at most 1 GiB (read whole)
    bad_entries = [
        {**entry, "versions": [float("inf")], "chains": {"1": [[1, "snapshot", 1]]}},
        {**entry, "versions": [1.5]},
        {**entry, "chains": {"1": [[1, "snapshot", float("inf")]]}},
        {**entry, "versions": [-1], "chains": {"-1": [[1, "snapshot", 1]]}},
    ]
    for one in bad_entries:
        try:
            decode_index(encode_index({**index, "stores": [one]}))
        except BackupInvalid as exc:
            assert "malformed" in str(exc), exc
        else:
            raise AssertionError(f"accepted {one}")
    huge = {**index, "files": [{"path": "x", "size": 1 << 40, "xxh3_128": "0" * 32}]}
    try:
        decode_index(encode_index(huge))
    except BackupInvalid as exc:
        assert "bad size" in str(exc), exc
    else:
        raise AssertionError("a file of 1 TiB was accepted")


def test_a_backup_that_outlives_a_thinned_snapshot_reads_the_chains_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backup slower than the nodes' chunk grace (the test holds its first chunk fetch
    until the snapshot its chains named, version 3's, is thinned away: a node folding one
    every version, a writer going on) failed on the build before ("could not be read from
    any live holder") and left nothing; now it reads the chains again, copies what it had
    not copied, names no file of the dropped snapshot, and every backed-up version loads
    back byte for byte."""
    sid = StoreId("q-thin", 0, 0, "default")
    args = [*FAST, "--replicas", "1", "--snapshot-every", "1"]
    with local_ring(tmp_path / "ring", 1, args) as ring, RingClient(ring.seeds) as client:
        rng = random.Random(5)
        for v in range(1, 4):
            puts = {f"k{rng.randrange(300):04d}".encode(): rng.randbytes(80) for _ in range(200)}
            client.commit(sid, v, puts, [], {"src": v}, epoch=1)

        def folded() -> bool:
            return [m.version for m in client.open(sid, 3).lazy.chain] == [3]

        eventually(folded, "version 3 folded into a snapshot", limit=30)
        snap = client.open(sid, 3).lazy.chain[0]
        real = fetch_chunk
        thinned: list[asyncio.Task[None]] = []

        async def slow(transport: Any, view: Any, store: StoreId, version: int, *a: Any) -> bytes:
            if not thinned:  # every fetch of the first plan waits for the thinning
                thinned.append(
                    asyncio.ensure_future(asyncio.to_thread(_thin_away, client, sid, snap, ring))
                )
            await asyncio.shield(thinned[0])
            return await real(transport, view, store, version, *a)

        monkeypatch.setattr(backup_mod, "fetch_chunk", slow)
        out = tmp_path / "bk"
        assert backup_mod.backup(ring.seeds, "q-thin", str(out)) == 0
        monkeypatch.undo()
        index = json.loads((out / "backup.json").read_text())
        named = {f["path"] for f in index["files"]}
        on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        assert on_disk == named | {"backup.json"}
        assert not any("3-snapshot" in p for p in named), sorted(named)
        versions = index["stores"][0]["versions"]
        assert versions[:3] == [1, 2, 3]
        want = {v: dict(client.restore(sid, v)) for v in versions}
        assert backup_mod.restore_backup(ring.seeds, str(out), as_query="q-back") == 0
        back = StoreId("q-back", 0, 0, "default")
        assert {v: dict(client.restore(back, v)) for v in versions} == want


def _thin_away(client: RingClient, sid: StoreId, snap: Manifest, ring: LocalRing) -> None:
    """Commit until the snapshot ``snap`` (of version 3) is thinned and its chunks are gone."""
    for v in range(4, 8):
        client.commit(sid, v, {f"x{v}".encode(): b"y" * 50}, [], {"src": v}, epoch=1)
        time.sleep(0.3)
    url = f"http://{ring.seeds[0]}/v1/chunks/{chunk_key(sid, 3, snap.chunks[0].name)}"

    def gone() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=10):
                return False
        except urllib.error.HTTPError as exc:
            return exc.code == 404

    eventually(gone, "version 3's snapshot chunks dropped", limit=90)


def test_a_forced_restore_over_other_state_at_a_snapshots_version_fails(tmp_path: Path) -> None:
    """``restore-backup --force`` over a store that held, before the load, a snapshot of
    other content at a backed-up snapshot's version and epoch: the load fails and says so,
    and the ring goes on serving what it held (nothing dropped, as --force promises). The
    build before took the conflict for the target's compactor folding the same state,
    read back versions and epochs only, and reported the restore done while the ring served
    the other state (a hostile review found it)."""
    sid = StoreId("q-force", 0, 0, "default")
    backed_up, other = {b"k": b"from the backup"}, {b"k": b"held before"}
    with local_ring(tmp_path / "ring", 3) as ring:
        with RingClient(ring.seeds) as client:
            client.commit(sid, 1, backed_up, [], {}, epoch=1, snapshot=True)
            out = tmp_path / "backup"
            r = cli("backup", "--seeds", ring.seeds[0], "--query", sid.query, "--out", str(out))
            assert r.returncode == 0, r.stderr
            assert (
                cli("drop", "--seeds", ring.seeds[0], "--query", sid.query, "--yes").returncode == 0
            )
            client.commit(sid, 1, other, [], {}, epoch=1, snapshot=True)
            r = cli("restore-backup", "--seeds", ring.seeds[0], "--from", str(out), "--force")
            assert r.returncode == 1, r.stdout
            assert "snapshot of other content at this version and epoch" in r.stderr, r.stderr
            assert "nothing dropped" in r.stderr, r.stderr
            assert dict(client.restore(sid, 1)) == other


def test_a_writers_retain_goes_with_its_store_into_the_restore(tmp_path: Path) -> None:
    """A store whose writer asked its replicas to keep more versions than the nodes'
    ``--retain`` (``retain=N``: Spark's ``minBatchesToRetain``) is restored with that
    ``retain``: every replica of the restored store records it, where the build before
    carried none and the target's ``--retain`` (here 3) would have applied, dropping
    versions the writer counts on once it has more. A store without one is restored
    without one."""
    kept, plain = StoreId("q-ret", 0, 0, "default"), StoreId("q-ret", 0, 1, "default")
    with local_ring(tmp_path / "ring", 3, [*FAST, "--retain", "3"]) as ring:
        seed = ring.seeds[0]
        for v in (1, 2):
            assert commit_row(seed, kept, v, "&retain=40") == 201
            assert commit_row(seed, plain, v) == 201
        out = tmp_path / "backup"
        r = cli("backup", "--seeds", seed, "--query", kept.query, "--out", str(out))
        assert r.returncode == 0, r.stderr
        entries = {e["store"]: e for e in json.loads((out / "backup.json").read_text())["stores"]}
        assert entries[kept.path]["retain"] == 40 and "retain" not in entries[plain.path]
        r = cli("restore-backup", "--seeds", seed, "--from", str(out), "--as", "q-ret2")
        assert r.returncode == 0, r.stderr
        for sid, want in ((kept, 40), (plain, None)):
            target = StoreId("q-ret2", sid.operator, sid.partition, sid.name)
            for address in ring.seeds:  # R=3 on 3 nodes: each is a replica
                got = http_json(address, f"/v1/stores/{target.path}/versions")
                assert isinstance(got, dict) and got["versions"] == [1, 2], got
                assert got.get("retain") == want, (address, got)


def test_a_failed_restore_drops_nothing_a_writer_committed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """restore-backup found the target query empty, then a writer committed to another store
    of it (acknowledged) and the load failed: the drop after the failure would delete the
    writer's commit (hostile review 68). The query is listed again first; with a store the
    restore did not write, nothing is dropped."""
    from statestore.core.errors import NodeUnavailable

    src, other = StoreId("q-src", 0, 0), StoreId("q-dst", 0, 7)
    with (
        local_ring(tmp_path / "ring", 1, [*FAST, "--replicas", "1"]) as ring,
        RingClient(ring.seeds) as client,
    ):
        for v in range(1, 4):
            client.commit(src, v, {f"k{v}".encode(): b"x" * 40}, [], {"src": v}, epoch=1)
        out = tmp_path / "bk"
        assert backup_mod.backup(ring.seeds, "q-src", str(out)) == 0
        real, calls = backup_mod._commit, [0]

        async def commit(*a: Any, **kw: Any) -> None:
            calls[0] += 1
            if calls[0] == 1:
                await real(*a, **kw)
                return
            # a writer commits to the target query; then the restore's node goes away
            await asyncio.to_thread(client.commit, other, 1, {b"mine": b"acked"}, [], {}, epoch=1)
            raise NodeUnavailable("a replica went away (injected)")

        monkeypatch.setattr(backup_mod, "_commit", commit)
        assert backup_mod.restore_backup(ring.seeds, str(out), as_query="q-dst") == 1
        assert client.restore(other, 1)[b"mine"] == b"acked"


async def test_a_backup_fails_on_a_retained_version_whose_chain_no_holder_serves(
    tmp_path: Path,
) -> None:
    """A version the store still retains whose chain is broken (its base delta's manifest
    gone on every holder) fails the backup, as docs/operations.md says: it was left out with
    a warning, as if retention had dropped it, and the backup exited 0 (hostile review 68)."""
    from client import AsyncRingClient
    from tests.ringkit import nodes

    sid = StoreId("q-broken", 0, 0)
    async with nodes(tmp_path, 1, replicas=1, write_quorum=1) as (node,):
        async with AsyncRingClient([node.address]) as c:
            await c.commit(sid, 1, {b"a": b"1"}, [], {}, epoch=1)
            await c.commit(sid, 2, {b"b": b"2"}, [], {}, epoch=1)
            whole = {b"a": b"1", b"b": b"2", b"c": b"3"}
            await c.commit(sid, 3, whole, [], {}, epoch=1, snapshot=True)
            await c.commit(sid, 4, {b"d": b"4"}, [], {}, epoch=1)
        await node.write(node.store.delete_manifest, sid, 1, "delta")
        out = tmp_path / "bk"
        from statestore.core.errors import VersionNotFound

        with pytest.raises(VersionNotFound, match="version 2 needs version 1"):
            await asyncio.to_thread(backup_mod.backup, [node.address], "q-broken", str(out))
        assert not out.exists()
