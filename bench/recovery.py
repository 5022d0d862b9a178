"""Recovery plans side by side: star, line, tree and auto on a local 5-node ring.

For every cell (state size x delta-chain length x restorer ingress x nodes down) it restores
the same store with each plan and prints the time and the bytes into the restorer, what auto
chose, and what SR3's fixed rule would have chosen; then restore_many of 16 stores against
restoring them one by one. Everything is measured in this one run; results are ratios.

    python bench/recovery.py                     # 16 and 256 MiB states, caps 20 and 5 MB/s
    python bench/recovery.py --sizes 16,256,1024 # the full matrix (long)
    python bench/recovery.py --part many         # only restore_many against one by one
    python bench/recovery.py --out docs/recovery.json --plot docs/recovery.png

``--out`` merges into an existing file, so the two parts can be run one after the other.
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
from statestore.cli.local import LocalRing

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
    ap.add_argument(
        "--ingress", default="20,5", help="restorer ingress caps to try besides none, MB/s"
    )
    ap.add_argument("--part", choices=("all", "matrix", "many"), default="all")
    ap.add_argument("--repeat", type=int, default=3, help="runs per plan under 100 MiB")
    ap.add_argument("--many", type=int, default=16, help="stores for restore_many")
    ap.add_argument("--out", default=None, help="write the raw results as JSON")
    ap.add_argument("--plot", default=None, help="write a PNG plot (needs matplotlib)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    chains = [int(c) for c in args.chains.split(",")]
    caps = [float(c) * 1e6 for c in args.ingress.split(",") if c]
    if args.part == "many":
        sizes = []
    results: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    base = tempfile.mkdtemp(prefix="statestore-bench-recovery-")
    ring = LocalRing(base, 5, args=["--snapshot-every", "100000", "--down-after", "2"]).start()
    print(f"# 5-node ring in {base}; ingress caps {args.ingress} MB/s", flush=True)
    header = (
        f"{'size':>6} {'chain':>5} {'ingress':>8} {'down':>4} | "
        + " ".join(f"{p + ' s':>8}" for p in PLANS)
        + f" | {'auto->':>6} {'best':>5} {'auto/best':>9} {'sr3':>5} {'sr3/best':>8}"
        + f" {'tree/star B':>11}"
    )
    if sizes:
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
                    for ingress in (None, *caps):
                        seeds = [p.address for p in ring.procs if p.alive]
                        with RingClient(seeds, ingress=ingress, timeout=60) as c:
                            cell = run_cell(c, sid, args.repeat if size < 100 else 1)
                        cell.update(size_mib=size, chain=chain, down=down, ingress=ingress)
                        results.append(cell)
                        cap = f"{ingress / 1e6:.0f}MB/s" if ingress else "free"
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
        if results:
            summary.update(
                cells=len(results),
                auto_within_10pct=sum(1 for r in results if r["auto_vs_best"] <= 1.10),
                # the plan auto chose, timed in its own run of that plan (auto's run aside)
                auto_choice_within_10pct=sum(
                    1
                    for r in results
                    if r[r["auto"]["chose"]]["seconds"] <= 1.10 * r[r["best"]]["seconds"]
                ),
                auto_beats_or_ties_sr3=sum(
                    1
                    for r in results
                    if r["auto"]["seconds"] <= r[r["star"]["sr3"]]["seconds"] * 1.05
                ),
                auto_beats_sr3_by_10pct=sum(
                    1
                    for r in results
                    if r["auto"]["seconds"] * 1.10 <= r[r["star"]["sr3"]]["seconds"]
                ),
                worst_auto_vs_best=max(r["auto_vs_best"] for r in results),
                tree_bytes_vs_star_chain50=[
                    round(r["tree_bytes_vs_star"], 3) for r in results if r["chain"] == 50
                ],
            )
        if args.part in ("all", "many") and args.many:
            summary["restore_many"] = [many(ring, args.many, size) for size in MANY_SIZES]
        print(json.dumps(summary, indent=2))
        if args.out:
            out = Path(args.out)
            old = json.loads(out.read_text()) if out.exists() else {}
            old.setdefault("summary", {}).update(summary)
            if results:
                old["cells"] = results
            out.write_text(json.dumps(old, indent=1))
            results = old.get("cells", [])
        if args.plot and results:
            plot(results, args.plot)
    finally:
        ring.stop()
    return 0


MANY_SIZES = (256 * 1024, 4 * MiB)  # per store: small (latency-bound) and larger (decode-bound)


def many(ring: LocalRing, count: int, size: int) -> dict[str, Any]:
    """restore_many of ``count`` stores of ``size`` bytes (3 deltas each) against restoring
    them one by one, on one warmed client; the median of 3 interleaved rounds."""
    stores = [StoreId("many", size // 1024, p) for p in range(count)]
    with RingClient(ring.seeds, timeout=60) as c:
        for i, sid in enumerate(stores):
            write_store(c, sid, size, 3, seed=100 + i)
        c.restore_many(stores, plan="auto")  # warm: connections, links, calibration
        ones, togethers = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            for sid in stores:
                c.restore(sid, plan="auto")
            ones.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = c.restore_many(stores, plan="auto")
            togethers.append(time.perf_counter() - t0)
        # outside the timing: restore_many gave each store exactly what restore gives
        assert [dict(g) for g in got] == [dict(c.restore(s)) for s in stores]
    one_by_one, together = sorted(ones)[1], sorted(togethers)[1]
    print(
        f"restore_many of {count} stores of {size // 1024} KiB: {together:.3f}s together vs "
        f"{one_by_one:.3f}s one by one: ratio {together / one_by_one:.2f}",
        flush=True,
    )
    return {
        "stores": count,
        "store_kib": size // 1024,
        "together_s": round(together, 4),
        "one_by_one_s": round(one_by_one, 4),
        "ratio": round(together / one_by_one, 3),
    }


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(16, 5))
    labels = []
    width = 0.2
    for i, r in enumerate(results):
        cap = f"{r['ingress'] / 1e6:.0f}MB/s" if r["ingress"] else "free"
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
