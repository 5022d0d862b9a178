"""Elastic ring benchmark: a node joins a loaded 3-node ring, then one node is decommissioned,
under a steady foreground load of commits and restores (docs/benchmarks.md, Elastic ring).

``--rounds`` times (default 3): a baseline window, a join, a baseline window, a
decommission (a different old member each round, stopped once it left). Reported, measured
in the same run, per move and over the rounds (median with its range, and pooled: the p99
of every request during the moves of a kind / the p99 of every request in their baselines):
- foreground p99 commit and restore latency during each move / before it. Commits take
  :data:`MODES` in turn (the ways a write can treat its replicas still running once W
  acknowledged, ``net/writes.REST``; only the shipped one now: the others' figures are in
  docs/benchmarks.md), restores :data:`READS` (whether reads ask a leaving replica last,
  ``core/view.LEAVING_LAST``; only the shipped one now), each reported on its own. A move's window
  opens when its node starts the hand-over (``started_at`` in ``GET /v1/handover``); for a
  join that is after the new process booted, which on a real ring happens on its own machine
  (the join row "from the process start" counts the boot too);
- bytes moved / the ideal share (a join: 1/N of the ring's copies; a leave: the bytes the
  node held when asked, its tokens' share, which is R/N of the data only on average);
- time of the move (from the ask, boot included) / the same bytes at the ``--stream-mbps``
  budget.

The nodes' data directories go under ``$TMPDIR`` (``tempfile``): ``TMPDIR=/some/tmpfs``
keeps this machine's shared disk, whose fsync stalls hit every node at once, out of the run.

``--rebalance``: instead, a skewed 5-node ring (16 tokens per node, one node moved to 64)
is loaded and ``statestore rebalance`` is run under the same foreground load. Reported: max/mean
bytes held before, as the plan predicted, and measured once the old owners dropped what they
gave up; bytes moved / the ideal (the bytes held that had to change hands); p99 during/before.

Usage: ``python bench/elastic.py --mib 64 --stream-mbps 20`` (the issue asks for >= 1 GiB; a
shared 2-core machine runs a smaller load, and the figures say which);
``python bench/elastic.py --rebalance --mib 64``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

from _common import MiB, local_ring, machine, median, pct, rows, table

from client import RingClient, StoreId
from statestore.cli.local import http_json
from statestore.core import view as ring_view
from statestore.net import writes
from statestore.net.quorate import Rest

CHAIN = 50  # commits per foreground store
# how commits treat replicas still running once W acknowledged (net/writes.REST), in turn
# (B, all wait, and C, all behind, were measured beside it on 2026-11-23: docs/benchmarks.md)
MODES: list[tuple[str, dict[str, Rest]]] = [
    ("as shipped: chunks behind, manifests wait", dict(writes.REST)),
]
# whether restores ask a leaving replica after the others (core/view.LEAVING_LAST), in turn
# (ring order, the way before, was measured beside it on 2026-11-24: docs/benchmarks.md);
# one way only, so that every restore counts towards its p99
READS: list[tuple[str, bool]] = [
    ("a leaving replica last (as shipped)", True),
]
FAST = ["--gossip-interval", "0.2", "--suspect-after", "1", "--down-after", "2.5"]


class Foreground(threading.Thread):
    """Commits a small delta and restores a small store in a loop; keeps every latency with
    the time it ended. The store it restores is written once before (a snapshot and 4
    deltas): restoring the store it commits to would read a chain that grows with every
    commit, and restores would slow down over the run whatever the ring does."""

    def __init__(self, seeds: list[str]) -> None:
        super().__init__(daemon=True)
        self.seeds = seeds
        self.commits: list[list[tuple[float, float]]] = [[] for _ in MODES]  # by mode
        self.restores: list[list[tuple[float, float]]] = [[] for _ in READS]  # by read order
        self.shapes: list[tuple[float, str]] = []  # each restore's plan shape, with its end
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        rng = random.Random(5)
        read = StoreId("fg", 0, 0)
        with RingClient(self.seeds) as client:
            for i in range(5):
                client.commit(read, i + 1, rows(2000 if i == 0 else 200, rng), snapshot=i == 0)
            v = 0
            while not self.halt.is_set():
                batch = rows(200, rng, key_space=20_000)
                t = time.perf_counter()
                try:
                    # a fresh store every CHAIN commits: the bench turns compaction off (it
                    # would snapshot the loaded stores mid-move), and a chain that grew all
                    # run long would make the nodes' passes over it slower round by round
                    sid = StoreId("fg", 1, v // CHAIN)
                    # one commit at a time: the sync client's loop reads REST as it writes
                    writes.REST = dict(MODES[v % len(MODES)][1])
                    client.commit(sid, v % CHAIN + 1, batch, [], {"v": v}, epoch=1)
                    self.commits[v % len(MODES)].append((time.monotonic(), time.perf_counter() - t))
                    v += 1
                    ring_view.LEAVING_LAST = READS[v % len(READS)][1]
                    t = time.perf_counter()
                    got = client.restore(read)
                    self.restores[v % len(READS)].append(
                        (time.monotonic(), time.perf_counter() - t)
                    )
                    self.shapes.append((time.monotonic(), got.plan))
                except Exception as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)


def window(samples: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [s for at, s in samples if start <= at < end]


def wait_move(address: str, state: str, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = http_json(address, "/v1/handover")
        assert isinstance(answer, dict)
        if answer["state"] == state and answer["move"] and answer["move"]["phase"] == "switched":
            return answer
        time.sleep(0.2)
    raise TimeoutError(f"{address} did not become {state}")


def settle(addresses: list[str], stores: list[StoreId], r: int, timeout: float = 300) -> float:
    """Wait until the loaded stores' chunks are held exactly ``r`` times on the ring (old owners
    dropped what a join handed over); returns the seconds it took."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        held: dict[str, int] = {}
        for a in addresses:
            for sid in stores:
                try:
                    detail = http_json(a, f"/v1/inventory/{sid.path}")
                except OSError:
                    continue
                assert isinstance(detail, dict)
                for key in detail.get("chunks", []):
                    held[key] = held.get(key, 0) + 1
        if held and set(held.values()) == {r}:
            break
        time.sleep(1.0)
    return time.monotonic() - t


