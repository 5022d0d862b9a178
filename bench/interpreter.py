"""What a node's interpreter settings (node/server.py) do to foreground latency while its
worker threads run Python, side by side in one run. ``--setting``:

- ``switch-interval``: the thread switch interval (``--switch-interval-ms``), Python's
  default (5 ms) against the node's (1 ms);
- ``gc-freeze``: what was alive once the node started, left in the garbage collector's
  full passes (``--no-gc-freeze``) against frozen out of them (the default).

Two 3-node rings run at once, the same but for the setting. Both are loaded with
``--commits`` small commits (a chunk and a manifest each, held by all three nodes). Then,
``--rounds`` times, each ring in turn (the order alternates) is measured for ``--seconds``:
a client commits a 200-row delta and restores a small store in a loop, while background
threads keep every node of that ring answering ``POST /v1/sync/digest`` for the whole
token range, back to back: a scan and a hash of everything it holds, in a worker thread, as
the targets of a decommission's listing do. The same loop without the background threads
is measured too ("idle"). Reported: commit and restore p50 and p99 per ring, and the ratios
second / first (the setting's second value over its first) per round, median with the
range; and each ring's garbage collector pauses over the measured rounds
(``statestore_gc_pause_*`` in ``GET /metrics``).

    PYTHONPATH=. .venv/bin/python bench/interpreter.py --setting switch-interval --commits 1500
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.request

from _common import local_ring, machine, median, pct, rows, table
from prometheus_client.parser import text_string_to_metric_families

from client import RingClient, StoreId
from statestore.core.digest import TOKEN_MAX, Digest
from statestore.wire.digest import encode_request

# per setting: (label, node flags) of the first value, then of the second (the ratios are
# second / first)
SETTINGS: dict[str, tuple[tuple[str, list[str]], tuple[str, list[str]]]] = {
    "switch-interval": (("5 ms", ["--switch-interval-ms", "5"]), ("1 ms", [])),
    "gc-freeze": (("no freeze", ["--no-gc-freeze"]), ("freeze", [])),
}


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


def gc_figures(addresses: list[str]) -> tuple[float, float, float, float]:
    """Summed over ``addresses``' nodes, from ``GET /metrics``: full (generation 2) collector
    passes, their seconds, the longest full pass, and the objects frozen."""
    passes = seconds = longest = frozen = 0.0
    for a in addresses:
        with urllib.request.urlopen(f"http://{a}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                full = sample.labels.get("generation") == "2"
                if sample.name == "statestore_gc_pauses_total" and full:
                    passes += sample.value
                elif sample.name == "statestore_gc_pause_seconds_total" and full:
                    seconds += sample.value
                elif sample.name == "statestore_gc_pause_longest_seconds" and full:
                    longest = max(longest, sample.value)
                elif sample.name == "statestore_gc_frozen_objects":
                    frozen += sample.value
    return passes, seconds, longest, frozen


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
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="switch-interval")
    ap.add_argument("--commits", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    print(machine())
    (old_label, old_flags), (new_label, new_flags) = SETTINGS[args.setting]
    labels = (old_label, new_label)
    with (
        local_ring(3, old_flags) as slow,
        local_ring(3, new_flags) as fast,
    ):
        rings = {old_label: slow, new_label: fast}
        clients = {k: RingClient(r.seeds) for k, r in rings.items()}
        for k, ring in rings.items():
            load(ring.seeds, args.commits)
            rng = random.Random(5)
            for i in range(5):
                batch = rows(2000 if i == 0 else 200, rng)
                clients[k].commit(StoreId("fg", 0, 0), i + 1, batch, snapshot=i == 0)
        print(f"loaded {args.commits} commits on each ring")
        # p[(label, busy)] = [(commit p50, p99, restore p50, p99) per round]
        p: dict[tuple[str, bool], list[tuple[float, float, float, float]]] = {}
        v = {k: 0 for k in labels}
        nodes = {k: [q.address for q in r.procs] for k, r in rings.items()}
        gc_before = {k: gc_figures(a) for k, a in nodes.items()}
        for rnd in range(args.rounds):
            order = labels if rnd % 2 == 0 else labels[::-1]
            for busy in (False, True):
                for k in order:
                    addresses = [q.address for q in rings[k].procs] if busy else []
                    c, r, v[k] = measure(clients[k], args.seconds, v[k], addresses)
                    row = (pct(c, 50), pct(c, 99), pct(r, 50), pct(r, 99))
                    p.setdefault((k, busy), []).append(row)
                    print(
                        f"round {rnd + 1} {k} {'busy' if busy else 'idle'}: commit p50/p99 "
                        f"{row[0] * 1e3:.1f}/{row[1] * 1e3:.1f} ms, restore "
                        f"{row[2] * 1e3:.1f}/{row[3] * 1e3:.1f} ms ({len(c)} of each)"
                    )
        gc_after = {k: gc_figures(a) for k, a in nodes.items()}
        for c in clients.values():
            c.close()
    body = []
    for busy in (False, True):
        for k, what in enumerate(("commit p50", "commit p99", "restore p50", "restore p99")):
            old = [x[k] for x in p[(old_label, busy)]]
            new = [x[k] for x in p[(new_label, busy)]]
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
                f"{old_label}: median ms",
                f"{new_label}: median ms",
                f"{new_label} / {old_label}: median (range)",
            ],
            body,
        )
    )
    print(
        table(
            [
                "nodes (3 per ring)",
                "objects frozen",
                "full collector passes while measured",
                "their seconds",
                "longest full pass ms (run)",
            ],
            [
                [
                    k,
                    f"{gc_after[k][3]:.0f}",
                    f"{gc_after[k][0] - gc_before[k][0]:.0f}",
                    f"{gc_after[k][1] - gc_before[k][1]:.3f}",
                    f"{gc_after[k][2] * 1e3:.1f}",
                ]
                for k in labels
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
