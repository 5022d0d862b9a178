"""What the per-range cache saves ``Ring.replicas`` (core/placement.py): a node's listing or
repair scan asks for the owners of every key it holds, on one ring.

Per round, the same ``--keys`` keys on one ring are placed twice, the order alternating
round by round: by the walk (every key walks the ring from its token until it has met every
member, then picks ``r``: ``Ring.replicas`` before) and by ``Ring.replicas`` as shipped (the
range's owners, computed once per ring and cached). Each timed pass starts from a fresh ring
(a cold cache, as the first scan after a membership change has). Reported: each pass's
milliseconds and their ratio (cached / walk), median over the rounds with the spread
(25th-75th percentile).

    PYTHONPATH=. .venv/bin/python bench/placement.py --keys 20000 --rounds 9
"""

from __future__ import annotations

import argparse
import random
import time

from _common import machine, median, paired_ratio, table

from statestore.core.placement import DEFAULT_VNODES, Member, Ring


def _ring(nodes: int, vnodes: int) -> Ring:
    return Ring({Member(f"node-{i}") for i in range(nodes)}, vnodes)


def walk(ring: Ring, keys: list[str], r: int) -> float:
    t = time.perf_counter()
    for k in keys:
        ring._choose(ring.preference(k), r)  # the walk, as replicas() ran before the cache
    return time.perf_counter() - t


def cached(ring: Ring, keys: list[str], r: int) -> float:
    t = time.perf_counter()
    for k in keys:
        ring.replicas(k, r)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--vnodes", type=int, default=DEFAULT_VNODES)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    print(machine())
    rng = random.Random(7)
    keys = [f"load/0/{rng.randrange(16)}/{v}/{rng.getrandbits(64):016x}" for v in range(args.keys)]
    check = _ring(args.nodes, args.vnodes)
    for k in keys[:1000]:  # the same answer both ways
        assert check.replicas(k, args.replicas) == check._choose(check.preference(k), args.replicas)
    before: list[float] = []
    after: list[float] = []
    for i in range(args.rounds):
        passes = [(walk, before), (cached, after)]
        for fn, out in passes if i % 2 == 0 else passes[::-1]:
            out.append(fn(_ring(args.nodes, args.vnodes), keys, args.replicas))
    ratio, lo, hi = paired_ratio(after, before)
    print(
        table(
            ["keys", "nodes x vnodes", "walk ms (median)", "cached ms (median)", "cached / walk"],
            [
                [
                    args.keys,
                    f"{args.nodes} x {args.vnodes}",
                    f"{median(before) * 1e3:.1f}",
                    f"{median(after) * 1e3:.1f}",
                    f"{ratio:.2f}x ({lo:.2f}-{hi:.2f})",
                ]
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
