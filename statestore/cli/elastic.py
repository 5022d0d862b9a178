"""``statestore decommission`` and the moves shown by ``statestore ring`` (docs/operations.md).

``decommission`` finds the node in a seed's ring view, asks it to leave
(``POST /v1/handover/leave``), follows its progress (``GET /v1/handover``) with a progress bar,
and returns 0 once the node has handed everything over and left, non-zero with the reason
otherwise. The hand-over itself runs on the node (node/handover.py): a command that stops
early (Ctrl-C, ``--timeout``) does not stop it; running the command again follows it.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from statestore.cli.admin import token_headers
from statestore.core.address import node_url
from statestore.net.tls import client_context, tls_ca_file

__all__ = [
    "decommission",
    "describe_move",
    "failer",
    "follow_move",
    "member_moves",
    "request_json",
    "ring_view",
]

MOVING = ("joining", "leaving")


def request_json(
    address: str,
    path: str,
    body: object = None,
    timeout: float = 5.0,
    tls_ca: str | None = None,
) -> Any:
    """GET (or POST ``body`` as JSON) and decode the answer, over HTTPS verified against
    ``tls_ca`` (default ``STATESTORE_TLS_CA``) when one is given; an HTTP error's JSON body
    is raised as RuntimeError with the node's message."""
    ca = tls_ca_file(tls_ca)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        node_url(address, path, tls=ca is not None),
        data=data,
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json", **token_headers()},
    )
    try:
        context = client_context(ca) if ca else None
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        raise RuntimeError(message) from exc


def ring_view(seeds: Sequence[str], tls_ca: str | None) -> dict[str, Any]:
    errors = []
    for seed in seeds:
        try:
            view = request_json(seed, "/v1/ring", timeout=3.0, tls_ca=tls_ca)
            if isinstance(view, dict):
                return view
        except (OSError, RuntimeError, ValueError) as exc:
            errors.append(f"{seed}: {exc}")
    raise RuntimeError("no seed answered (" + "; ".join(errors) + "); check --seeds")


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
            except (OSError, RuntimeError, ValueError):
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
            except (OSError, RuntimeError, ValueError) as exc:
                now = time.monotonic()
                silent_since = silent_since or now
                if now - silent_since > 30.0:
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


def failer(command: str) -> Callable[[str], int]:
    """``fail(why)``: print ``statestore <command>: why`` on stderr and return exit code 1."""

    def fail(why: str) -> int:
        print(f"statestore {command}: {why}", file=sys.stderr)
        return 1

    return fail


def decommission(
    seeds: Sequence[str],
    node: str,
    timeout: float,
    poll: float = 0.5,
    tls_ca: str | None = None,
) -> int:
    """Run ``statestore decommission``; returns the exit code (0: the node left)."""
    from rich.console import Console

    console = Console(stderr=True)
    fail = failer("decommission")

    try:
        view = ring_view(seeds, tls_ca)
    except RuntimeError as exc:
        return fail(str(exc))
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
    try:
        request_json(address, "/v1/handover/leave", body={}, timeout=10.0, tls_ca=tls_ca)
    except (OSError, RuntimeError) as exc:
        return fail(str(exc))
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
