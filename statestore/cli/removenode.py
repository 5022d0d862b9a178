"""``statestore removenode``: write a dead node off for good (docs/operations.md).

Finds the node in a seed's ring view, refuses what the view already settles (an unknown id, a
node that is not down: a live node is decommissioned instead, one removed already), asks a
live member to remove it (``POST /v1/handover/remove``: the member asks every other one how it
sees the node and refuses with the reason, or starts: node/removal.py), and follows the
removal (``GET /v1/handover/remove``) with a progress bar. Returns 0 once the node is marked
``removed`` everywhere its remover could reach (its share re-made on R survivors), non-zero
with the reason otherwise. The removal runs on the node: stopping the command stops nothing.
"""

from __future__ import annotations

import argparse
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
from statestore.cli.http import first_view, request_json
from statestore.core.errors import StateStoreError

__all__ = ["add_parser", "removenode", "run"]

SILENT = 30.0  # seconds the remover may not answer before the command gives up


def add_parser(sub: Subparsers) -> None:
    rn = sub.add_parser(
        "removenode",
        help="remove a dead (down) node for good: re-make its share from the surviving "
        "copies, then drop it from the ring",
    )
    add_seeds(rn)
    rn.add_argument("--node", required=True, metavar="ID", help="the dead node's id (or address)")
    rn.add_argument(
        "--timeout",
        type=positive_float,
        default=3600.0,
        help="seconds to wait (the removal keeps going after)",
    )
    rn.add_argument(
        "--force",
        action="store_true",
        help="remove it though other members are down (refused otherwise: a commit only it "
        "and they acknowledged is on no live node, and only they keep it)",
    )
    add_client_tls(rn)
    rn.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return removenode(args.seeds, args.node, args.timeout, tls_ca=args.tls_ca, force=args.force)


def _find(view: dict[str, Any], node: str) -> dict[str, Any] | None:
    for m in view.get("members", []):
        if node in (m.get("id"), m.get("address")):
            return dict(m)
    return None


def _remover(view: dict[str, Any], seed: str, target: str) -> str:
    """Where to ask: the member already removing ``target`` when it is live (it says whether
    it still runs it), else the seed that answered."""
    removal = (view.get("removals") or {}).get(target) or {}
    by = _find(view, str(removal.get("by", ""))) if removal.get("mark") == "removing" else None
    if by is not None and by.get("status") != "down":
        return str(by["address"])
    return seed


def removenode(
    seeds: Sequence[str],
    node: str,
    timeout: float = 3600.0,
    poll: float = 0.5,
    tls_ca: str | None = None,
    force: bool = False,
) -> int:
    """Run ``statestore removenode``; returns the exit code (0: the node is removed). Raises
    from the error tree when no seed answers or the remover refuses (its reason).
    ``force``: though other members are down."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    console = Console(stderr=True)
    fail = failer("removenode")
    seed, view = first_view(seeds, tls_ca)
    member = _find(view, node)
    removal = (view.get("removals") or {}).get(node)
    if member is None and removal and removal.get("mark") == "removed":
        return fail(f"node {node} was removed from the ring already (by {removal.get('by')})")
    if member is None:
        ids = ", ".join(str(m.get("id")) for m in view.get("members", []))
        return fail(
            f"no member {node} in the ring (members: {ids}): give the id `statestore ring` "
            "shows for the dead node"
        )
    target = str(member["id"])
    if member.get("status") != "down":
        return fail(
            f"node {target} is {member.get('status')}: only a dead (down) node is removed; a "
            f"live node is decommissioned instead (statestore decommission --node {target}), "
            "or stop it and wait until `statestore ring` shows it down"
        )
    if member.get("state") == "left":
        return fail(f"node {target} left the ring already (decommissioned): nothing to remove")
    address = _remover(view, seed, target)
    started = request_json(
        address,
        "/v1/handover/remove",
        body={"node": target, "force": force},
        timeout=30.0,
        tls_ca=tls_ca,
    )
    remover = str(started.get("id", address)) if isinstance(started, dict) else address
    deadline = time.monotonic() + timeout
    silent_since: float | None = None
    run: dict[str, Any] = {}
    with Progress(
        SpinnerColumn(),
        "[progress.description]{task.description}",
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(f"removing {target}", total=None)
        while True:
            try:
                answer = request_json(address, "/v1/handover/remove", timeout=5.0, tls_ca=tls_ca)
                silent_since = None
            except StateStoreError as exc:  # not answering now: a restart, a busy node
                now = time.monotonic()
                silent_since = silent_since or now
                if now - silent_since > SILENT:
                    return fail(
                        f"node {remover}, which runs the removal, stopped answering ({exc}): run "
                        "the command again (another member takes the removal over)"
                    )
                time.sleep(poll)
                continue
            removals = answer.get("removals") if isinstance(answer, dict) else None
            got = removals.get(target) if isinstance(removals, dict) else None
            shown = got.get("run") if isinstance(got, dict) else None
            if not isinstance(shown, dict) or not shown:
                return fail(
                    f"node {remover} shows no removal of {target} under way (it restarted? "
                    "a remover started again resumes its removal once it hears from the "
                    "ring): run the command again to follow it"
                )
            run = shown
            bar.update(
                task,
                description=f"removing {target}: {run.get('phase')}, pass "
                f"{int(run.get('rounds', 0)) + 1} on {run.get('round_done', 0)}/"
                f"{run.get('round_total', 0)} members, {run.get('copied', 0)} copies",
            )
            if run.get("phase") == "switched":
                break
            if run.get("phase") == "failed":
                return fail(f"the removal of {target} failed: {run.get('reason')}")
            if time.monotonic() > deadline:
                return fail(
                    f"the removal of {target} has not finished within {timeout:.0f}s; it keeps "
                    f"going on node {remover}: run the command again to follow it"
                )
            time.sleep(poll)
    console.print(
        f"node {target} removed from the ring for good by {remover}: its share re-made from the "
        f"surviving copies ({run.get('copied', 0)} copies, {run.get('bytes', 0) / 1e6:.1f} MB "
        f"over {run.get('rounds', 0)} pass(es), {run.get('seconds', 0):.1f}s). Do not start its "
        "old data dir again: wipe it and add the machine back as a new node with --join"
    )
    return 0