def leave(address: str) -> None:
    req = urllib.request.Request(f"http://{address}/v1/handover/leave", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        json.loads(resp.read())


def held(addresses: list[str]) -> dict[str, int]:
    """Bytes each node holds (``GET /v1/load``)."""
    out = {}
    for a in addresses:
        load = http_json(a, "/v1/load")
        assert isinstance(load, dict)
        out[str(load["id"])] = int(load["bytes_held"])
    return out


def ratio(loads: dict[str, int]) -> float:
    return max(loads.values()) * len(loads) / sum(loads.values())


def load_ring(seeds: list[str], mib: int, stores: int) -> tuple[float, int]:
    """Commit ``mib`` raw MiB over ``stores`` stores; returns (compressed bytes, R)."""
    rng = random.Random(1)
    data = 0
    with RingClient(seeds) as client:
        n = 0
        while data < mib * MiB * 0.48:  # ~0.48 compressed bytes per raw byte
            res = client.commit(StoreId("load", 0, n % stores), n // stores + 1, rows(10_000, rng))
            data += res.bytes
            n += 1
        r = client.ring().replicas
    print(f"loaded {n} commits: {data / MiB:.1f} MiB of chunks, {r} copies each")
    return data, r


def rebalance_cell(args: argparse.Namespace) -> int:
    """``--rebalance`` (module docstring)."""
    budget = ["--stream-mbps", str(args.stream_mbps)]
    stores = [StoreId("load", 0, i) for i in range(32)]
    with local_ring(5, [*FAST, "--snapshot-every", "100000", "--vnodes", "16", *budget]) as ring:
        addresses = [p.address for p in ring.procs]
        _, r = load_ring(ring.seeds, args.mib, len(stores))
        natural = ratio(held(addresses))  # 16 tokens each, before the skew
        hot = ring.procs[0]
        req = urllib.request.Request(
            f"http://{hot.address}/v1/handover/tokens", data=b'{"vnodes": 64}', method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            json.loads(resp.read())
        while True:
            move = http_json(hot.address, "/v1/handover")["move"]  # type: ignore[index]
            if move and move["phase"] == "switched":
                break
            time.sleep(0.5)
        settle(addresses, stores, r)
        fg = Foreground(ring.seeds[:3])
        fg.start()
        time.sleep(args.baseline)
        before = held(addresses)
        cmd = [sys.executable, "-m", "statestore", "rebalance", "--seeds", ring.seeds[1]]
        dry = json.loads(
            subprocess.run(
                [*cmd, "--dry-run", "--json"], capture_output=True, text=True, check=True
            ).stdout
        )
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        t1 = time.monotonic()
        fg.halt.set()
        fg.join(60)
        if done.returncode != 0:
            print(done.stderr)
            return 1
        moved = 0
        for a in addresses:
            m = http_json(a, "/v1/handover")["move"]  # type: ignore[index]
            if m and m["kind"] == "rebalance":
                moved += int(m["bytes"])
        settled = settle(addresses, stores, r)
        after = held(addresses)
    ideal = sum(max(0, after[n] - before[n]) for n in after)
    before_c = window(fg.commits[0], t0 - args.baseline, t0)
    during_c = window(fg.commits[0], t0, t1)
    restores = sorted(x for r in fg.restores for x in r)  # nobody leaves: one read order
    before_r = window(restores, t0 - args.baseline, t0)
    during_r = window(restores, t0, t1)
    print(
        table(
            [
                "ring",
                "max/mean before",
                "predicted",
                "after",
                "MiB moved",
                "moved / ideal",
                "seconds",
                "commit p99 during / before",
                "restore p99 during / before",
            ],
            [
                [
                    f"5 nodes x 16 tokens, one at 64, R={r}",
                    f"{ratio(before):.3f}",
                    f"{dry['ratio_after']:.3f}",
                    f"{ratio(after):.3f}",
                    f"{moved / MiB:.1f}",
                    f"{moved / max(ideal, 1):.2f}",
                    f"{t1 - t0:.1f}",
                    f"{pct(during_c, 99) / pct(before_c, 99):.2f}x",
                    f"{pct(during_r, 99) / pct(before_r, 99):.2f}x",
                ]
            ],
        )
    )
    steps = ", ".join(f"{s['id'][:6]} -> {s['vnodes']}" for s in dry["steps"])
    print(
        f"plan: {steps}; with 16 tokens on every node (before the skew) max/mean was "
        f"{natural:.3f}; old owners "
        f"were down to R copies {settled:.1f} s after the last move; foreground: "
        f"{sum(map(len, fg.commits))} commits, {len(restores)} restores, "
        f"{len(fg.failures)} failures "
        f"{fg.failures[:3]}"
    )
    return 1 if fg.failures else 0


def started(move: dict[str, object]) -> float:
    """When the move began (its node's ``started_at``), on this process's monotonic clock."""
    return float(move["started_at"]) - (time.time() - time.monotonic())  # type: ignore[arg-type]


def live(ring_seeds: list[str]) -> list[str]:
    """Addresses of the members that are neither down nor gone."""
    view = http_json(ring_seeds[0], "/v1/ring")
    assert isinstance(view, dict)
    return [
        str(m["address"])
        for m in view["members"]
        if m.get("status") != "down" and m.get("state") not in ("left", "leaving", "joining")
    ]


class Move:
    """One join or decommission of a round: its windows and what its node reported."""

    def __init__(self, kind: str, asked: float, answer: dict[str, object], done: float) -> None:
        move = answer["move"]
        assert isinstance(move, dict)
        self.kind, self.asked, self.begun, self.done = kind, asked, started(move), done
        self.move, self.yielded = move, answer.get("yielded")

    def during(self, fg: Foreground, *, from_ask: bool = False) -> list[list[float]]:
        """Latencies of the move's window, per series (:func:`series`)."""
        a = self.asked if from_ask else self.begun
        return [window(x, a, self.done) for x in series(fg)]


def series(fg: Foreground) -> list[list[tuple[float, float]]]:
    """The foreground's latencies: commits in each of :data:`MODES`, then restores in each
    of :data:`READS`."""
    return [*fg.commits, *fg.restores]


LABELS = [f"commit {k}" for k in "ABC"[: len(MODES)]] + [f"restore {k}" for k in "RS"[: len(READS)]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="raw MiB of state loaded before")
    ap.add_argument("--stream-mbps", type=float, default=25.0, help="the nodes' default")
    ap.add_argument("--baseline", type=float, default=8.0, help="seconds measured before")
    ap.add_argument("--rounds", type=int, default=3, help="joins and decommissions, each")
    ap.add_argument("--rebalance", action="store_true", help="the rebalance cell instead")
    args = ap.parse_args()
    print(machine())
    if args.rebalance:
        return rebalance_cell(args)
    budget = ["--stream-mbps", str(args.stream_mbps)]
    stores = [StoreId("load", 0, i) for i in range(16)]
    # with the baseline before it and the ideal bytes to move
    moves: list[tuple[Move, list[list[float]], float]] = []
    with local_ring(3, [*FAST, "--snapshot-every", "100000", *budget]) as ring:
        data, r = load_ring(ring.seeds, args.mib, 16)
        fg = Foreground(ring.seeds[:3])
        fg.start()
        for k in range(args.rounds):
            for kind in ("join", "decommission"):
                time.sleep(args.baseline)
                asked = time.monotonic()
                before = [window(x, asked - args.baseline, asked) for x in series(fg)]
                if kind == "join":
                    ideal = r * data / 4  # a quarter of the copies: 1/N of the ring's
                    node = ring.add_node(["--join", *budget])
                    answer = wait_move(node.address, "normal", 1800)
                else:  # an old member, a different one each round
                    node = next(p for p in ring.procs[k + 1 :] if p.address in live(ring.seeds))
                    # what it holds, all of which must move (its tokens' share: not exactly
                    # a quarter of the copies)
                    ideal = sum(held([node.address]).values())
                    leave(node.address)
                    answer = wait_move(node.address, "left", 1800)
                moves.append((Move(kind, asked, answer, time.monotonic()), before, ideal))
                if kind == "decommission":
                    node.stop()  # decommissioned: the operator stops it
                settle(live(ring.seeds), stores, r)  # old owners down to R copies
        fg.halt.set()
        fg.join(60)
    out = []
    for m, before, ideal in moves:
        during = m.during(fg)
        moved = float(m.move["bytes"])  # type: ignore[arg-type]
        took = m.done - m.asked
        out.append(
            [
                m.kind,
                f"{moved / MiB:.1f}",
                f"{moved / ideal:.2f}",
                f"{took:.1f}",
                f"{took / max(moved / (args.stream_mbps * 1e6), 1e-9):.2f}",
                f"{m.begun - m.asked:.1f}",
                f"{median(before[0]) * 1e3:.0f}",
                *(
                    f"{pct(d, 99) * 1e3:.0f} / {pct(b, 99) * 1e3:.0f}"
                    f" = {pct(d, 99) / pct(b, 99):.2f}x"
                    for d, b in zip(during, before, strict=True)
                ),
                str(m.move["rounds"]),
            ]
        )
    print(
        table(
            [
                "move",
                "MiB moved",
                "moved / ideal",
                "seconds",
                "time / bytes at budget",
                "s to its start",
                "commit p50 ms before",
                *(f"{k} p99 ms during / before" for k in LABELS),
                "rounds",
            ],
            out,
        )
    )
    summary = []
    for kind in ("join", "decommission"):
        of = [(m, b) for m, b, _ in moves if m.kind == kind]
        for from_ask in (False, True):
            if from_ask and kind != "join":
                continue  # a decommission starts when it is asked
            row = [kind + (" (from the process start)" if from_ask else "")]
            for i in range(len(LABELS)):
                during = [m.during(fg, from_ask=from_ask)[i] for m, _ in of]
                base = [b[i] for _, b in of]
                ratios = sorted(pct(d, 99) / pct(b, 99) for d, b in zip(during, base, strict=True))
                pooled = pct([x for d in during for x in d], 99) / pct(
                    [x for b in base for x in b], 99
                )
                row.append(
                    f"{median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}); {pooled:.2f}x"
                )
            times = [
                (m.done - m.asked) / (float(m.move["bytes"]) / (args.stream_mbps * 1e6))  # type: ignore[arg-type]
                for m, _ in of
            ]
            row.append(f"{median(times):.2f} ({min(times):.2f}-{max(times):.2f})")
            summary.append(row)
    print(
        table(
            [
                f"over {args.rounds} rounds",
                *(f"{k} p99 during / before: median (range); pooled" for k in LABELS),
                "time / bytes at budget: median (range)",
            ],
            summary,
        )
    )
    for m, *_ in moves:
        spans = m.move.get("spans") or []  # type: ignore[attr-defined]
        print(
            f"{m.kind} timeline: "
            + ", ".join(f"{step} {s:.2f} s" for step, s in spans)
            + f"; copies that waited for clients: {m.yielded}"
        )
        slow = sorted(
            (s, at - s - m.begun, kind)
            for kind, samples in zip(LABELS, series(fg), strict=True)
            for at, s in samples
            if m.begun <= at < m.done
        )[-6:]
        shapes = Counter(k for at, k in fg.shapes if m.begun <= at < m.done)
        print(f"{m.kind} restores' plan shapes: {dict(shapes)}")
        print(
            f"{m.kind} slowest: "
            + ", ".join(f"{k} {s * 1e3:.0f} ms at +{off:.1f} s" for s, off, k in reversed(slow))
        )
    p50s = [median([x for _, b, _ in moves for x in b[i]]) * 1e3 for i in range(len(MODES))]
    print(
        f"foreground: {sum(map(len, fg.commits))} commits, "
        f"{sum(map(len, fg.restores))} restores, {len(fg.failures)} failures "
        f"{fg.failures[:3]}; commits, in turn: "
        + "; ".join(
            f"{k} {label} (p50 before the moves {p50:.0f} ms)"
            for k, (label, _), p50 in zip("ABC", MODES, p50s, strict=False)
        )
        + "; restores, in turn: "
        + "; ".join(f"{k} {label}" for k, (label, _) in zip("RS", READS, strict=False))
    )
    return 1 if fg.failures else 0


if __name__ == "__main__":
    sys.exit(main())
