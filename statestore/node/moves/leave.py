"""Leave (``statestore decommission``, ``POST /v1/handover/leave``, and ``--drain-on-stop``):
the node gossips ``leaving`` and keeps serving; in rounds it asks the item's owners on the
ring without it which of its items they lack (``/v1/sync/have``) and pushes those, under the
``--stream-mbps`` budget. After a clean round it gossips ``left``, then sweeps once more (a
write that raced the switch on a stale view may have reached only it) and reports the move
done. A target that dies mid-round costs another round, not the move. A token move that
gives up tokens (node/moves/rebalance.py) and a removed member's sweep (node/removal.py) run
the same rounds (:func:`leave_round`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from statestore.core.errors import InvalidRequest, StateStoreError
from statestore.core.handover import Handover, NodeState, Phase, RoundResult, push_plan
from statestore.core.items import ChunkItem
from statestore.core.view import RingView

# the module, not its names: repair imports node/moves/copies.py, and this package's
# __init__ imports this module, so repair may be part-way through its import here
from statestore.node import repair
from statestore.node.daemon import MoveStatus, Node
from statestore.node.moves.copies import Unsupported, push_manifests
from statestore.node.moves.rounds import (
    FINAL_SWEEPS,
    Seen,
    copy_round,
    how_seen,
    pause,
    peers,
    sees_state,
    settle,
    spread,
)

__all__ = ["drain", "leave", "leave_problem", "leave_round", "start_leave"]

log = logging.getLogger(__name__)
DRAIN_START_GRACE = 10.0  # seconds a drain retries a leave the ring does not allow yet


def _leave_targets(node: Node, view: RingView) -> dict[str, list[str]]:
    """Each item we hold, with its future owners but us."""
    me = node.address
    targets: dict[str, list[str]] = {}
    for key in node.store.chunk_keys():
        targets[ChunkItem(key).name()] = [a for a in view.future_replicas_of(key) if a != me]
    for it in node.store.manifest_items():
        targets[it.name()] = [a for a in view.future_replicas_of(it.placement_key) if a != me]
    return targets


def _leave_listing(node: Node, view: RingView) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Every item's future owners, and the items to ask each of them about."""
    targets = _leave_targets(node, view)
    want: dict[str, list[str]] = defaultdict(list)
    for item, owners in targets.items():
        for t in owners:
            want[t].append(item)
    return targets, want


async def leave_round(node: Node, move: MoveStatus, seen: Seen, label: str = "") -> RoundResult:
    """Push every item we hold to its future owners (the ring without us, or with our next
    token count) that lack it; a peer whose answer about us is not ``seen`` does not route
    by our new state yet. ``label`` names the round in the move's timeline (default: its
    number)."""
    label = label or f"round {move.handover.rounds + 1}"
    # nothing pushed before this node learned the drops it missed while away (a leave or a
    # token move asked of a node just started again): those queries' items would go back
    await node.until_copies_served()
    started = node.clock()
    view = node.view()
    me = node.address
    # every item's future owners, off the loop (a scan of everything held): clients go on
    targets, want = await asyncio.to_thread(_leave_listing, node, view)
    answers = await repair.ask_have(node, want, view)
    pushes, unanswered = await asyncio.to_thread(push_plan, me, targets, answers)
    unseen = 0
    for _, address in peers(node):
        try:
            if not seen(await how_seen(node, address, 3.0)):
                unseen += 1
        except (StateStoreError, ValueError, AttributeError):
            unseen += 1
    move.span(f"{label} list", started, node.clock())
    started = node.clock()
    move.round_total, move.round_done = len(pushes), 0

    async def push(i: int) -> int | None:
        return await repair.push_item(node, pushes[i].target, pushes[i].item)

    async def push_many(batch: list[int]) -> list[int | None]:
        target = pushes[batch[0]].target  # the batch's: every item's
        try:
            return await push_manifests(node, target, [pushes[i].item for i in batch])
        except Unsupported:  # a target that predates batches: one at a time
            return [await push(i) for i in batch]

    keys = [p.target for p in pushes]
    moved, failed = await copy_round(node, move, [p.item for p in pushes], push, (keys, push_many))
    move.span(f"{label} copy", started, node.clock())
    return RoundResult(len(targets), len(pushes), failed, unanswered, unseen, moved)


