"""Recovery plans side by side: star, line, tree and auto on a local 5-node ring.

For every cell (state size x delta-chain length x restorer ingress x nodes down) it restores
the same store with each plan and prints the time and the bytes into the restorer, what auto
chose, and what SR3's fixed rule would have chosen; then restore_many of 16 stores against
restoring them one by one. Everything is measured in this one run; results are ratios.

    python bench/recovery.py                     # 16 and 256 MiB states
    python bench/recovery.py --sizes 16,256,1024 # the full matrix (long)
    python bench/recovery.py --out docs/recovery.json --plot docs/recovery.png
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from client import RingClient, StoreId
from statestore.local import LocalRing

PLANS = ("star", "line", "tree", "auto")
MiB = 1024 * 1024
ROW = 100  # bytes per row, roughly: a 16-byte key and a compressible value


def value(rng: random.Random, n: int) -> bytes:
    """A row value that compresses about like real row data (zstd-1 ratio ~2.5)."""
    words = (b"alpha", b"beta", b"gamma", b"delta", b"omega", b"sigma")
    return b"%010d|%s|" % (n, rng.randbytes(12).hex().encode()) + b"-".join(
        rng.choice(words) for _ in range(8)
    )


def write_store(client: RingClient, sid: StoreId, size: int, chain: int, seed: int) -> None:
    """A snapshot of ``size`` bytes of rows, then ``chain`` deltas each rewriting 5% of the
    keys (a micro-batch of a streaming aggregation touches a small share of its keys)."""
    rng = random.Random(seed)
    keys = max(1000, size // ROW)
    snap = {b"key-%011d" % i: value(rng, i) for i in range(keys)}
    client.commit(sid, 1, snap, [], {"offset": 1}, epoch=1, snapshot=True)
    del snap
    for v in range(2, chain + 2):
        puts = {b"key-%011d" % rng.randrange(keys): value(rng, v) for _ in range(keys // 20)}
        client.commit(sid, v, puts, [], {"offset": v}, epoch=1)


def run_cell(client: RingClient, sid: StoreId, repeat: int) -> dict[str, Any]:
    """Each plan ``repeat`` times, interleaved; the median time counts."""
    cell: dict[str, Any] = {}
    times: dict[str, list[float]] = {p: [] for p in PLANS}
    for _ in range(repeat):
        for plan in PLANS:
            st = client.restore(sid, plan=plan)
            times[plan].append(st.stats["seconds"])
            cell[plan] = st
    for plan in PLANS:
        st = cell[plan]
        cell[plan] = {
            "seconds": sorted(times[plan])[len(times[plan]) // 2],
            "bytes_in": st.stats["bytes_in"],
            "chose": st.plan,
            "predicted": st.stats["predicted_seconds"],
            "sr3": st.stats["sr3_rule"],
            "keys": len(st),
        }
    best = min(("star", "line", "tree"), key=lambda p: cell[p]["seconds"])
    cell["best"] = best
    cell["auto_vs_best"] = cell["auto"]["seconds"] / cell[best]["seconds"]
    cell["sr3_vs_best"] = cell[cell["star"]["sr3"]]["seconds"] / cell[best]["seconds"]
    cell["tree_bytes_vs_star"] = cell["tree"]["bytes_in"] / cell["star"]["bytes_in"]
    return cell


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,256", help="state sizes in MiB")
    ap.add_argument("--chains", default="0,10,50")
    ap.add_argument("--ingress", type=float, default=20.0, help="the capped ingress, MB/s")
    ap.add_argument("--repeat", type=int, default=3, help="runs per plan under 100 MiB")
    ap.add_argument("--many", type=int, default=16, help="stores for restore_many")
    ap.add_argument("--out", default=None, help="write the raw results as JSON")
    ap.add_argument("--plot", default=None, help="write a PNG plot (needs matplotlib)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    chains = [int(c) for c in args.chains.split(",")]
    results: list[dict[str, Any]] = []
    base = tempfile.mkdtemp(prefix="statestore-bench-recovery-")
    ring = LocalRing(base, 5, args=["--snapshot-every", "100000", "--down-after", "2"]).start()
    print(f"# 5-node ring in {base}; capped ingress {args.ingress} MB/s", flush=True)
    header = (
        f"{'size':>6} {'chain':>5} {'ingress':>8} {'down':>4} | "
        + " ".join(f"{p + ' s':>8}" for p in PLANS)
        + f" | {'auto->':>6} {'best':>5} {'auto/best':>9} {'sr3':>5} {'sr3/best':>8}"
        + f" {'tree/star B':>11}"
    )
    print(header, flush=True)
    try:
        for size in sizes:
            for chain in chains:
                sid = StoreId("bench", size, chain)
                with RingClient(ring.seeds, timeout=60) as w:
                    write_store(w, sid, size * MiB, chain, seed=size + chain)
                for down in (0, 1, 2):
                    if down:
                        ring.kill(down)  # nodes 1 and 2 (node 0 stays the seed)
                        ring.wait_ring(5 - down)
                    for ingress in (None, args.ingress * 1e6):
                        seeds = [p.address for p in ring.procs if p.alive]
                        with RingClient(seeds, ingress=ingress, timeout=60) as c:
                            cell = run_cell(c, sid, args.repeat if size < 100 else 1)
                        cell.update(size_mib=size, chain=chain, down=down, ingress=ingress)
                        results.append(cell)
                        cap = f"{args.ingress:.0f}MB/s" if ingress else "free"
                        print(
                            f"{size:>5}M {chain:>5} {cap:>8} {down:>4} | "
                            + " ".join(f"{cell[p]['seconds']:>8.3f}" for p in PLANS)
                            + f" | {cell['auto']['chose']:>6} {cell['best']:>5}"
                            f" {cell['auto_vs_best']:>9.2f} {cell['star']['sr3']:>5}"
                            f" {cell['sr3_vs_best']:>8.2f} {cell['tree_bytes_vs_star']:>11.2f}",
                            flush=True,
                        )
                for i in (1, 2):
                    ring.restart(i)
                ring.wait_ring(5)
        # many restores at once: 16 stores of 4 MiB, together versus one by one
        stores = [StoreId("many", 0, p) for p in range(args.many)]
        with RingClient(ring.seeds, timeout=60) as c:
            for i, sid in enumerate(stores):
                write_store(c, sid, 4 * MiB, 3, seed=100 + i)
            t0 = time.perf_counter()
            for sid in stores:
                c.restore(sid, plan="auto")
            one_by_one = time.perf_counter() - t0
            t0 = time.perf_counter()
            c.restore_many(stores, plan="auto")
            together = time.perf_counter() - t0
        print(
            f"restore_many of {args.many} stores: {together:.3f}s together vs "
            f"{one_by_one:.3f}s one by one: ratio {together / one_by_one:.2f}",
            flush=True,
        )
        summary = {
            "cells": len(results),
            "auto_within_10pct": sum(1 for r in results if r["auto_vs_best"] <= 1.10),
            "auto_beats_or_ties_sr3": sum(
                1 for r in results if r["auto"]["seconds"] <= r[r["star"]["sr3"]]["seconds"] * 1.05
            ),
            "worst_auto_vs_best": max(r["auto_vs_best"] for r in results),
            "tree_bytes_vs_star_chain50": [
                round(r["tree_bytes_vs_star"], 3) for r in results if r["chain"] == 50
            ],
            "restore_many_ratio": together / one_by_one,
        }
        print(json.dumps(summary, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps({"summary": summary, "cells": results}, indent=1))
        if args.plot:
            plot(results, args.plot)
    finally:
        ring.stop()
    return 0


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    labels = []
    width = 0.2
    for i, r in enumerate(results):
        cap = "cap" if r["ingress"] else "free"
        labels.append(f"{r['size_mib']}M c{r['chain']} {cap} d{r['down']}")
        for j, p in enumerate(PLANS):
            ax.bar(
                i + (j - 1.5) * width,
                r[p]["seconds"],
                width,
                label=p if i == 0 else None,
                color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][j],
            )
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels(labels, rotation=70, fontsize=7)
    ax.set_ylabel("restore time (s)")
    ax.set_yscale("log")
    ax.set_title("statestore recovery plans on a local 5-node ring (2 cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
