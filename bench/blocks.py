"""What the blocked chunk layout (0.3.0: 16 KiB blocks with an index) costs and saves, against
whole chunks (``block_size=0``, the layout before), on one 3-node ring (R=3), side by side.

For each size, two stores get the same rows: a snapshot of ``--mib`` MiB of ~100-byte rows,
then ``--deltas`` deltas of 1% of its keys; one written blocked, one whole. Measured, with the
two layouts alternated over ``--rounds`` rounds (fresh store names each round), medians and
the ratio's spread:

- compressed bytes of the chunks (what each replica stores and a restore moves), blocked /
  whole;
- commit seconds of the snapshot (client encode + write at W), blocked / whole;
- restore seconds of the latest version (fetch + decode + fold), blocked / whole;
- a cold point read (``open(cache_bytes=0, lookups=False).get``: the client fetches the
  parts itself) of a key of the snapshot: bytes fetched and seconds, blocked / whole.

    .venv/bin/python bench/blocks.py [--mib 16 64] [--rounds 3] [--deltas 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from _common import MiB, local_ring, machine, median, rows, table

from client import AsyncRingClient, StoreId

LAYOUTS = {"blocked": 16 * 1024, "whole": 0}


async def one_round(
    seeds: list[str],
    tag: str,
    snapshot: dict[bytes, bytes],
    deltas: list[dict[bytes, bytes]],
    blocked_first: bool,
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    order = list(LAYOUTS) if blocked_first else list(reversed(LAYOUTS))
    probe = random.Random(tag).sample(sorted(snapshot), 20)
    for name in order:
        sid = StoreId("bench", 0, 0, f"{name}-{tag}")
        async with AsyncRingClient(seeds, block_size=LAYOUTS[name]) as ring:
            t0 = time.perf_counter()
            await ring.commit(sid, 1, snapshot, [], {"v": 1}, epoch=1, snapshot=True)
            commit = time.perf_counter() - t0
            for i, d in enumerate(deltas):
                await ring.commit(sid, i + 2, d, [], {"v": i + 2}, epoch=1)
            t0 = time.perf_counter()
            state = await ring.restore(sid)
            restore = time.perf_counter() - t0
            assert len(state) == len(snapshot)
            lazy = await ring.open(sid, cache_bytes=0, lookups=False)
            size = sum(c.size for m in lazy.chain for c in m.chunks)
            t0 = time.perf_counter()
            for k in probe:
                assert await lazy.get(k) is not None
            point = (time.perf_counter() - t0) / len(probe)
            out[name] = {
                "bytes": size,
                "commit": commit,
                "restore": restore,
                "point_s": point,
                "point_bytes": lazy.bytes_fetched / len(probe),
            }
    return out


def spread(values: list[float]) -> str:
    return f"{median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


async def bench(a: argparse.Namespace, seeds: list[str]) -> None:
    body = []
    for mib in a.mib:
        rng = random.Random(mib)
        n = mib * MiB // 100
        snapshot = rows(n, rng)
        keys = sorted(snapshot)
        deltas = [
            {k: rng.randbytes(42).hex().encode() for k in rng.sample(keys, n // 100)}
            for _ in range(a.deltas)
        ]
        results = [
            await one_round(seeds, f"{mib}-{r}", snapshot, deltas, r % 2 == 0)
            for r in range(a.rounds)
        ]
        for r, res in enumerate(results):
            b, w = res["blocked"], res["whole"]
            print(
                f"{mib} MiB round {r + 1}: bytes {b['bytes'] / w['bytes']:.3f}x, commit "
                f"{b['commit']:.2f}/{w['commit']:.2f}s, restore {b['restore']:.2f}/"
                f"{w['restore']:.2f}s, point {b['point_s'] * 1000:.1f}/{w['point_s'] * 1000:.1f}"
                f" ms, {b['point_bytes'] / 1024:.0f}/{w['point_bytes'] / 1024:.0f} KiB",
                flush=True,
            )

        def ratios(field: str, res: list[dict[str, dict[str, float]]] = results) -> list[float]:
            return [x["blocked"][field] / x["whole"][field] for x in res]

        body.append(
            [
                f"{mib} MiB, {a.deltas} deltas of 1%",
                spread(ratios("bytes")),
                spread(ratios("commit")),
                spread(ratios("restore")),
                spread(ratios("point_s")),
                f"{statistics.median(ratios('point_bytes')):.4f}x",
            ]
        )
    print()
    print(machine())
    print(
        table(
            [
                "store",
                "chunk bytes",
                "snapshot commit",
                "restore latest",
                "cold point read time",
                "cold point read bytes",
            ],
            body,
        )
    )
    print("(blocked / whole: median of the rounds, with the range)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deltas", type=int, default=5)
    a = ap.parse_args()
    with local_ring(3) as ring:
        asyncio.run(bench(a, ring.seeds))


if __name__ == "__main__":
    main()
