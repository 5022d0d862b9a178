"""``statestore decommission`` and the moves shown by ``statestore ring`` (docs/operations.md).

``decommission`` finds the node in a seed's ring view, asks it to leave
(``POST /v1/handover/leave``), follows its progress (``GET /v1/handover``) with a progress bar,
and returns 0 once the node has handed everything over and left, non-zero with the reason
otherwise. The hand-over itself runs on the node (node/moves/): a command that stops
early (Ctrl-C, ``--timeout``) does not stop it; running the command again follows it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from statestore.cli.command import (
    Subparsers,
    add_client_tls,
    add_seeds,
    failer,
    positive_float,
)
from statestore.cli.http import first_view, request_json
from statestore.core.errors import StateStoreError

__all__ = [
    "add_parser",
    "decommission",
    "describe_move",
    "follow_move",
    "member_moves",
    "run",
]

MOVING = ("joining", "leaving")
SILENT = 30.0  # seconds a moving node may not answer before the command gives up


def add_parser(sub: Subparsers) -> None:
    dc = sub.add_parser(
        "decommission",
        help="hand a node's copies to their next owners, then take it out of the ring",
    )
    add_seeds(dc)
    dc.add_argument("--node", required=True, metavar="ID", help="node id (or its address)")
    dc.add_argument(
        "--timeout",
        type=positive_float,
        default=3600.0,
        help="seconds to wait (the node keeps going after)",
    )
    add_client_tls(dc)
    dc.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return decommission(args.seeds, args.node, args.timeout, tls_ca=args.tls_ca)


def member_moves(
    view: dict[str, Any], timeout: float = 2.0, tls_ca: str | None = None
) -> dict[str, dict[str, Any]]:
    """The move of every joining, leaving or token-moving member, asked of the member itself
    (a member that does not answer is left out)."""
    out: dict[str, dict[str, Any]] = {}
    for m in view.get("members", []):
        if (m.get("state") in MOVING or m.get("next_vnodes")) and m.get("status") != "down":
            try:
                answer = request_json(m["address"], "/v1/handover", timeout=timeout, tls_ca=tls_ca)
            except StateStoreError:
                continue
            if isinstance(answer, dict) and answer.get("move"):
                out[m["id"]] = answer["move"]
    return out


def describe_move(move: dict[str, Any]) -> str:
    """One line: kind, phase, the round's progress, bytes and rate."""
    done, total = move.get("round_done", 0), move.get("round_total", 0)
    pct = f"{100 * done / total:.0f}%" if total else "-"
    return (
        f"{move['kind']} {move['phase']} round {move['rounds'] + 1}: {done}/{total} items "
        f"({pct}), {move['bytes'] / 1e6:.1f} MB at {move['rate_mbps']:.1f} MB/s"
    )


def _find(view: dict[str, Any], node: str) -> dict[str, Any] | None:
    for m in view.get("members", []):
        if node in (m["id"], m["address"]):
            return dict(m)
    return None


def follow_move(
    node_id: str,
    address: str,
    kind: str,
    finished: Callable[[dict[str, Any]], bool],
    timeout: float,
    poll: float,
    tls_ca: str | None,
    console: Any,
) -> tuple[str | None, dict[str, Any]]:
    """Follow a node's ``kind`` move (``GET /v1/handover``) with a progress bar until it
    switched and ``finished(answer)``; returns ``(why it did not, the last move seen)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    silent_since: float | None = None
    last: dict[str, Any] = {}
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(f"{kind} of {node_id}", total=None)
        while True:
            try:
                answer = request_json(address, "/v1/handover", timeout=5.0, tls_ca=tls_ca)
                silent_since = None
            except StateStoreError as exc:  # not answering now: a restart, a busy node
                now = time.monotonic()
                silent_since = silent_since or now
                if now - silent_since > SILENT:
                    return (
                        f"node {node_id} stopped answering mid-{kind} ({exc}): restart it "
                        f"and run the command again to finish the hand-over",
                        last,
                    )
                time.sleep(poll)
                continue
            move = answer.get("move") or {}
            if move.get("kind") == kind:
                last = move
                bar.update(
                    task,
                    description=f"{node_id}: {kind} {move['phase']}, round {move['rounds'] + 1}",
                    total=max(move["round_total"], 1),
                    completed=move["round_done"] if move["round_total"] else 1,
                )
                if move["phase"] == "switched" and finished(answer):
                    return None, last
                if move["phase"] == "failed":
                    return f"node {node_id}: {move['reason']}", last
            elif kind != "leave" or answer.get("state") != "left":
                return (
                    f"node {node_id} shows no {kind} under way (it restarted? its move "
                    "was abandoned: run the command again)",
                    last,
                )
            if time.monotonic() > deadline:
                return (
                    f"node {node_id} has not finished within {timeout:.0f}s (now: "
                    f"{describe_move(move) if move else 'no move'}); it keeps going: run "
                    "the command again to follow it",
                    last,
                )
            time.sleep(poll)


def decommission(
    seeds: Sequence[str],
    node: str,
    timeout: float,
    poll: float = 0.5,
    tls_ca: str | None = None,
) -> int:
    """Run ``statestore decommission``; returns the exit code (0: the node left). Raises
    from the error tree when no seed answers or the node refuses to leave."""
    from rich.console import Console

    console = Console(stderr=True)
    fail = failer("decommission")

    _, view = first_view(seeds, tls_ca)
    member = _find(view, node)
    if member is None:
        ids = ", ".join(m["id"] for m in view.get("members", []))
        return fail(f"no member {node} in the ring (members: {ids})")
    if member.get("state") == "left":
        console.print(f"node {member['id']} has already left the ring")
        return 0
    if member["status"] == "down":
        return fail(
            f"node {member['id']} is down: a decommission needs it up to hand its copies "
            "over (repair re-makes the copies of a dead node on its own)"
        )
    address = member["address"]
    request_json(address, "/v1/handover/leave", body={}, timeout=10.0, tls_ca=tls_ca)
    why, last = follow_move(
        member["id"],
        address,
        "leave",
        lambda answer: answer.get("state") == "left",
        timeout,
        poll,
        tls_ca,
        console,
    )
    if why is not None:
        return fail(why)
    console.print(
        f"node {member['id']} left the ring: {last.get('copied', 0)} copies "
        f"({last.get('bytes', 0) / 1e6:.1f} MB) handed over in {last.get('seconds', 0):.1f}s "
        f"over {last.get('rounds', 0)} round(s); stop its process when convenient"
    )
    return 0