def leave_problem(node: Node) -> str | None:
    """Why this node may not leave now (None: it may)."""
    assert node.membership is not None
    state = node.membership.state
    if state is NodeState.LEFT:
        return None  # done already: the caller sees the finished move
    if state is NodeState.JOINING:
        return "it is still joining: wait for its join to finish, then decommission it"
    if node.move is not None and node.move.handover.kind == "rebalance":
        if node.move.handover.phase is Phase.STREAMING:
            return "it is moving tokens (statestore rebalance): wait for the move to finish"
    view = node.view()
    movers = view.moving_tokens()
    if movers:
        return f"member {movers[0]} is moving tokens: one move at a time"
    others = [
        m
        for m in view.members
        if m.id != node.id and m.status == "up" and m.state == NodeState.NORMAL
    ]
    if len(others) < view.replicas:
        return (
            f"the ring would keep {len(others)} normal live node(s), fewer than R="
            f"{view.replicas} copies need: add a node first (statestore node --join)"
        )
    return None


async def leave(node: Node) -> None:
    """Run this node's leave to the end (started by :func:`start_leave`)."""
    assert node.move is not None
    move = node.move
    if move.handover.phase is Phase.SWITCHED:
        return
    if node.membership is not None and node.membership.state is not NodeState.LEFT:
        node.set_state(NodeState.LEAVING)
    await spread(node, sees_state(NodeState.LEAVING), "spread leaving")
    while move.handover.phase is Phase.STREAMING:
        result = await leave_round(node, move, sees_state(NodeState.LEAVING))
        move.handover = move.handover.after_round(result)
        log.info("leave round %d: %s", move.handover.rounds, result)
        await pause(node, move, result)
    node.set_state(NodeState.LEFT)
    # A writer whose view was older than our ``left`` may still have written here alone:
    # sweep until a round finds nothing to push and every member routes without us.
    for sweep in range(FINAL_SWEEPS):
        if sweep == 0:
            await spread(node, sees_state(NodeState.LEFT), "spread left")
        else:
            await asyncio.sleep(settle(node))
        if (await leave_round(node, move, sees_state(NodeState.LEFT), "sweep")).clean:
            break
    move.handover = move.handover.switch()


def start_leave(node: Node) -> MoveStatus:
    """Begin (or keep going with) this node's decommission; raises InvalidRequest when it
    may not leave now, saying why."""
    if node.move is not None and node.move.handover.kind == "leave":
        return node.move  # already under way, or done: asking again is harmless
    why = leave_problem(node)
    if why is not None:
        raise InvalidRequest(f"node {node.id} cannot leave: {why}")
    node.move = MoveStatus(Handover("leave"), node.clock())
    node.spawn(lambda: leave(node), "leave")
    return node.move


async def drain(node: Node, timeout: float, abort: asyncio.Event) -> str | None:
    """``--drain-on-stop``: decommission this node before it stops (the same leave as
    ``POST /v1/handover/leave``), waiting at most ``timeout`` seconds, or until ``abort`` is
    set (a second signal). Returns None once the node has left, else why it did not: the
    node then stops anyway, its copies one short until repair re-replicates them."""
    assert node.membership is not None
    if node.membership.state is NodeState.LEFT:
        return None
    deadline = node.clock() + timeout
    grace = node.clock() + min(DRAIN_START_GRACE, timeout)
    while True:  # a peer briefly suspect may make the leave wait: retry a few seconds
        try:
            move = start_leave(node)
            break
        except InvalidRequest as exc:
            why = str(exc)
        if node.clock() >= grace or abort.is_set():
            return f"{why}; stopping without a drain (repair will re-replicate its copies)"
        log.warning("drain: %s; trying again until %.0f s have passed", why, DRAIN_START_GRACE)
        await _wait(abort, 1.0)
    log.warning("drain: node %s hands its copies over before it stops", node.id)
    while move.handover.phase is not Phase.SWITCHED:
        left = deadline - node.clock()
        if abort.is_set():
            return "the drain was abandoned (a second signal) before the node left the ring"
        if left <= 0:
            return (
                f"the drain did not finish within --drain-timeout {timeout:g} s "
                f"({move.handover.rounds} round(s), {move.handover.copied} copied)"
            )
        await _wait(abort, min(left, 0.2))
    return None


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` or until ``event`` is set."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass
