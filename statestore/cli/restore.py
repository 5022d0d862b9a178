"""``statestore restore``: one store version pulled from the ring along a recovery plan, with
a progress bar and a summary of how it went (the client's ``restore``, docs/client.md)."""

from __future__ import annotations

import argparse

from statestore.cli.command import Subparsers, add_client_tls, add_seeds, positive, positive_float
from statestore.core.plan import PLANS

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    rs = sub.add_parser("restore", help="restore a store version along a recovery plan")
    add_seeds(rs)
    rs.add_argument("--store", required=True, metavar="QUERY/OPERATOR/PARTITION/NAME")
    rs.add_argument("--version", type=positive, default=None, help="default: the latest")
    rs.add_argument("--plan", choices=PLANS, default="auto")
    rs.add_argument("--explain", action="store_true", help="print the plan and stop")
    rs.add_argument("--out", default=None, help="write the state here as framed rows")
    rs.add_argument(
        "--ingress",
        type=float,
        default=None,
        metavar="MB/S",
        help="cap the bytes per second taken in (token bucket)",
    )
    rs.add_argument(
        "--consistency",
        choices=("one", "quorum", "all"),
        default="quorum",
        help="replicas the head and chain reads must hear from: one, quorum (R-W+1, the "
        "default: sees every acknowledged commit) or all (R)",
    )
    rs.add_argument(
        "--delay-bound",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="fail (DelayBoundExceeded) if the restore has not finished by then",
    )
    rs.add_argument("--fan-in", type=positive, default=16, help="chunks in flight (star)")
    rs.add_argument("--tree-fan-in", type=positive, default=2, help="children per tree hop")
    add_client_tls(rs)
    rs.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from client import RingClient
    from statestore.core.ids import StoreId
    from statestore.wire.rows import encode_rows

    console = Console(stderr=True)
    store = StoreId.parse(args.store)
    ingress = args.ingress * 1e6 if args.ingress else None
    with RingClient(
        args.seeds,
        concurrency=args.fan_in,
        tree_fan_in=args.tree_fan_in,
        ingress=ingress,
        tls_ca=args.tls_ca,
    ) as ring:
        kind, total, why = args.plan, None, ""
        if args.explain or args.consistency == "quorum":  # the plan's head read is a quorum's
            plan = ring.explain(store, args.version, args.plan)
            if args.explain:
                print(plan.explain())
                return 0
            # the restore is then asked for the shape auto chose (the bar's total is that
            # plan's): its own reason would be "asked for star", so auto's is kept
            kind, total, why = plan.kind, plan.bytes_in, plan.reason
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(f"restoring {store} ({kind})", total=total)
            st = ring.restore(
                store,
                args.version,
                plan=kind,
                progress=lambda n: progress.advance(task, n),
                consistency=args.consistency,
                delay_bound=args.delay_bound,
            )
    s = st.stats
    table = Table(title=f"restored {store} v{st.version}: {len(st)} keys")
    table.add_column("what")
    table.add_column("value")
    table.add_row("plan", f"{st.plan}: {why if why and st.plan == kind else s['reason']}")
    table.add_row(
        "consistency",
        f"{args.consistency}"
        + (
            " (tentative: what the nodes that answered within the bound hold)"
            if st.tentative
            else " (stable state)"
        ),
    )
    table.add_row("SR3 fixed rule", str(s["sr3_rule"]))
    table.add_row("time", f"{s['seconds']:.3f}s (predicted {s['predicted_seconds']:.3f}s)")
    table.add_row("chunks / chain", f"{s['chunks']} chunks over {s['chain']} versions")
    table.add_row("bytes into restorer", str(s["bytes_in"]))
    table.add_row("rerouted chunks", str(s["rerouted"]))
    for hop in sorted(s["hops"], key=lambda h: (h["depth"], h["hop"])):
        table.add_row(
            f"hop {hop['hop']} (depth {hop['depth']})",
            f"own {hop['own']} B, in {hop['in']} B, out {hop['out']} B",
        )
    for fail in s["failed_hops"]:
        table.add_row(f"failed {fail['hop']}", str(fail["error"]))
    for node, n in sorted(s["bytes_by_node"].items()):
        table.add_row(f"pulled from {node}", f"{n} B")
    console.print(table)
    if args.out:
        with open(args.out, "wb") as f:
            for piece in encode_rows(sorted(st.items())):
                f.write(piece)
        console.print(f"wrote {len(st)} rows to {args.out} (framed rows, docs/api.md)")
    return 0
