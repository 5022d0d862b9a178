"""``statestore outcomes``: what became of a store's tentative commits (acknowledged while
its writer was cut off from a quorum): confirmed, or rolled back with the version and source
positions to replay from (docs/client.md)."""

from __future__ import annotations

import argparse
import json

from statestore.cli.command import Subparsers, add_client_tls, add_seeds

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    oc = sub.add_parser(
        "outcomes",
        help="what became of a store's tentative commits: confirmed, or rolled back with "
        "the version and source positions to replay from",
    )
    add_seeds(oc)
    oc.add_argument("--store", required=True, metavar="QUERY/OPERATOR/PARTITION/NAME")
    oc.add_argument("--json", action="store_true")
    add_client_tls(oc)
    oc.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
