"""Commit throughput and latency: 1 MiB deltas to a local 3-node ring (R=3, W=2).

Baseline, in the same run and interleaved commit by commit: the same compressed chunks and
manifest written to local files and fsynced by this one process (once as pre-encoded bytes,
once including the encoding, since a ring commit encodes too).

``--secure`` compares instead two rings started side by side: one with auth and TLS on (a
client token, TLS with its own CA, node identity), one with them off; each commit goes to
both, in alternating order, and the ratio is taken commit by commit (goal: on <= 1.1x off).

    .venv/bin/python bench/commit.py [--commits 30] [--rows 10000] [--secure]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

from _common import (
    SECURITY,
    MiB,
    local_ring,
    machine,
    median,
    pct,
    print_security_ratio,
    rows,
    security_pair,
    table,
)

from client import RingClient, StoreId
from client._core import build_commit
from statestore.core.chunk import DEFAULT_CHUNK_SIZE, DEFAULT_KEY_GROUPS, MAX_CHUNK_RAW
from statestore.wire.manifest import encode_manifest


def encode(sid: StoreId, version: int, puts: dict[bytes, bytes]) -> tuple[bytes, list]:
    """What the client sends: the same call, the same defaults, hence the same bytes."""
    manifest, chunks = build_commit(
        sid,
        version,
        puts,
        [],
        {"src": version},
        1,
        False,
        key_groups=DEFAULT_KEY_GROUPS,
        chunk_size=DEFAULT_CHUNK_SIZE,
        max_chunk=MAX_CHUNK_RAW,
    )
    return encode_manifest(manifest), chunks


def write_fsync(directory: str, version: int, manifest: bytes, chunks: list) -> None:
    """Every chunk and the manifest to its own file, each fsynced, then the directory."""
    vdir = os.path.join(directory, str(version))
    os.makedirs(vdir, exist_ok=True)
    for name, data in [*((c.name, c.data) for c in chunks), ("manifest", manifest)]:
        fd = os.open(os.path.join(vdir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    dfd = os.open(vdir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


NODE_ARGS = ["--snapshot-every", "100000"]  # no background compaction: the commit path alone


def latency_table(lat: dict[str, list[float]], names: dict[str, str], raw: int) -> str:
    """Throughput and p50/p99 latency of each path of ``lat``, labelled by ``names``."""
    body = []
    for key, label in names.items():
        xs = lat[key]
        body.append(
            [
                label,
                f"{raw * len(xs) / sum(xs) / MiB:.1f}",
                f"{median(xs) * 1000:.1f}",
                f"{pct(xs, 99) * 1000:.1f}",
            ]
        )
    return table(["path", "MiB/s (raw)", "p50 ms", "p99 ms"], body)


def compare_security(sid: StoreId, deltas: list[dict[bytes, bytes]], warmup: int, raw: int) -> None:
    """Each delta committed to a ring with auth and TLS off and to one with them on, in
    alternating order; prints both and their ratio commit by commit."""
    lat: dict[str, list[float]] = {"off": [], "on": []}
    with security_pair(NODE_ARGS) as clients:
        for i, puts in enumerate(deltas):
            v = i + 1
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                t0 = time.perf_counter()
                clients[name].commit(sid, v, puts, [], {"src": v}, epoch=1)
                if i >= warmup:
                    lat[name].append(time.perf_counter() - t0)
    print(latency_table(lat, SECURITY, raw))
    print_security_ratio(lat["on"], lat["off"], "commit by commit")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=30)
    ap.add_argument("--rows", type=int, default=10_082, help="rows per delta (~104 B each: 1 MiB)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--secure", action="store_true", help="auth and TLS on vs off, instead of local files"
    )
    a = ap.parse_args()

    rng = random.Random(1)
    total = a.warmup + a.commits
    deltas = [rows(a.rows, rng) for _ in range(total)]
    sid = StoreId("bench", 0, 0, "commit")
    pre = [encode(sid, v + 1, d) for v, d in enumerate(deltas)]
    raw = sum(c.raw_size for c in pre[0][1])  # what a chunk holds: rows in msgpack framing
    wire = sum(len(c.data) for c in pre[0][1])
    print(machine())
    print(f"{a.commits} commits of {a.rows} rows: {raw / MiB:.2f} MiB raw, {wire / MiB:.2f} MiB")
    print("compressed per commit; ring: 3 node processes, R=3 W=2, LMDB with fsync\n")
    if a.secure:
        compare_security(sid, deltas, a.warmup, raw)
        return

    lat: dict[str, list[float]] = {"ring": [], "local": [], "local+enc": []}
    with (
        local_ring(3, NODE_ARGS) as ring,
        tempfile.TemporaryDirectory(prefix="statestore-bench-files-") as files,
        RingClient(ring.seeds) as client,
    ):
        for i, puts in enumerate(deltas):
            v = i + 1
            t0 = time.perf_counter()
            write_fsync(os.path.join(files, "pre"), v, *pre[i])
            t1 = time.perf_counter()
            write_fsync(os.path.join(files, "enc"), v, *encode(sid, v, puts))
            t2 = time.perf_counter()
            client.commit(sid, v, puts, [], {"src": v}, epoch=1)
            t3 = time.perf_counter()
            if i >= a.warmup:
                lat["local"].append(t1 - t0)
                lat["local+enc"].append(t2 - t1)
                lat["ring"].append(t3 - t2)

    names = {
        "ring": "ring commit (client encode + 3 replicas, W=2)",
        "local+enc": "local: encode + write + fsync",
        "local": "local: write + fsync (pre-encoded)",
    }
    print(latency_table(lat, names, raw))
    ring_t, enc_t, pre_t = (sum(lat[k]) for k in ("ring", "local+enc", "local"))
    print()
    print(f"ring / local encode+write+fsync: {ring_t / enc_t:.2f}x the time")
    print(f"ring / local write+fsync:        {ring_t / pre_t:.2f}x the time")
    p50 = median(lat["ring"]) / median(lat["local+enc"])
    print(f"p50 latency ring / local encode+write+fsync: {p50:.2f}x")


if __name__ == "__main__":
    main()
