"""Token moves on a node (``statestore rebalance``): the shell around ``core/balance.py``.

``GET /v1/load`` (read right): this node's load as the balancer reads it: the tokens it owns,
the bytes it holds (its per-query counters, no scan) and the requests and body bytes it served
per second, decaying over about a minute.

``POST /v1/handover/tokens`` ``{"vnodes": N}`` (admin right): change this node's token count to
N through a hand-over (202; progress at ``GET /v1/handover``, ``kind`` ``rebalance``). The node
gossips ``next_vnodes`` N, so writes go to the owners on both rings, then runs rounds: a node
that gains tokens pulls what it will own from the holders (a join's rounds), one that loses
tokens pushes what others will own to them (a leave's rounds), under ``--stream-mbps``. After
a clean round every member routes by the new count, the node gossips it as owned (kept in its
data dir) and, when it lost tokens, sweeps once more for a write that raced the switch. Old
owners drop what they no longer own through repair, as after a join. One move at a time on a
ring: refused while any member joins, leaves or moves tokens (the ring's two rings must differ
by one node's change only, so every intermediate ring has R copies of every item); a new
node's ``--join`` is refused while a member moves tokens (node/moves/startup.check_join). The
target count is kept in the data dir: a node restarted mid-move starts the move again
(:func:`resume_loop`).

``--auto-rebalance RATIO``: the live member with the lowest id checks the ring every
``--rebalance-interval`` seconds and, when max/mean bytes held passes RATIO, runs the plan's
moves one after another, then waits for the old owners to drop their copies before it
measures again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from statestore.core.balance import DEFAULT_BOUND, NodeLoad, histogram, imbalance, plan
from statestore.core.errors import InvalidRequest, StateStoreError
from statestore.core.handover import Handover, NodeState, Phase
from statestore.core.view import RingView
from statestore.node.auth import allow, allow_ring
from statestore.node.daemon import NODE, MoveStatus, Node
from statestore.node.moves.join import join_round
from statestore.node.moves.leave import leave_round
from statestore.node.moves.rounds import FINAL_SWEEPS, pause, peers, settle, spread
from statestore.node.request import read_body
from statestore.wire.bodies import TokensRequest, decode_json

__all__ = [
    "auto_rebalance_loop",
    "auto_rebalance_once",
    "load_handler",
    "load_json",
    "resume_loop",
    "start_tokens",
    "tokens_handler",
]

log = logging.getLogger(__name__)


def load_json(node: Node) -> dict[str, Any]:
    """``GET /v1/load``'s answer."""
    now = node.clock()
    meter = node.served
    state = node.membership.state.value if node.membership is not None else "normal"
    me = node.membership.get(node.id) if node.membership is not None else None
    return {
        "id": node.id,
        "zone": node.config.zone,
        "state": state,
        "vnodes": node.vnodes or node.config.vnodes,
        "next_vnodes": 0 if me is None else me.next_vnodes,
        "bytes_held": sum(node.store.usage.snapshot().values()),
        "requests_per_s": round(meter.requests.rate(now), 3),
        "bytes_served_per_s": round(meter.bytes.rate(now), 1),
    }


async def load_handler(request: web.Request) -> web.Response:
    """``GET /v1/load``."""
    node = request.app[NODE]
    allow(request, "read")
    return web.json_response(load_json(node) | {"histogram": await _histogram(node)})


HISTOGRAM_TTL = 5.0  # seconds a histogram is reused: one key scan per window, however asked
_HISTOGRAMS: dict[str, tuple[float, list[list[int]]]] = {}


async def _histogram(node: Node) -> list[list[int]]:
    """Where this node's chunks lie (core/balance.histogram), counted in a worker thread and
    reused for HISTOGRAM_TTL seconds, so that asking often costs no more than one scan."""
    at, hist = _HISTOGRAMS.get(node.id, (-HISTOGRAM_TTL, []))
    if node.clock() - at >= HISTOGRAM_TTL:
        pairs = await asyncio.to_thread(lambda: histogram(node.store.chunk_sizes()))
        hist = [list(p) for p in pairs]
        _HISTOGRAMS[node.id] = (node.clock(), hist)
    return hist


# -- one node's move ------------------------------------------------------------------------


SPREADS = 3  # times a move's start is spread before, unconfirmed, it gives way


def _sees(target: int, switched: bool) -> Any:
    """Whether a peer's answer about us routes by our new count: moving to ``target``, or
    (``switched``) owning it."""
    if switched:
        return lambda a: a.get("vnodes") == target and not a.get("next_vnodes")
    return lambda a: a.get("next_vnodes") == target and a.get("state") == NodeState.NORMAL


