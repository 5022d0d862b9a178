"""Storage amplification: bytes on each node's disk against the bytes a perfect store needs,
under snapshot and space rules side by side.

For each live-state size and change rate, fresh 3-node rings (R=3, the default retention
of 100 versions) receive the same update stream: one store of ``--live-mib`` MiB (16-byte keys,
``--value``-byte random values: they do not compress, so raw bytes are stored bytes), then
``--versions`` commits each replacing ``rate`` of the keys, chosen at random, ``--pace``
seconds apart (a streaming trigger: without it commits outrun compaction, and the snapshots
written depend on how far it got). One ring keeps every snapshot (``--thin-snapshots 0``:
a snapshot every 10 deltas, the rule before thinning), one ``--rebase-at 0.5`` (a
new base once the deltas above the last one also weigh half of it,
core/retention.needs_snapshot), one the default ``--thin-snapshots 50`` (of the snapshots
above the floor, the newest and those at multiples of 50 are kept:
core/retention.Thinning), and one at that default with its LMDB file compacted once a
quarter of it is free (``--reclaim-at 0.25``, the default; the others at 0.5, the default
before; node/space.py), and one at ``--thin-snapshots 10`` (rungs every 10 versions: the
floor lags the retention line by less, for a rung folded every 10 versions);
``--layouts`` picks some; ``--first-whole`` commits version 1 whole (``snapshot=True``, as
an SDK writer's first commit may be), ``--whole-at V ...`` those versions (the whole state
then, as Spark's provider commits on forceSnapshotOnCommit; its rows count in *perfect*
as the version's 1% only). Commits go to the rings in turn, version by version (the order
rotates). Once repair, compaction and retention have settled, it
restores the latest and the oldest retained version from each ring, alternating over
``--rounds`` rounds, and reads from every node (``GET /v1/health``, ``storage``) the storage
file's bytes and the bytes held (chunks and manifests). Per rule and node (median, min-max
over the three):

- ``disk / perfect``: the file against what a store sharing every unchanged byte between
  versions must keep to restore each retained version exactly: the oldest retained
  version's state plus the rows each later retained version wrote (every written value is
  new random bytes, so none is shared);
- ``held / perfect``: the same for the bytes the layout holds (chunks and manifests);
- ``disk / live``;
- ``disk / held``: the storage engine's amplification (LMDB's free pages and page slack),
  which node/space.py's compaction bounds (``--reclaim-at``);
- restore of the latest and of the oldest retained version, and commit time (summed over
  five blocks of versions), as the median ratio to the ``every 10`` ring (min-max).

Per rule it also prints the snapshots its nodes folded and the CPU seconds its three node
processes used over the whole run (compaction's work is most of what differs). It also times
a compaction of one node's file (the last rule's ring), copied after the
run, with its bytes before and after and how long it held reads and writes (node/space.py).

    .venv/bin/python bench/storage.py [--live-mib 4 16] [--rates 0.01 0.2] [--versions 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from _common import MiB, local_ring, machine, table

from client import RingClient, StoreId
from statestore.cli.local import http_json
from statestore.node.backends import LmdbBackend

KEY = 16
RETAIN = 100  # the nodes' default --retain


LAYOUTS = {  # the rule before thinning first: the others' times are ratios to it
    "every 10": ["--thin-snapshots", "0", "--reclaim-at", "0.5"],
    "rebase 0.5": ["--rebase-at", "0.5", "--thin-snapshots", "0", "--reclaim-at", "0.5"],
    "thin 50": ["--thin-snapshots", "50", "--reclaim-at", "0.5"],
    # the defaults: thinning, and the file compacted once a quarter of it is free
    "thin 50, reclaim 0.25": [
        "--thin-snapshots",
        "50",
        "--reclaim-at",
        "0.25",
        "--reclaim-min",
        "0",
    ],
    # the floor's lag traded for compaction's work: a rung every 10 versions
    "thin 10, reclaim 0.25": [
        "--thin-snapshots",
        "10",
        "--reclaim-at",
        "0.25",
        "--reclaim-min",
        "0",
    ],
}


def n_keys_of(live_mib: int, value: int) -> int:
    """The keys of a ``live_mib`` MiB store of 16-byte keys and ``value``-byte values."""
    return live_mib * MiB // (KEY + value)


def update_stream(
    live_mib: int, rate: float, versions: int, value: int
) -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """The bench's update stream, ``(version, rows it writes)``: version 1 writes every key,
    each later one ``rate`` of them chosen at random, every value fresh random bytes (seeded
    by the case: the same stream on every run; bench/storage_rocksdb.py replays it)."""
    rng = random.Random(int(live_mib * 1000 + rate * 100))
    n_keys = n_keys_of(live_mib, value)
    keys = [rng.randbytes(KEY) for _ in range(n_keys)]
    per = max(1, int(rate * n_keys))
    for v in range(1, versions + 1):
        picked = list(range(n_keys)) if v == 1 else rng.sample(range(n_keys), per)
        yield v, {keys[i]: rng.randbytes(value) for i in picked}


def live_and_perfect(
    live_mib: int, versions: int, value: int, written: dict[int, int]
) -> tuple[int, int]:
    """The latest version's state bytes, and a perfect store's: the oldest retained
    version's state plus the rows each later retained version wrote (``written``: version
    -> rows; every written value is new random bytes, so none is shared)."""
    live = n_keys_of(live_mib, value) * (KEY + value)
    retained = range(max(1, versions - RETAIN + 1), versions + 1)
    return live, live + sum(written[v] for v in retained[1:]) * (KEY + value)


def run_case(
    live_mib: int,
    rate: float,
    versions: int,
    value: int,
    rounds: int,
    pace: float,
    names: list[str],
    *,
    whole_at: frozenset[int] = frozenset(),
) -> dict[str, Any]:
    """One update stream into a ring per rule of ``names``, side by side. Commits go to
    them in turn (the order rotates); restores of the latest and the oldest retained
    version too, over ``rounds`` rounds."""
    written: dict[int, int] = {}  # version -> rows it wrote
    sid = StoreId("bench-storage", 0, 0, "default")
    commit_s: dict[str, list[float]] = {n: [] for n in names}
    restore_s: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        rings = {n: stack.enter_context(local_ring(3, LAYOUTS[n])) for n in names}
        clients = {n: stack.enter_context(RingClient(rings[n].seeds, timeout=120)) for n in names}
        state: dict[bytes, bytes] = {}  # kept only for versions committed whole
        for v, puts in update_stream(live_mib, rate, versions, value):
            written[v] = len(puts)
            if whole_at:
                state.update(puts)
            body = dict(state) if v in whole_at else puts
            for n in _turn(names, v):
                t0 = time.perf_counter()
                clients[n].commit(sid, v, body, [], epoch=1, snapshot=v in whole_at)
                commit_s[n].append(time.perf_counter() - t0)
            time.sleep(pace)  # a streaming trigger: compaction runs between versions
        time.sleep(
            45
        )  # compaction, retention, thinning's chunk step and the space loop have passes
        oldest = max(1, versions - RETAIN + 1)
        for r in range(rounds):
            for which, version in (("latest", versions), ("oldest", oldest)):
                for n in _turn(names, r):
                    t0 = time.perf_counter()
                    clients[n].restore(sid, version)
                    restore_s.setdefault((n, which), []).append(time.perf_counter() - t0)
        # a compaction of one node's file (the last rule's ring), on a copy of it
        db = os.path.join(rings[names[-1]].procs[0].data_dir, "db")
        with tempfile.TemporaryDirectory(prefix="statestore-bench-db-") as tmp:
            copy = os.path.join(tmp, "db")
            shutil.copytree(db, copy, ignore=shutil.ignore_patterns("lock.mdb"))
            backend = LmdbBackend(copy)
            t0 = time.monotonic()
            before, after = backend.compact()
            took, pause = time.monotonic() - t0, backend.last_pause
            backend.close()
        figures: dict[str, list[dict[str, Any]]] = {}
        cpu = {n: sum(_cpu_s(p.proc.pid) for p in rings[n].procs if p.proc) for n in names}
        for n in names:
            figures[n] = []
            for address in rings[n].seeds:
                health = http_json(address, "/v1/health")
                assert isinstance(health, dict)
                figures[n].append(health["storage"] | {"stats": health["stats"]})
    live, perfect = live_and_perfect(live_mib, versions, value, written)
    return {
        "live": live,
        "perfect": perfect,
        "disk": {n: [f["file_bytes"] for f in figures[n]] for n in names},
        "held": {n: [f["held_bytes"] for f in figures[n]] for n in names},
        "compactions": {
            n: sum(f["stats"].get("compactions", 0) for f in figures[n]) for n in names
        },
        "folded": {n: sum(f["stats"].get("snapshots", 0) for f in figures[n]) for n in names},
        "cpu": cpu,
        "commit_s": commit_s,
        "restore_s": restore_s,
        "compact": (before, after, took, pause),
    }


def _cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _turn(names: list[str], i: int) -> list[str]:
    """``names`` rotated by ``i``: who goes first changes from one round to the next."""
    k = i % len(names)
    return names[k:] + names[:k]


def ratio(new: list[float], old: list[float], blocks: int = 0) -> str:
    """Median of the per-round ratios new/old (min-max); ``blocks`` > 0 first sums the
    rounds into that many blocks (commit times of single versions are too short alone)."""
    if blocks:
        size = max(1, len(new) // blocks)
        new = [sum(new[i : i + size]) for i in range(0, len(new) - size + 1, size)]
        old = [sum(old[i : i + size]) for i in range(0, len(old) - size + 1, size)]
    rs = [a / b for a, b in zip(new, old, strict=True)]
    return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live-mib", type=int, nargs="+", default=[4, 16])
    p.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.2])
    p.add_argument("--versions", type=int, default=200)
    p.add_argument("--value", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5, help="restore rounds (default 5)")
    p.add_argument("--pace", type=float, default=1.0, help="seconds between versions (default 1)")
    p.add_argument(
        "--first-whole",
        action="store_true",
        help="commit version 1 whole (snapshot=True, as the SDK's first commit may be)",
    )
    p.add_argument(
        "--layouts",
        nargs="+",
        choices=list(LAYOUTS),
        default=list(LAYOUTS),
        help="the rules to run (default all; the first is the baseline of the time ratios)",
    )
    p.add_argument(
        "--whole-at",
        type=int,
        nargs="+",
        default=[],
        metavar="V",
        help="commit these versions whole (the whole state, snapshot=True)",
    )
    args = p.parse_args()
    print(machine())
    whole_at = frozenset(args.whole_at) | ({1} if args.first_whole else set())
    if whole_at:
        print(f"versions committed whole: {sorted(whole_at)}")
    out = []
    names = args.layouts
    old, new = names[0], names[-1]
    for live_mib in args.live_mib:
        for rate in args.rates:
            r = run_case(
                live_mib,
                rate,
                args.versions,
                args.value,
                args.rounds,
                args.pace,
                names,
                whole_at=whole_at,
            )
            for n in names:
                disk, held = r["disk"][n], r["held"][n]
                out.append(
                    [
                        f"{live_mib} MiB",
                        f"{100 * rate:g}%",
                        n,
                        spread([d / r["perfect"] for d in disk]),
                        spread([h / r["perfect"] for h in held]),
                        spread([d / r["live"] for d in disk]),
                        spread([d / h for d, h in zip(disk, held, strict=True)]),
                        *(
                            ["1.00x (baseline)"] * 3
                            if n == old
                            else [
                                ratio(r["restore_s"][n, "latest"], r["restore_s"][old, "latest"]),
                                ratio(r["restore_s"][n, "oldest"], r["restore_s"][old, "oldest"]),
                                ratio(r["commit_s"][n], r["commit_s"][old], blocks=5),
                            ]
                        ),
                    ]
                )
                print(
                    out[-1],
                    f"file compactions: {r['compactions'][n]}, snapshots folded: "
                    f"{r['folded'][n]}, nodes' CPU: {r['cpu'][n]:.0f} s",
                    flush=True,
                )
            before, after, took, pause = r["compact"]
            print(
                f"compaction of one file ({new}): {before / MiB:.0f} -> {after / MiB:.0f} MiB "
                f"in {took:.2f} s, reads and writes held {1000 * pause:.0f} ms",
                flush=True,
            )
    print(
        table(
            [
                "live",
                "changed/version",
                "rule",
                "disk/perfect",
                "held/perfect",
                "disk/live",
                "disk/held",
                "restore latest",
                "restore oldest",
                "commit",
            ],
            out,
        )
    )


if __name__ == "__main__":
    main()
