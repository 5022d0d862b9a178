"""``statestore rebalance``: even out the ring's load by moving virtual-node tokens (BPM).

Asks every normal member for its load (``GET /v1/load``), plans token counts with
``core/balance.plan`` and prints the plan (``--dry-run`` stops there). Otherwise it asks the
nodes to move, one at a time (``POST /v1/handover/tokens``), following each move with a
progress bar, and returns 0 once every move has switched; non-zero with the reason when the
ring cannot move now (a member down or already moving), a node does not answer, or a move
fails. The moves run on the nodes (node/moves/rebalance.py): stopping the command stops none.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Sequence
from typing import Any

from statestore.cli.command import (
    Subparsers,
    add_client_tls,
    add_seeds,
    failer,
    positive_float,
)
from statestore.cli.elastic import follow_move
from statestore.cli.http import first_view, request_json
from statestore.core.balance import NodeLoad, Plan, plan
from statestore.core.errors import MalformedData, StateStoreError
from statestore.core.view import RingView

__all__ = ["add_parser", "rebalance", "run"]


def add_parser(sub: Subparsers) -> None:
    rb = sub.add_parser(
        "rebalance",
        help="move virtual-node tokens from the most to the least loaded nodes (BPM)",
    )
    add_seeds(rb)
    rb.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
    rb.add_argument(
        "--metric",
        choices=("bytes", "requests", "served"),
        default="bytes",
        help="the load to even out: bytes held (default), requests or bytes served per second",
    )
    rb.add_argument(
        "--bound",
        type=positive_float,
        default=1.15,
        help="max/mean load to reach (default 1.15)",
    )
    rb.add_argument(
        "--timeout",
        type=positive_float,
        default=3600.0,
        help="seconds to wait for each node's move (it keeps going after)",
    )
    rb.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_client_tls(rb)
    rb.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return rebalance(
        args.seeds,
        dry_run=args.dry_run,
        metric=args.metric,
        bound=args.bound,
        timeout=args.timeout,
        as_json=args.json,
        tls_ca=args.tls_ca,
    )


def _unit(metric: str, value: float) -> str:
    if metric == "bytes":
        return f"{value / 1e6:,.1f} MB"
    if metric == "served":
        return f"{value / 1e6:,.2f} MB/s"
    return f"{value:,.1f} req/s"


def _moved_to(target: int, answer: dict[str, Any]) -> bool:
    return bool((answer.get("move") or {}).get("vnodes_to") == target)


def _blocker(view: dict[str, Any]) -> str | None:
    """Why the ring cannot move tokens now (None: it can), or why its view is unusable."""
    try:
        return RingView.from_json(view).busy()
    except MalformedData as exc:
        return str(exc)


def _print_plan(p: Plan, addresses: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "metric": p.metric,
                    "bound": p.bound,
                    "ratio_before": round(p.ratio_before, 4),
                    "ratio_after": round(p.ratio_after, 4),
                    "nodes": [
                        {
                            "id": n,
                            "address": addresses[n],
                            "vnodes": p.vnodes_before[n],
                            "next_vnodes": p.vnodes_after[n],
                            "load": p.load_before[n],
                            "predicted": round(p.load_after[n], 3),
                        }
                        for n in sorted(p.vnodes_before)
                    ],
                    "steps": [{"id": n, "vnodes": v} for n, v in p.steps()],
                },
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"load ({p.metric}): max/mean {p.ratio_before:.3f} now, "
        f"{p.ratio_after:.3f} predicted after (bound {p.bound:g})"
    )
    for col in ("id", "address", "tokens", "load now", "predicted"):
        table.add_column(col)
    for n in sorted(p.vnodes_before):
        before, after = p.vnodes_before[n], p.vnodes_after[n]
        table.add_row(
            n,
            addresses[n],
            f"{before}" if before == after else f"{before} -> {after}",
            _unit(p.metric, p.load_before[n]),
            _unit(p.metric, p.load_after[n]),
        )
    Console().print(table)


def _wait_still(address: str, timeout: float, poll: float, tls_ca: str | None) -> str | None:
    """Wait until the node at ``address`` sees no member moving (gossip brings it the end of
    the previous move a moment after that move's node switched); None, or why it gave up."""
    deadline = time.monotonic() + min(timeout, 60.0)
    why: str | None = "no answer"
    while time.monotonic() < deadline:
        try:
            why = _blocker(request_json(address, "/v1/ring", timeout=5.0, tls_ca=tls_ca))
        except StateStoreError as exc:  # not answering now: asked again until the deadline
            why = str(exc)
        if why is None:
            return None
        time.sleep(poll)
    return why


def rebalance(
    seeds: Sequence[str],
    *,
    dry_run: bool = False,
    metric: str = "bytes",
    bound: float = 1.15,
    timeout: float = 3600.0,
    as_json: bool = False,
    tls_ca: str | None = None,
    poll: float = 0.5,
) -> int:
    """Run ``statestore rebalance``; returns the exit code (module docstring). Raises
    NodeUnavailable when no seed answers."""
    from rich.console import Console

    console = Console(stderr=True)
    fail = failer("rebalance")

    _, view = first_view(seeds, tls_ca)
    why = _blocker(view)
    if why is not None:
        return fail(why)
    members = [
        m
        for m in view.get("members", [])
        if m.get("state", "normal") == "normal" and m.get("status") != "down"
    ]
    addresses = {m["id"]: m["address"] for m in members}
    loads = []
    for m in members:
        try:
            a = request_json(m["address"], "/v1/load", timeout=5.0, tls_ca=tls_ca)
            loads.append(NodeLoad.from_report(a))
        except (StateStoreError, ValueError) as exc:  # ValueError: a malformed load report
            return fail(f"node {m['id']} at {m['address']} gave no load report: {exc}")
    try:
        p = plan(loads, int(view["replicas"]), metric, bound)
    except ValueError as exc:
        return fail(str(exc))
    _print_plan(p, addresses, as_json)
    steps = p.steps()
    if dry_run:
        return 0
    if not p.needed:
        console.print(f"max/mean {p.ratio_before:.3f} is within {bound:g}: nothing to move")
        return 0
    if not steps:
        return fail(
            f"max/mean {p.ratio_before:.3f} is past {bound:g} but no token move lowers it "
            "(too few tokens to shift load in small steps: start the nodes with more --vnodes)"
        )
    for i, (node, target) in enumerate(steps, 1):
        console.print(f"[{i}/{len(steps)}] {node}: {p.vnodes_before[node]} -> {target} tokens")
        why = _wait_still(addresses[node], timeout, poll, tls_ca)
        if why is not None:
            return fail(f"node {node} cannot start its move: {why}")
        try:
            answer = request_json(
                addresses[node],
                "/v1/handover/tokens",
                body={"vnodes": target},
                timeout=10.0,
                tls_ca=tls_ca,
            )
        except StateStoreError as exc:
            return fail(f"node {node} did not start its move: {exc}")
        if answer.get("move") is None:
            continue
        why, last = follow_move(
            node,
            addresses[node],
            "rebalance",
            functools.partial(_moved_to, target),
            timeout,
            poll,
            tls_ca,
            console,
        )
        if why is not None:
            return fail(why)
        console.print(
            f"  moved {last.get('copied', 0)} copies ({last.get('bytes', 0) / 1e6:.1f} MB) "
            f"in {last.get('seconds', 0):.1f}s"
        )
    console.print(
        f"done: {len(steps)} node(s) moved tokens; predicted max/mean {p.ratio_after:.3f}. "
        "Old owners drop what they gave up over the next repair passes; `statestore "
        "rebalance --dry-run` then shows the measured figures."
    )
    return 0