async def move_tokens(node: Node, move: MoveStatus, target: int) -> None:
    """Run this node's change to ``target`` tokens to the end (module docstring)."""
    current = node.vnodes or node.config.vnodes
    grow = target > current
    node.set_vnodes(node.vnodes, target)
    seen = _sees(target, switched=False)
    for _ in range(SPREADS):  # a member slow to confirm is asked again
        confirmed = await spread(node, seen, "spread tokens") or not peers(node)
        if confirmed:  # (alone, nobody else can be moving)
            break
    other = node.view().busy(besides=node.id)
    if other is None and not confirmed:
        other = "not every member confirmed this move in time (another may have begun unseen)"
    if other is not None:
        # another member began a move at the same moment (an operator's and the automatic
        # mode's, two leaders'): the check that started this one ran on a view without it,
        # and one move at a time keeps R copies in every ring in between. Whichever learns
        # of the other once its own move is known everywhere gives way (both may: each is
        # asked again), as does one whose move was not confirmed everywhere (it cannot know
        # that no other began); nothing was copied or switched yet
        node.set_vnodes(node.vnodes, 0)
        await spread(node, lambda a: not a.get("next_vnodes"), "give way")
        move.handover = move.handover.fail(f"gave way (one move at a time): {other}")
        log.warning("token move to %d given up: %s", target, other)
        return
    while move.handover.phase is Phase.STREAMING:
        if grow:
            result = await join_round(node, move, target, seen)
        else:
            result = await leave_round(node, move, seen)
        move.handover = move.handover.after_round(result)
        log.info("token move round %d: %s", move.handover.rounds, result)
        await pause(node, move, result)
    node.set_vnodes(target, 0)
    if not grow:
        # a writer whose view predates the move may have written a range we gave up to us
        # alone: push until a round finds nothing and every member routes by the new count
        for sweep in range(FINAL_SWEEPS):
            if sweep == 0:
                await spread(node, _sees(target, switched=True), "spread tokens owned")
            else:
                await asyncio.sleep(settle(node))
            if (await leave_round(node, move, _sees(target, switched=True), "sweep")).clean:
                break
    move.handover = move.handover.switch()


def tokens_problem(node: Node) -> str | None:
    """Why this node may not move tokens now (None: it may)."""
    assert node.membership is not None
    if node.membership.state is not NodeState.NORMAL:
        return f"it is {node.membership.state.value}: only a normal member moves tokens"
    if node.move is not None and node.move.handover.phase is Phase.STREAMING:
        return f"its {node.move.handover.kind} is under way: wait for it to finish"
    return node.view().busy()


async def resume_loop(node: Node) -> None:
    """A token move the node's last run did not finish (its target kept in the data dir):
    started again once gossip settled, and retried every repair interval while the ring
    refuses it (a member down, another move). Stopping ended the move for the ring (peers
    route by the count it owns again), so the move starts over. Any move started on this
    node meanwhile (``statestore rebalance``, the automatic mode) supersedes it, and it is
    given up when the node no longer is a normal member (it leaves) or owns that count
    already; asking it for the count it owns (``POST /v1/handover/tokens``) cancels it (a
    node loop)."""
    target = node.resume_vnodes
    assert node.membership is not None
    if not target or node.membership.state is not NodeState.NORMAL:
        return
    log.warning("resuming the token move to %d tokens that a restart interrupted", target)
    await asyncio.sleep(settle(node))
    while node.resume_vnodes == target:
        if node.membership.state is not NodeState.NORMAL:
            log.warning("token move to %d given up: the node is %s", target, node.membership.state)
            break
        try:
            start_tokens(node, target)  # None: it owns that many (the saved target cleared)
            return
        except InvalidRequest as exc:
            log.warning("token move to %d waits: %s", target, exc)
        await asyncio.sleep(node.config.repair_interval)
    node.resume_vnodes = 0


def start_tokens(node: Node, target: int) -> MoveStatus | None:
    """Begin this node's change to ``target`` tokens; None when it owns that many already.
    Raises InvalidRequest saying why it may not now."""
    current = node.vnodes or node.config.vnodes
    if target == current:
        if node.resume_vnodes:  # asking for the count it owns cancels an interrupted move
            node.resume_vnodes = 0
            node.set_vnodes(node.vnodes, 0)
        return None
    why = tokens_problem(node)
    if why is not None:
        raise InvalidRequest(f"node {node.id} cannot move to {target} tokens: {why}")
    node.resume_vnodes = 0  # a move asked for now supersedes one a restart interrupted
    node.move = MoveStatus(
        Handover("rebalance"), node.clock(), vnodes_from=current, vnodes_to=target
    )
    move = node.move
    node.spawn(lambda: move_tokens(node, move, target), "tokens")
    return move


