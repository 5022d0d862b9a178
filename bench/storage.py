"""Storage amplification: bytes on each node's disk against the bytes a perfect store needs.

For each live-state size and change rate, a fresh 3-node ring (R=3, the default retention of
100 versions and a snapshot every 10 versions) holds one store of ``--live-mib`` MiB (16-byte
keys, ``--value``-byte random values: they do not compress, so raw bytes are stored bytes),
then ``--versions`` commits each replace ``rate`` of the keys, chosen at random. Once repair,
compaction and retention have settled, it reads from every node (``GET /v1/health``,
``storage``) the storage file's bytes, the bytes held (chunks and manifests) and the free
pages, and prints, per node (median, min-max over the three):

- ``disk / perfect``: the file against what a store sharing every unchanged byte between
  versions must keep to restore each retained version exactly: the oldest retained
  version's state plus the rows each later retained version wrote (every written value is
  new random bytes, so none is shared);
- ``held / perfect``: the same for the bytes the layout holds (chunks and manifests);
- ``disk / live``;
- ``held / live``: what the layout keeps, before the storage engine's own overhead;
- ``disk / held``: the storage engine's amplification (LMDB's free pages and page slack),
  which node/space.py's compaction bounds (``--reclaim-at``, default half the file).

It also times a compaction of one node's file, copied after the run, with its bytes before
and after and how long it held reads and writes (the swap: node/space.py).

    .venv/bin/python bench/storage.py [--live-mib 4 16] [--rates 0.01 0.2] [--versions 200]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

from _common import MiB, local_ring, machine, table

from client import RingClient, StoreId
from statestore.cli.local import http_json
from statestore.node.backends import LmdbBackend

KEY = 16
RETAIN = 100  # the nodes' default --retain


def run_case(live_mib: int, rate: float, versions: int, value: int) -> dict[str, Any]:
    rng = random.Random(int(live_mib * 1000 + rate * 100))
    n_keys = live_mib * MiB // (KEY + value)
    keys = [rng.randbytes(KEY) for _ in range(n_keys)]
    changed_at: dict[int, set[int]] = {}  # version -> key indexes it changed
    sid = StoreId("bench-storage", 0, 0, "default")
    with local_ring(3) as ring, RingClient(ring.seeds, timeout=120) as client:
        started = time.monotonic()
        client.commit(sid, 1, {k: rng.randbytes(value) for k in keys}, [], epoch=1)
        changed_at[1] = set(range(n_keys))
        per = max(1, int(rate * n_keys))
        for v in range(2, versions + 1):
            picked = rng.sample(range(n_keys), per)
            client.commit(sid, v, {keys[i]: rng.randbytes(value) for i in picked}, [], epoch=1)
            changed_at[v] = set(picked)
        wrote = time.monotonic() - started
        time.sleep(15)  # compaction, retention and the space loop have passes
        figures = []
        for address in ring.seeds:
            health = http_json(address, "/v1/health")
            assert isinstance(health, dict)
            figures.append(health["storage"])
        db = os.path.join(ring.procs[0].data_dir, "db")
        with tempfile.TemporaryDirectory(prefix="statestore-bench-db-") as tmp:
            copy = os.path.join(tmp, "db")
            shutil.copytree(db, copy, ignore=shutil.ignore_patterns("lock.mdb"))
            backend = LmdbBackend(copy)
            t0 = time.monotonic()
            before, after = backend.compact()
            took, pause = time.monotonic() - t0, backend.last_pause
            backend.close()
    live = n_keys * (KEY + value)
    retained = range(max(1, versions - RETAIN + 1), versions + 1)
    perfect = live + sum(len(changed_at[v]) for v in retained[1:]) * (KEY + value)
    disk = [f["file_bytes"] for f in figures]
    held = [f["held_bytes"] for f in figures]
    return {
        "live": live,
        "perfect": perfect,
        "disk": disk,
        "held": held,
        "write_s": wrote,
        "compact": (before, after, took, pause),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live-mib", type=int, nargs="+", default=[4, 16])
    p.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.2])
    p.add_argument("--versions", type=int, default=200)
    p.add_argument("--value", type=int, default=200)
    args = p.parse_args()
    print(machine())
    out = []
    for live_mib in args.live_mib:
        for rate in args.rates:
            r = run_case(live_mib, rate, args.versions, args.value)
            before, after, took, pause = r["compact"]
            out.append(
                [
                    f"{live_mib} MiB",
                    f"{100 * rate:g}%",
                    spread([d / r["perfect"] for d in r["disk"]]),
                    spread([h / r["perfect"] for h in r["held"]]),
                    spread([d / r["live"] for d in r["disk"]]),
                    spread([h / r["live"] for h in r["held"]]),
                    spread([d / h for d, h in zip(r["disk"], r["held"], strict=True)]),
                    f"{before / MiB:.0f} -> {after / MiB:.0f} MiB in {took:.2f} s "
                    f"(held {1000 * pause:.0f} ms)",
                    f"{r['write_s']:.0f} s",
                ]
            )
            print(out[-1], flush=True)
    print(
        table(
            [
                "live",
                "changed/version",
                "disk/perfect",
                "held/perfect",
                "disk/live",
                "held/live",
                "disk/held",
                "compaction of one file",
                "writes took",
            ],
            out,
        )
    )


if __name__ == "__main__":
    main()
