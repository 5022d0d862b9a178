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

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

from client import RingClient, StoreId
from statestore.cli.local import LocalRing, http_json
from tests.ringkit import FAST, local_ring

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
