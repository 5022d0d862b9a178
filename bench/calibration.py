"""The planner's calibration rule (core/calibration.py) against the rule before it, side by
side on one ring: what a client's restores cost after the ring had a bad moment.

The restorer scales each plan shape's predicted time by how far off that shape's recent
restores ran, and ``auto`` picks the fastest. The rule before (an average of the shape's
ratios, half weight to the newest, kept until that shape runs again) let a few slow star
restores send ``auto`` to line for good; the rule now keeps the median of the last five
ratios and fades a factor back to the model while other shapes run.

One 3-node ring, two clients, one per rule, restoring the same small store (a snapshot and
four deltas) and committing small deltas in a loop. ``--rounds`` times, each client in turn
(the order alternates) runs for ``--seconds``; :data:`BURST_AT` seconds into its turn another
writer commits large deltas for ``--burst`` seconds, a stand-in for a ring busy with a move
or a batch job. Reported per round: each rule's restore p50 and p99 and the
shapes it ran; the ratios now / before per round, their median and range.

    PYTHONPATH=. .venv/bin/python bench/calibration.py --rounds 6 --seconds 20
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping

from _common import local_ring, machine, median, pct, rows, table

from client import RingClient, StoreId
from statestore.core.calibration import HIGH, LOW, Calibration

BURST_AT = 3.0  # seconds into a client's turn the burst starts


class Before:
    """The rule before 2026-11-24: per shape, half the old factor plus half the new ratio,
    kept until the shape runs again (the restorer's former ``_calibrate``)."""

    def __init__(self) -> None:
        self._f: dict[str, float] = {}

    def learn(self, kind: str, ratio: float) -> None:
        ratio = min(HIGH, max(LOW, ratio))
        old = self._f.get(kind)
        self._f[kind] = ratio if old is None else 0.5 * old + 0.5 * ratio

    def factor(self, kind: str) -> float:
        return self._f.get(kind, 1.0)

    def factors(self) -> Mapping[str, float]:
        return dict(self._f)


def burst(seeds: list[str], seconds: float, tag: str) -> None:
    """Another writer commits large deltas for ``seconds``: every node busy for a moment."""
    rng = random.Random(tag)
    end = time.monotonic() + seconds
    with RingClient(seeds) as client:
        n = 0
        while time.monotonic() < end:
            client.commit(StoreId(tag, 0, n % 4), n // 4 + 1, rows(10_000, rng))
            n += 1


def turn(
    client: RingClient, seconds: float, seeds: list[str], burst_s: float, writes: StoreId
) -> tuple[list[float], Counter[str]]:
    """One client's turn: restore and commit in a loop, the nodes busy for a moment."""
    rng = random.Random(seconds)
    read = StoreId("fg", 0, 0)
    took: list[float] = []
    shapes: Counter[str] = Counter()
    start = time.monotonic()
    bursting = False
    v = 0
    while time.monotonic() - start < seconds:
        if not bursting and time.monotonic() - start >= BURST_AT:
            bursting = True
            threading.Thread(
                target=burst,
                args=(seeds, burst_s, f"b{writes.query}{writes.partition}"),
                daemon=True,
            ).start()
        t = time.perf_counter()
        got = client.restore(read)
        took.append(time.perf_counter() - t)
        shapes[got.plan] += 1
        sid = StoreId(writes.query, writes.operator, writes.partition + v // 50)
        client.commit(sid, v % 50 + 1, rows(200, rng, 20_000), [], {"v": v}, epoch=1)
        v += 1
        time.sleep(0.02)
    return took, shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=20.0, help="one client's turn")
    ap.add_argument("--burst", type=float, default=3.0, help="seconds of large commits")
    args = ap.parse_args()
    print(machine())
    rules = [("before", Before()), ("now", Calibration())]
    with local_ring(3, ["--snapshot-every", "100000"]) as ring:
        clients = [RingClient(ring.seeds) for _ in rules]
        try:
            rng = random.Random(5)
            for i in range(5):
                clients[0].commit(
                    StoreId("fg", 0, 0), i + 1, rows(2000 if i == 0 else 200, rng), snapshot=i == 0
                )
            for client, (_, rule) in zip(clients, rules, strict=True):
                client._async._restorer.calibration = rule  # type: ignore[assignment]
                client.restore(StoreId("fg", 0, 0))  # warm: connections and links
            out, ratios50, ratios99 = [], [], []
            for k in range(args.rounds):
                order = [0, 1] if k % 2 == 0 else [1, 0]
                got: dict[int, tuple[list[float], Counter[str]]] = {}
                for j in order:
                    got[j] = turn(
                        clients[j],
                        args.seconds,
                        ring.seeds,
                        args.burst,
                        StoreId(f"w{j}", 0, 1000 * k),
                    )
                row: list[object] = [k + 1]
                for j in range(len(rules)):
                    took, shapes = got[j]
                    row += [
                        f"{median(took) * 1e3:.1f}",
                        f"{pct(took, 99) * 1e3:.1f}",
                        " ".join(f"{s} {n}" for s, n in sorted(shapes.items())),
                    ]
                r50 = median(got[1][0]) / median(got[0][0])
                r99 = pct(got[1][0], 99) / pct(got[0][0], 99)
                ratios50.append(r50)
                ratios99.append(r99)
                out.append([*row, f"{r50:.2f}", f"{r99:.2f}"])
                print(
                    table(
                        [
                            "round",
                            *(f"{n} {c}" for n, _ in rules for c in ("p50 ms", "p99 ms", "shapes")),
                            "p50 now/before",
                            "p99 now/before",
                        ],
                        out[-1:],
                    ),
                    flush=True,
                )
        finally:
            for client in clients:
                client.close()
    heads = ["round"] + [
        f"{n} {c}" for n, _ in rules for c in ("restore p50 ms", "p99 ms", "shapes run")
    ]
    print(table([*heads, "p50 now / before", "p99 now / before"], out))
    for name, rs in (("p50", ratios50), ("p99", ratios99)):
        s = sorted(rs)
        print(
            f"restore {name} now / before: median {median(s):.2f} "
            f"(range {s[0]:.2f}-{s[-1]:.2f}) over {len(s)} rounds"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