async def tokens_handler(request: web.Request) -> web.Response:
    """``POST /v1/handover/tokens``: move this node to ``vnodes`` tokens (202 with the move;
    200 with ``move`` null when it owns that many already)."""
    node = request.app[NODE]
    allow_ring(request)
    body = decode_json(await read_body(request), TokensRequest, "token move")
    move = start_tokens(node, body.vnodes)
    if move is None:
        return web.json_response({"id": node.id, "vnodes": body.vnodes, "move": None})
    return web.json_response(
        {"id": node.id, "vnodes": body.vnodes, "move": move.to_json(node.clock())}, status=202
    )


# -- the automatic mode ---------------------------------------------------------------------


async def _loads(node: Node) -> list[NodeLoad] | None:
    """Every normal member's load, or None when one did not answer (no plan on a guess)."""
    out = []
    for m in node.view().members:
        if m.state != NodeState.NORMAL or m.status == "down":
            continue
        try:
            resp = await node.transport.request("GET", m.address, "/v1/load", timeout=5.0)
            out.append(NodeLoad.from_report(resp.json()))
        except (StateStoreError, ValueError, AttributeError) as exc:
            log.info("auto-rebalance: %s gave no load (%s): not this round", m.id, exc)
            return None
    return out


async def _still(node: Node, address: str, timeout: float) -> bool:
    """Wait until the node at ``address`` sees no member moving (the previous move's end
    reaches it by gossip a moment after that move's node switched)."""
    deadline = node.clock() + timeout
    while node.clock() < deadline:
        try:
            answer = (await node.transport.request("GET", address, "/v1/ring")).json()
            if RingView.from_json(answer).busy() is None:
                return True
        except (StateStoreError, ValueError) as exc:
            log.info("auto-rebalance: %s gave no ring view: %s", address, exc)
        await asyncio.sleep(0.5)
    return False


async def _run_step(node: Node, address: str, target: int, timeout: float) -> bool:
    """Ask the node at ``address`` to move to ``target`` tokens and wait for it to switch."""
    if not await _still(node, address, 60.0):
        return False
    resp = await node.transport.request(
        "POST",
        address,
        "/v1/handover/tokens",
        json_body={"vnodes": target},
        timeout=10.0,
        ok=(200, 202),
    )
    if resp.json().get("move") is None:
        return True
    deadline = node.clock() + timeout
    while node.clock() < deadline:
        await asyncio.sleep(1.0)
        try:
            move = (await node.transport.request("GET", address, "/v1/handover")).json()
        except (StateStoreError, ValueError) as exc:
            log.info("auto-rebalance: %s did not say how its move goes: %s", address, exc)
            continue
        m = move.get("move") or {}
        if m.get("kind") == "rebalance" and m.get("phase") == Phase.SWITCHED:
            return True
        if m.get("kind") != "rebalance" or m.get("phase") == Phase.FAILED:
            return False
    return False


async def auto_rebalance_once(node: Node) -> bool:
    """One check of ``--auto-rebalance``; True when it moved tokens."""
    assert node.membership is not None
    view = node.view()
    normal = sorted(m.id for m in view.members if m.status == "up" and m.state == "normal")
    if not normal or normal[0] != node.id or view.moving:
        return False
    if view.busy() is not None:
        return False
    loads = await _loads(node)
    if loads is None or len(loads) < 2:
        return False
    measured = {n.id: float(n.bytes_held) for n in loads}
    if imbalance(measured) <= node.config.auto_rebalance:
        return False
    bound = min(DEFAULT_BOUND, node.config.auto_rebalance)
    p = await asyncio.to_thread(plan, loads, view.replicas, "bytes", bound)
    steps = p.steps()
    if not steps:
        return False
    log.warning(
        "auto-rebalance: max/mean bytes held %.2f > %.2f; moving tokens %s (predicted %.2f)",
        p.ratio_before,
        node.config.auto_rebalance,
        ", ".join(f"{n} {p.vnodes_before[n]}->{v}" for n, v in steps),
        p.ratio_after,
    )
    for member, target in steps:
        address = view.address(member)
        if not await _run_step(node, address, target, timeout=3600.0):
            log.warning("auto-rebalance: the move of %s did not finish; stopping here", member)
            return True
    return True


async def auto_rebalance_loop(node: Node) -> None:
    """``--auto-rebalance``: check every ``--rebalance-interval`` seconds (a node loop)."""
    if not node.config.auto_rebalance:
        return
    while True:
        await asyncio.sleep(node.config.rebalance_interval)
        if await auto_rebalance_once(node):
            # the old owners drop what they gave up over the next repair passes: measure after
            await asyncio.sleep(10 * node.config.repair_interval)
