"""What the node's thread switch interval (``--switch-interval-ms``, node/server.py) does to
foreground latency while a worker thread runs Python, side by side in one run.

Two 3-node rings run at once, the same but for the flag: Python's default (5 ms) and the
node's (1 ms). Both are loaded with ``--commits`` small commits (a chunk and a manifest
each, held by all three nodes). Then, ``--rounds`` times, each ring in turn (the order
alternates) is measured for ``--seconds``: a client commits a 200-row delta and restores a
small store in a loop, while background threads keep every node of that ring answering
``POST /v1/sync/digest`` for the whole token range, back to back: a scan and a hash of
everything it holds, in a worker thread, as the targets of a decommission's listing do.
The same loop without the background threads is measured too ("idle"). Reported: commit
and restore p50 and p99 per ring, and the ratios 1 ms / 5 ms per round, median with the
range.

    PYTHONPATH=. .venv/bin/python bench/switch_interval.py --commits 1500 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.request

from _common import local_ring, machine, median, pct, rows, table

from client import RingClient, StoreId
from statestore.core.digest import TOKEN_MAX, Digest
from statestore.wire.digest import encode_request

INTERVALS = ("5", "1")  # ms: Python's default, the node's


def load(seeds: list[str], commits: int) -> None:
    rng = random.Random(1)
    with RingClient(seeds) as client:
        for n in range(commits):
            client.commit(StoreId("load", 0, n % 16), n // 16 + 1, rows(200, rng))


def scan(address: str, halt: threading.Event) -> None:
    """Ask ``address`` for the digest of the whole token range until ``halt``: each answer
    is a scan of everything the node holds."""
    body = json.dumps(encode_request(7, [(0, TOKEN_MAX, Digest())])).encode()
    while not halt.is_set():
        req = urllib.request.Request(
            f"http://{address}/v1/sync/digest",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()


def measure(
    client: RingClient, seconds: float, v0: int, busy: list[str]
) -> tuple[list[float], list[float], int]:
    """Commit and restore in a loop for ``seconds`` (while the nodes ``busy`` scan)."""
    halt = threading.Event()
    scanners = [threading.Thread(target=scan, args=(a, halt), daemon=True) for a in busy]
    for t in scanners:
        t.start()
    rng = random.Random(v0)
    commits: list[float] = []
    restores: list[float] = []
    v = v0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            t = time.perf_counter()
            client.commit(StoreId("fg", 1, v // 50), v % 50 + 1, rows(200, rng, 20_000))
            commits.append(time.perf_counter() - t)
            v += 1
            t = time.perf_counter()
            client.restore(StoreId("fg", 0, 0))
            restores.append(time.perf_counter() - t)
            time.sleep(0.02)
    finally:
        halt.set()
        for s in scanners:
            s.join(60)
    return commits, restores, v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    print(machine())
    with (
        local_ring(3, ["--switch-interval-ms", INTERVALS[0]]) as slow,
        local_ring(3, ["--switch-interval-ms", INTERVALS[1]]) as fast,
    ):
        rings = {INTERVALS[0]: slow, INTERVALS[1]: fast}
        clients = {ms: RingClient(r.seeds) for ms, r in rings.items()}
        for ms, ring in rings.items():
            load(ring.seeds, args.commits)
            rng = random.Random(5)
            for i in range(5):
                batch = rows(2000 if i == 0 else 200, rng)
                clients[ms].commit(StoreId("fg", 0, 0), i + 1, batch, snapshot=i == 0)
        print(f"loaded {args.commits} commits on each ring")
        # p[(ms, busy)] = [(commit p50, p99, restore p50, p99) per round]
        p: dict[tuple[str, bool], list[tuple[float, float, float, float]]] = {}
        v = {ms: 0 for ms in INTERVALS}
        for rnd in range(args.rounds):
            order = INTERVALS if rnd % 2 == 0 else INTERVALS[::-1]
            for busy in (False, True):
                for ms in order:
                    addresses = [q.address for q in rings[ms].procs] if busy else []
                    c, r, v[ms] = measure(clients[ms], args.seconds, v[ms], addresses)
                    row = (pct(c, 50), pct(c, 99), pct(r, 50), pct(r, 99))
                    p.setdefault((ms, busy), []).append(row)
                    print(
                        f"round {rnd + 1} {ms} ms {'busy' if busy else 'idle'}: commit p50/p99 "
                        f"{row[0] * 1e3:.1f}/{row[1] * 1e3:.1f} ms, restore "
                        f"{row[2] * 1e3:.1f}/{row[3] * 1e3:.1f} ms ({len(c)} of each)"
                    )
        for c in clients.values():
            c.close()
    body = []
    for busy in (False, True):
        for k, what in enumerate(("commit p50", "commit p99", "restore p50", "restore p99")):
            old = [x[k] for x in p[(INTERVALS[0], busy)]]
            new = [x[k] for x in p[(INTERVALS[1], busy)]]
            ratios = [a / b for a, b in zip(new, old, strict=True)]
            body.append(
                [
                    "scans running" if busy else "idle",
                    what,
                    f"{median(old) * 1e3:.1f}",
                    f"{median(new) * 1e3:.1f}",
                    f"{median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                ]
            )
    print(
        table(
            [
                "nodes",
                "latency",
                f"{INTERVALS[0]} ms: median ms",
                f"{INTERVALS[1]} ms: median ms",
                f"{INTERVALS[1]} ms / {INTERVALS[0]} ms: median (range)",
            ],
            body,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
