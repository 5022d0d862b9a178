"""The ``statestore`` command: ``node``, ``local``, ``ring``, ``restore``, ``demo``, the
admin commands ``stores ls``, ``inspect`` and ``drop`` (cli/admin.py), ``decommission``
(cli/elastic.py), ``removenode`` (cli/removenode.py), and ``backup`` and
``restore-backup`` (cli/backup.py).

Bad arguments end with a one-line message naming the problem and exit code 2, never a trace.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence

from statestore.core.address import parse_seeds
from statestore.core.errors import InvalidAddress, StateStoreError
from statestore.core.formats import DISK_FORMAT, DISK_FORMATS_READ, VERSION, WIRE_FORMAT
from statestore.core.plan import PLANS
from statestore.node.settings import HELP_EPILOG, add_node_arguments
from statestore.node.settings import resolve as resolve_settings

__all__ = ["build_parser", "main"]


def _seeds(text: str) -> list[str]:
    try:
        return parse_seeds(text)
    except InvalidAddress as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _client_tls(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="F",
        help="PEM CA of a ring that serves TLS (default: $STATESTORE_TLS_CA; none = plain HTTP)",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def version_text() -> str:
    """``statestore --version``: the package version and the formats (core/formats.py)."""
    return (
        f"statestore {VERSION} (wire format {WIRE_FORMAT}, disk format {DISK_FORMAT}; reads "
        f"disk formats {', '.join(map(str, sorted(DISK_FORMATS_READ)))})"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="statestore", description="DHT-backed state store")
    p.add_argument(
        "--version",
        action="version",
        version=version_text(),
        help="print the version and the wire and disk formats it speaks and keeps, and exit",
    )
    sub = p.add_subparsers(dest="command", required=True)

    n = sub.add_parser(
        "node",
        help="run one ring node daemon",
        description="Run one ring node daemon. Its settings (statestore/node/settings.py) come "
        "from flags, STATESTORE_ variables and a TOML file: flag > environment > file > "
        "default.",
        epilog=HELP_EPILOG,
    )
    add_node_arguments(n)

    loc = sub.add_parser("local", help="run N nodes on loopback until Ctrl-C")
    loc.add_argument("--nodes", type=_positive, default=3)
    loc.add_argument("--base-port", type=int, default=7400)
    loc.add_argument("--data-dir", default="data/local")

    r = sub.add_parser("ring", help="show the ring's members and epoch")
    r.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    r.add_argument("--json", action="store_true")
    _client_tls(r)

    dc = sub.add_parser(
        "decommission",
        help="hand a node's copies to their next owners, then take it out of the ring",
    )
    dc.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    dc.add_argument("--node", required=True, metavar="ID", help="node id (or its address)")
    dc.add_argument(
        "--timeout",
        type=_positive_float,
        default=3600.0,
        help="seconds to wait (the node keeps going after)",
    )
    _client_tls(dc)

    rn = sub.add_parser(
        "removenode",
        help="remove a dead (down) node for good: re-make its share from the surviving "
        "copies, then drop it from the ring",
    )
    rn.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    rn.add_argument("--node", required=True, metavar="ID", help="the dead node's id (or address)")
    rn.add_argument(
        "--timeout",
        type=_positive_float,
        default=3600.0,
        help="seconds to wait (the removal keeps going after)",
    )
    _client_tls(rn)

    rb = sub.add_parser(
        "rebalance",
        help="move virtual-node tokens from the most to the least loaded nodes (BPM)",
    )
    rb.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    rb.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
    rb.add_argument(
        "--metric",
        choices=("bytes", "requests", "served"),
        default="bytes",
        help="the load to even out: bytes held (default), requests or bytes served per second",
    )
    rb.add_argument(
        "--bound",
        type=_positive_float,
        default=1.15,
        help="max/mean load to reach (default 1.15)",
    )
    rb.add_argument(
        "--timeout",
        type=_positive_float,
        default=3600.0,
        help="seconds to wait for each node's move (it keeps going after)",
    )
    rb.add_argument("--json", action="store_true", help="print the plan as JSON")
    _client_tls(rb)

    rs = sub.add_parser("restore", help="restore a store version along a recovery plan")
    rs.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    rs.add_argument("--store", required=True, metavar="QUERY/OPERATOR/PARTITION/NAME")
    rs.add_argument("--version", type=_positive, default=None, help="default: the latest")
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
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="fail (DelayBoundExceeded) if the restore has not finished by then",
    )
    rs.add_argument("--fan-in", type=_positive, default=16, help="chunks in flight (star)")
    rs.add_argument("--tree-fan-in", type=_positive, default=2, help="children per tree hop")
    _client_tls(rs)

    oc = sub.add_parser(
        "outcomes",
        help="what became of a store's tentative commits: confirmed, or rolled back with "
        "the version and source positions to replay from",
    )
    oc.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    oc.add_argument("--store", required=True, metavar="QUERY/OPERATOR/PARTITION/NAME")
    oc.add_argument("--json", action="store_true")
    _client_tls(oc)

    st = sub.add_parser("stores", help="stores on the ring (admin)")
    st_sub = st.add_subparsers(dest="stores_command", required=True)
    ls = st_sub.add_parser("ls", help="every store with its head and versions count")
    ls.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    ls.add_argument("--query", default=None, help="only this query's stores")
    ls.add_argument("--json", action="store_true")
    _client_tls(ls)

    ins = sub.add_parser(
        "inspect", help="one store: versions, chain, sizes, replicas and their copies"
    )
    ins.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    ins.add_argument("--store", required=True, metavar="QUERY/OPERATOR/PARTITION/NAME")
    ins.add_argument("--json", action="store_true")
    _client_tls(ins)

    dr = sub.add_parser("drop", help="remove every store of a finished query everywhere")
    dr.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    dr.add_argument("--query", required=True)
    dr.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _client_tls(dr)

    bk = sub.add_parser(
        "backup",
        help="write a checksummed backup of every store of a query to a new directory",
    )
    bk.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    bk.add_argument("--query", required=True)
    bk.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) directory")
    bk.add_argument(
        "--version-at",
        type=_positive,
        default=None,
        metavar="V",
        help="one point in time: for each store its latest version <= V (a store version "
        "number, as commits count them; Spark: batch id + 1); default every retained version",
    )
    _client_tls(bk)

    rbk = sub.add_parser(
        "restore-backup",
        help="verify a backup, then load it into a ring (nothing loaded if it is not whole)",
    )
    rbk.add_argument("--seeds", type=_seeds, required=True, metavar="HOST:PORT,...")
    rbk.add_argument("--from", dest="source", required=True, metavar="DIR")
    rbk.add_argument("--as", dest="as_query", default=None, metavar="Q2", help="another query name")
    rbk.add_argument(
        "--force",
        action="store_true",
        help="load even when the target query holds stores (not dropped on failure then)",
    )
    _client_tls(rbk)

    sj = sub.add_parser(
        "spark-jar", help="print the Spark provider jar's path (built on first use)"
    )
    sj.add_argument("--rebuild", action="store_true")

    sr = sub.add_parser(
        "spark-repartition",
        help="change a stopped ring-backed Spark query's number of state partitions",
    )
    sr.add_argument(
        "--seeds",
        type=_seeds,
        default=os.environ.get("STATESTORE_SEEDS") or "127.0.0.1:7400",
        metavar="HOST:PORT,...",
        help="the ring the query's state is on (default: $STATESTORE_SEEDS, else "
        "127.0.0.1:7400, where statestore local starts)",
    )
    sr.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    sr.add_argument("--partitions", type=_positive, required=True, help="the new partition count")
    sr.add_argument(
        "--skip-failed-batch",
        action="store_true",
        help="go on when the last batch did not commit (its input is read again)",
    )
    sr.add_argument("--threads", type=_positive, default=4, help="partitions moved at once (1-64)")
    sr.add_argument("--token-file", default=None, help="the ring's client token, in a file")
    sr.add_argument(
        "--driver-memory",
        default="2g",
        help="the local Spark driver's heap (it holds one store's rows at a time; default 2g)",
    )
    _client_tls(sr)

    d = sub.add_parser(
        "demo", help="local 3-node ring: commit, kill -9 a node, restore; then the Spark demo"
    )
    d.add_argument("--no-spark", action="store_true", help="skip the Spark streaming part")
    d.add_argument("--data-dir", default=None)
    d.add_argument("--base-port", type=int, default=0)
    return p


def _node(args: argparse.Namespace) -> int:
    try:  # flag > STATESTORE_ variable > --config file > default (node/settings.py)
        settings = resolve_settings(args, os.environ)
    except ValueError as exc:  # names the setting and where it came from
        print(f"statestore node: {exc}", file=sys.stderr)
        return 2
    from statestore.node.server import run_node

    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_node(settings.config)


def _local(args: argparse.Namespace) -> int:
    from statestore.cli.local import LocalRing

    ring = LocalRing(os.path.abspath(args.data_dir), args.nodes, args.base_port)
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    try:
        ring.start()
        print(f"local ring of {args.nodes} nodes up; seeds: {','.join(ring.seeds)}", flush=True)
        print("Ctrl-C stops them.", flush=True)
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        ring.stop()
        print("local ring stopped", flush=True)
    return 0


BUILD_FIELDS = ("version", "wire_format", "disk_format")


def member_builds(
    view: dict[str, object], timeout: float = 2.0, tls_ca: str | None = None
) -> dict[str, dict[str, object]]:
    """Each member's version and formats, asked of the member itself (``GET /v1/health``,
    open, in parallel; the ring's gossip does not carry them). A member that does not answer
    is left out; one that answers without them (a build from before they were reported)
    has them as None."""
    from concurrent.futures import ThreadPoolExecutor

    from statestore.cli.local import http_json

    members = view.get("members")
    if not isinstance(members, list):
        return {}
    asked = [m for m in members if isinstance(m, dict) and m.get("status") != "down"]

    def ask(m: dict[str, object]) -> dict[str, object] | None:
        try:
            health = http_json(str(m["address"]), "/v1/health", timeout=timeout, tls_ca=tls_ca)
        except (OSError, ValueError):
            return None
        if not isinstance(health, dict):
            return None
        return {k: health.get(k) for k in BUILD_FIELDS}

    if not asked:
        return {}
    with ThreadPoolExecutor(min(16, len(asked))) as pool:
        answers = list(pool.map(ask, asked))
    return {str(m["id"]): a for m, a in zip(asked, answers, strict=True) if a is not None}


def _ring(args: argparse.Namespace) -> int:
    from statestore.cli.local import http_json

    errors = []
    for seed in args.seeds:
        try:
            view = http_json(seed, "/v1/ring", timeout=3.0, tls_ca=args.tls_ca)
            break
        except OSError as exc:
            errors.append(f"{seed}: {exc}")
    else:
        print("statestore ring: no seed answered (" + "; ".join(errors) + ")", file=sys.stderr)
        return 1
    assert isinstance(view, dict)
    from statestore.cli.elastic import describe_move, member_moves

    moves = member_moves(view, tls_ca=args.tls_ca)
    builds = member_builds(view, tls_ca=args.tls_ca)
    for m in view["members"]:
        if m["id"] in moves:
            m["move"] = moves[m["id"]]
        m.update(builds.get(m["id"], dict.fromkeys(BUILD_FIELDS)))
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"ring epoch {view['epoch']}  R={view['replicas']} W={view['write_quorum']}"
    )
    # the tokens column only once a rebalance gave a member its own count (it widens the table)
    counts = any(m.get("vnodes") or m.get("next_vnodes") for m in view["members"])
    for col in ("id", "address", "status", "state", "zone", "version", "tokens", "share", "move"):
        if col != "tokens" or counts:
            table.add_column(col, no_wrap=col == "id")
    wires = {m["wire_format"] for m in view["members"] if m["wire_format"] is not None}
    for m in view["members"]:
        share = f"{100 * m.get('share', 0):.1f}%"
        move = describe_move(m["move"]) if m.get("move") else "-"
        tokens = str(m.get("vnodes") or view["vnodes"])
        if m.get("next_vnodes"):
            tokens += f" -> {m['next_vnodes']}"
        cells = [m["id"], m["address"], m["status"], m.get("state", "normal"), m.get("zone") or "-"]
        version = m["version"] or "?"
        if len(wires) > 1 and m["wire_format"] is not None:  # a mixed ring: say who speaks what
            version += f" (wire {m['wire_format']})"
        table.add_row(*cells, version, *([tokens] if counts else []), share, move)
    Console().print(table)
    for ident, r in sorted((view.get("removals") or {}).items()):  # statestore removenode
        print(f"{r['mark']}: {ident} (was {r['address']}; by {r['by']})")
    return 0


def _restore(args: argparse.Namespace) -> int:
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
        kind, total = args.plan, None
        if args.explain or args.consistency == "quorum":  # the plan's head read is a quorum's
            plan = ring.explain(store, args.version, args.plan)
            if args.explain:
                print(plan.explain())
                return 0
            kind, total = plan.kind, plan.bytes_in
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
    table.add_row("plan", f"{st.plan}: {s['reason']}")
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


def _outcomes(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from client import RingClient, StoreId

    store = StoreId.parse(args.store)
    with RingClient(args.seeds, tls_ca=args.tls_ca) as ring:
        outcomes = ring.outcomes(store)
    if args.json:
        print(json.dumps([o.__dict__ for o in outcomes], indent=2))
        return 0
    table = Table(title=f"tentative commits of {store}: {len(outcomes)} decided")
    for col in ("version", "epoch", "outcome", "replay from", "positions"):
        table.add_column(col)
    for o in outcomes:
        back = o.outcome == "rolled_back"
        table.add_row(
            str(o.version),
            str(o.epoch),
            o.outcome,
            f"v{o.replay_from}" if back else "",
            json.dumps(o.positions) if back else "",
        )
    Console().print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "node":
            return _node(args)
        if args.command == "local":
            return _local(args)
        if args.command == "ring":
            return _ring(args)
        if args.command == "restore":
            return _restore(args)
        if args.command == "outcomes":
            return _outcomes(args)
        if args.command == "decommission":
            from statestore.cli.elastic import decommission

            return decommission(args.seeds, args.node, args.timeout, tls_ca=args.tls_ca)
        if args.command == "removenode":
            from statestore.cli.removenode import removenode

            return removenode(args.seeds, args.node, args.timeout, tls_ca=args.tls_ca)
        if args.command == "rebalance":
            from statestore.cli.rebalance import rebalance

            return rebalance(
                args.seeds,
                dry_run=args.dry_run,
                metric=args.metric,
                bound=args.bound,
                timeout=args.timeout,
                as_json=args.json,
                tls_ca=args.tls_ca,
            )
        if args.command in ("stores", "inspect", "drop"):
            from statestore.cli import admin

            if args.command == "stores":
                return admin.list_stores(args.seeds, args.query, args.json, tls_ca=args.tls_ca)
            if args.command == "inspect":
                return admin.inspect(args.seeds, args.store, args.json, tls_ca=args.tls_ca)
            return admin.drop_query(args.seeds, args.query, args.yes, tls_ca=args.tls_ca)
        if args.command in ("backup", "restore-backup"):
            from statestore.cli import backup

            if args.command == "backup":
                return backup.backup(
                    args.seeds, args.query, args.out, version_at=args.version_at, tls_ca=args.tls_ca
                )
            return backup.restore_backup(
                args.seeds,
                args.source,
                as_query=args.as_query,
                force=args.force,
                tls_ca=args.tls_ca,
            )
        if args.command == "spark-jar":
            from spark_connector import main as spark_jar

            return spark_jar(["--rebuild"] if args.rebuild else [])
        if args.command == "spark-repartition":
            from statestore.cli.spark_repartition import run as spark_repartition

            return spark_repartition(
                args.seeds,
                args.checkpoint,
                args.partitions,
                skip_failed_batch=args.skip_failed_batch,
                threads=args.threads,
                token_file=args.token_file,
                tls_ca=args.tls_ca,
                driver_memory=args.driver_memory,
            )
        if args.command == "demo":
            from statestore.cli.demo import run_demo

            data_dir = args.data_dir or tempfile.mkdtemp(prefix="statestore-demo-")
            return run_demo(data_dir, args.base_port, spark=not args.no_spark)
    except (StateStoreError, ValueError) as exc:  # ValueError: e.g. a CA file it cannot use
        print(f"statestore {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2
