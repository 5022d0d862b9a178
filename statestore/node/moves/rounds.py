"""Rounds: what joins, leaves, replacements, token moves and removals share.

A move goes in rounds. Each round lists what is to move, copies it (:func:`copy_round`: a
fixed set of workers, after this node's clients' requests, under the ``--stream-mbps``
budget, the manifests at the chunks' pace, node/moves/pace.py) and says how it went
(``core/handover.RoundResult``); :func:`pause` waits between rounds when one did not copy
everything. Before a round counts on a new ring state, :func:`spread` pushes it to every live
member and waits until each routes by it (at most :func:`settle`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from statestore.core.bucket import TokenBucket
from statestore.core.handover import NodeState, Phase, RoundResult, batches, copy_order
from statestore.core.items import is_manifest
from statestore.core.view import RingView
from statestore.node.daemon import MoveStatus, Node
from statestore.node.moves.pace import Pace

__all__ = [
    "BATCHES_IN_FLIGHT",
    "FINAL_SWEEPS",
    "IN_FLIGHT",
    "MANIFESTS_IN_FLIGHT",
    "MANIFEST_BATCH",
    "Copy",
    "CopyMany",
    "Seen",
    "copy_round",
    "how_seen",
    "pause",
    "peers",
    "sees_state",
    "settle",
    "spread",
]

log = logging.getLogger(__name__)
# whether a member's answer about us (``POST /v1/handover/items``, limit 0) routes by our state
Seen = Callable[[dict[str, Any]], bool]
# items copied at once: chunks (up to a MiB or so each), and manifests (a few hundred bytes:
# a round's thousands of them, one request each, are bound by round trips, not bytes)
IN_FLIGHT = 8
MANIFESTS_IN_FLIGHT = 32
# manifests copied in one request to one target or from one source (node/moves/copies.py), and
# such batches at once: one request, one writer job and one fsync for up to this many
MANIFEST_BATCH = 64
BATCHES_IN_FLIGHT = 4
FINAL_SWEEPS = 5  # rounds after ``left`` to push what raced the switch
BURST = 1.0  # seconds of the --stream-mbps budget a move may catch up on after waits
SPREAD_POLL = 0.05  # seconds between :func:`spread`'s asks, at least
SPREAD_TIMEOUT = 2.0  # seconds a member is given to answer one of them


def settle(node: Node) -> float:
    """How long gossip alone is given to spread a new state before a round counts on it
    (:func:`spread` usually has every member confirm it much sooner)."""
    return 4 * node.config.gossip_interval


async def spread(node: Node, seen: Seen, step: str = "") -> bool:
    """Push our ring state to every live member and wait until each confirms it routes by
    it (its answer about us is ``seen``) and we know every live member it knows; returns
    True then, False after :func:`settle` (gossip, and each round's own ``unseen`` count,
    take over). ``step`` names the wait in the move's timeline (``... (unconfirmed)`` when
    it ran out).

    Gossip alone reaches two random members per interval, so a round used to wait four
    intervals blindly after each state change (0.8-2 s, several times per move); pushing
    to each member and asking it back takes a few round trips. A node that just started
    (a join) knows nobody at first: it waits until its peers' members are all known to it
    too, so that no round lists from a partial ring."""
    started = node.clock()
    deadline = started + settle(node)
    poll = max(SPREAD_POLL, node.config.gossip_interval / 4)
    done = False
    while not done:
        others = peers(node)
        try:  # a member that does not answer holds one ask at most until the deadline
            async with asyncio.timeout(max(poll, deadline - node.clock())):
                done = bool(others) and await _confirmed(node, others, seen)
        except TimeoutError:
            done = False
        if done or node.clock() >= deadline:
            break
        await asyncio.sleep(min(poll, max(0.0, deadline - node.clock())))
    if node.move is not None and step:
        node.move.span(step if done else f"{step} (unconfirmed)", started, node.clock())
    if not done:
        log.info("%s: not every member confirmed within %.1f s; gossip goes on", step, settle(node))
    return done


async def how_seen(node: Node, address: str, timeout: float) -> dict[str, Any]:
    """How the member at ``address`` sees us (``POST /v1/handover/items``, limit 0); raises
    StateStoreError when it does not answer, ValueError when the answer is not an object."""
    answer = (
        await node.transport.request(
            "POST",
            address,
            "/v1/handover/items",
            json_body={"node": node.id, "limit": 0},
            timeout=timeout,
        )
    ).json()
    if not isinstance(answer, dict):
        raise ValueError(f"{address} answered how it sees us with {type(answer).__name__}")
    return answer


async def _confirmed(node: Node, others: list[tuple[str, str]], seen: Seen) -> bool:
    """Whether every peer (``others``), once pushed our state, routes by it and knows no live
    member we do not know."""
    known = {i for i, _ in others} | {node.id}

    async def one(address: str) -> bool:
        await node.gossip_with(address)
        if not seen(await how_seen(node, address, SPREAD_TIMEOUT)):
            return False
        ring = await node.transport.request("GET", address, "/v1/ring", timeout=SPREAD_TIMEOUT)
        theirs = RingView.from_json(ring.json()).members
        live = (m.id for m in theirs if m.status != "down" and m.state != NodeState.LEFT)
        return all(i in known for i in live)

    answers = await asyncio.gather(*(one(a) for _, a in others), return_exceptions=True)
    return all(a is True for a in answers)


def _bucket(node: Node) -> TokenBucket:
    """The ``--stream-mbps`` budget. It starts empty, so a move begins at the budget, not
    with a burst (nor does a small hand-over at a low budget run unthrottled). Its burst is
    :data:`BURST` seconds of the budget, so copies that waited for clients
    (node/foreground.py, at most a quarter second per wait) may catch up afterwards (at
    1 GiB and 50 MB/s this measured no different from a quarter second's burst: what kept
    the copy below its budget was the manifests' round trips, docs/benchmarks.md)."""
    rate = node.config.stream_mbps * 1e6
    return TokenBucket(rate, rate * BURST, node.clock(), tokens=0.0)


def _pace(items: Sequence[str]) -> tuple[Pace, list[int]]:
    """A round's :class:`Pace` for the items it copies, and each copy's index among the
    round's manifests (-1: a chunk)."""
    index: list[int] = []
    n = 0
    for item in items:
        manifest = is_manifest(item)
        index.append(n if manifest else -1)
        n += manifest
    return Pace(len(items) - n, n), index


def _ordered(
    items: Sequence[str], keys: Sequence[str] | None
) -> tuple[list[int], tuple[Pace, list[int]], list[list[int]]]:
    """The copy order, the round's pace and each position's manifest ordinal, and (with
    ``keys``, each item's target or source) the manifests' batches, as positions."""
    order = copy_order(items)
    pace, index = _pace([items[i] for i in order])
    if keys is None:
        return order, (pace, index), []
    where = [p for p, x in enumerate(index) if x >= 0]
    cut = batches([keys[order[p]] for p in where], MANIFEST_BATCH)
    return order, (pace, index), [[where[j] for j in b] for b in cut]


async def _throttle(node: Node, bucket: TokenBucket, n: int) -> None:
    wait = bucket.reserve(n, node.clock())
    if wait > 0:
        await asyncio.sleep(wait)


Copy = Callable[[int], Awaitable[int | None]]
CopyMany = Callable[[list[int]], Awaitable[list[int | None]]]


async def copy_round(
    node: Node,
    move: MoveStatus,
    items: Sequence[str],
    copy: Copy,
    batched: tuple[Sequence[str], CopyMany] | None = None,
) -> tuple[int, int]:
    """Copy a round's ``items`` (``copy(i)`` copies ``items[i]`` and returns its bytes, or None
    when it did not land): :data:`IN_FLIGHT` chunks and :data:`MANIFESTS_IN_FLIGHT` manifests
    at once, each after this node's clients' requests (node/foreground.py), under the
    ``--stream-mbps`` budget, the manifests at the chunks' pace (node/moves/pace.py). Returns
    (bytes copied, copies failed); ``move`` counts the bytes and the copies done.

    ``batched`` (each item's target or source, and ``copy_many(indexes)`` returning each
    one's bytes or None, never raising): manifests go in batches of :data:`MANIFEST_BATCH`
    of one target or source, :data:`BATCHES_IN_FLIGHT` at once, each when the pace allows
    its last one.

    A fixed set of workers takes the items in turn: the round's cost on the event loop at
    its start does not grow with the items it copies (a task per item was tens of thousands
    of tasks made at once on a large node)."""
    # sizes mixed over the round, not one store's run after another; off the loop (a sort of
    # tens of thousands of names)
    keys = None if batched is None else batched[0]
    order, (pace, index), cut = await asyncio.to_thread(_ordered, items, keys)
    bucket = _bucket(node)
    chunks = iter([p for p, x in enumerate(index) if x < 0])
    manifests = iter([p for p, x in enumerate(index) if x >= 0])
    groups = iter(cut)
    moved = failed = 0

    async def count(sizes: Sequence[int | None]) -> None:
        nonlocal moved, failed
        n = 0
        for size in sizes:
            if size is None:
                failed += 1
                continue
            n += size
            move.round_done += 1
        moved += n
        move.bytes += n
        await _throttle(node, bucket, n)

    async def chunk_worker() -> None:
        for p in chunks:  # shared by the workers: each item is taken once
            pace.chunk_started()
            await node.foreground.wait()
            await count([await copy(order[p])])

    async def manifest_worker() -> None:
        for p in manifests:
            await pace.manifest(index[p])
            await node.foreground.wait()
            await count([await copy(order[p])])

    async def batch_worker() -> None:
        assert batched is not None
        for group in groups:  # positions in order: the last one is the batch's latest turn
            await pace.manifest(index[group[-1]])
            await node.foreground.wait()
            await count(await batched[1]([order[p] for p in group]))

    workers = [chunk_worker() for _ in range(min(IN_FLIGHT, pace.chunks))]
    if batched is None:
        workers += [manifest_worker() for _ in range(min(MANIFESTS_IN_FLIGHT, pace.manifests))]
    else:
        workers += [batch_worker() for _ in range(min(BATCHES_IN_FLIGHT, len(cut)))]
    await asyncio.gather(*workers)
    return moved, failed


async def pause(node: Node, move: MoveStatus, result: RoundResult) -> None:
    """Between rounds: none after a round that copied everything it tried (the next one
    verifies at once); a repair interval when something failed, did not answer, or does not
    route by the new state yet (gossip and failure detection need the time)."""
    if move.handover.phase is Phase.STREAMING and (
        result.failed or result.unanswered or result.unseen
    ):
        await asyncio.sleep(node.config.repair_interval)


def peers(node: Node) -> list[tuple[str, str]]:
    """``(id, address)`` of every live member but us that has not left."""
    view = node.view()
    return [
        (m.id, m.address)
        for m in view.members
        if m.id != node.id and m.status != "down" and m.state != NodeState.LEFT
    ]


def sees_state(state: NodeState) -> Seen:
    return lambda answer: bool(answer.get("state") == state)
