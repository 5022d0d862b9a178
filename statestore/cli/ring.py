"""``statestore ring``: the ring's members as a seed sees them, with what each member says of
itself (its build, its move) and the removals under way or done."""

from __future__ import annotations

import argparse
import json
from typing import Any

from statestore.cli.command import Subparsers, add_client_tls, add_seeds
from statestore.cli.http import first_view, request_json
from statestore.core.errors import StateStoreError

__all__ = ["BUILD_FIELDS", "add_parser", "member_builds", "run"]

BUILD_FIELDS = ("version", "wire_format", "disk_format", "storage")


def add_parser(sub: Subparsers) -> None:
    r = sub.add_parser("ring", help="show the ring's members and epoch")
    add_seeds(r)
    r.add_argument("--json", action="store_true")
    add_client_tls(r)
    r.set_defaults(run=run)


def member_builds(
    view: dict[str, Any], timeout: float = 2.0, tls_ca: str | None = None
) -> dict[str, dict[str, object]]:
    """Each member's version, formats and storage figures, asked of the member itself
    (``GET /v1/health``, open, in parallel; the ring's gossip does not carry them). A member
    that does not answer is left out; one that answers without them (a build from before
    they were reported) has them as None."""
    from concurrent.futures import ThreadPoolExecutor

    members = view.get("members")
    if not isinstance(members, list):
        return {}
    asked = [m for m in members if isinstance(m, dict) and m.get("status") != "down"]

    def ask(m: dict[str, object]) -> dict[str, object] | None:
        try:
            health = request_json(str(m["address"]), "/v1/health", timeout=timeout, tls_ca=tls_ca)
        except StateStoreError:
            return None
        if not isinstance(health, dict):
            return None
        return {k: health.get(k) for k in BUILD_FIELDS}

    if not asked:
        return {}
    with ThreadPoolExecutor(min(16, len(asked))) as pool:
        answers = list(pool.map(ask, asked))
    return {str(m["id"]): a for m, a in zip(asked, answers, strict=True) if a is not None}


def _size(n: object) -> str:
    """Bytes for a person (``-``: not said)."""
    if not isinstance(n, int):
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return "-"


def run(args: argparse.Namespace) -> int:
    """The table (or ``--json``); raises NodeUnavailable when no seed answered."""
    _, view = first_view(args.seeds, args.tls_ca)
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
    columns = ("id", "address", "status", "state", "zone", "version", "tokens", "share", "held")
    for col in (*columns, "disk", "amp", "move"):
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
        storage = m.get("storage") or {}
        held, disk, amp = (
            storage.get("held_bytes"),
            storage.get("file_bytes"),
            storage.get("amplification"),
        )
        space = [_size(held), _size(disk), "-" if amp is None else f"{amp:.2f}x"]
        table.add_row(*cells, version, *([tokens] if counts else []), share, *space, move)
    Console().print(table)
    for ident, r in sorted((view.get("removals") or {}).items()):  # statestore removenode
        print(f"{r['mark']}: {ident} (was {r['address']}; by {r['by']})")
    return 0
