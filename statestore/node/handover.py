"""Join and leave hand-overs on a node: the shell around ``core/handover.py``.

**Join** (``statestore node --join``): the node gossips ``joining``, so writes already reach
it while reads still go to the current owners. In rounds, it asks every live member which of
the items it holds the joining node will own (``POST /v1/handover/items``, paged), fetches
what it lacks (each item from the source rendezvous hashing names, failing over to the others
that listed it) under the ``--stream-mbps`` budget, and checks. The first round in which
every source answered, nothing was missing and every source already routes writes to it
verifies the copy; the node then gossips ``normal``. Old owners drop what they no longer own
through repair, which keeps a copy until every new owner confirmed it.

**Leave** (``statestore decommission``, ``POST /v1/handover/leave``): the node gossips
``leaving`` and keeps serving; in rounds it asks the item's owners on the ring without it
which of its items they lack (``/v1/sync/have``) and pushes those, under the same budget.
After a clean round it gossips ``left``, then sweeps once more (a write that raced the
switch on a stale view may have reached only it) and reports the move done.

A source or target that dies mid-round costs another round, not the move; a joining node
that dies is declared down and drops out of both rings (writes go to the old owners alone).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from statestore.core.bucket import TokenBucket
from statestore.core.errors import (
    CorruptChunk,
    InvalidRequest,
    MalformedData,
    StateStoreError,
    UnprovenAnswer,
)
from statestore.core.handover import (
    FUTURE_STATES,
    Handover,
    NodeState,
    Phase,
    RoundResult,
    Sighting,
    batches,
    copy_order,
    pull_plan,
    push_plan,
    replace_plan,
)
from statestore.core.ids import StoreId
from statestore.core.items import ChunkItem, ManifestItem, is_manifest
from statestore.core.items import parse as parse_item
from statestore.core.membership import is_self_alias
from statestore.core.placement import Member, Ring
from statestore.core.view import RingView
from statestore.net.http import HttpTransport
from statestore.net.tls import client_context
from statestore.net.transport import Transport
from statestore.node.auth import Access, allow, allow_ring
from statestore.node.config import NodeConfig
from statestore.node.copies import Unsupported, fetch_manifests, push_manifests
from statestore.node.daemon import NODE, MoveStatus, Node, stored_identity, stored_ring_state
from statestore.node.pace import Pace
from statestore.node.repair import ask_have, push_item
from statestore.node.request import read_body
from statestore.wire.bodies import HandoverItemsRequest, decode_json
from statestore.wire.manifest import decode_manifest

__all__ = [
    "check_join",
    "check_replace",
    "check_returning",
    "copy_round",
    "drain",
    "join_loop",
    "join_round",
    "leave_round",
    "pause",
    "register",
    "settle",
    "spread",
    "start_leave",
]

log = logging.getLogger(__name__)
# whether a member's answer about us (``POST /v1/handover/items``, limit 0) routes by our state
Seen = Callable[[dict[str, Any]], bool]
PAGE = 5000  # items per listing page
# items copied at once: chunks (up to a MiB or so each), and manifests (a few hundred bytes:
# a round's thousands of them, one request each, are bound by round trips, not bytes)
IN_FLIGHT = 8
MANIFESTS_IN_FLIGHT = 32
# manifests copied in one request to one target or from one source (node/copies.py), and
# such batches at once: one request, one writer job and one fsync for up to this many
MANIFEST_BATCH = 64
BATCHES_IN_FLIGHT = 4
FINAL_SWEEPS = 5  # rounds after ``left`` to push what raced the switch
DRAIN_START_GRACE = 10.0  # seconds a drain retries a leave the ring does not allow yet
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
        peers = _peers(node)
        try:  # a member that does not answer holds one ask at most until the deadline
            async with asyncio.timeout(max(poll, deadline - node.clock())):
                done = bool(peers) and await _confirmed(node, peers, seen)
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


async def _how_seen(node: Node, address: str, timeout: float) -> dict[str, Any]:
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


async def _confirmed(node: Node, peers: list[tuple[str, str]], seen: Seen) -> bool:
    """Whether every peer, once pushed our state, routes by it and knows no live member we
    do not know."""
    known = {i for i, _ in peers} | {node.id}

    async def one(address: str) -> bool:
        await node.gossip_with(address)
        if not seen(await _how_seen(node, address, SPREAD_TIMEOUT)):
            return False
        ring = await node.transport.request("GET", address, "/v1/ring", timeout=SPREAD_TIMEOUT)
        theirs = RingView.from_json(ring.json()).members
        live = (m.id for m in theirs if m.status != "down" and m.state != NodeState.LEFT)
        return all(i in known for i in live)

    answers = await asyncio.gather(*(one(a) for _, a in peers), return_exceptions=True)
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
    ``--stream-mbps`` budget, the manifests at the chunks' pace (node/pace.py). Returns
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


def _peers(node: Node) -> list[tuple[str, str]]:
    """``(id, address)`` of every live member but us that has not left."""
    view = node.view()
    return [
        (m.id, m.address)
        for m in view.members
        if m.id != node.id and m.status != "down" and m.state != NodeState.LEFT
    ]


# -- the source's side: what a joining node will own ---------------------------------------


def items_for(node: Node, target: str, zone: str, vnodes: int = 0) -> list[str]:
    """The items this node holds that ``target`` will own: placed on the future ring (live
    ``normal`` and ``joining`` members) with ``target`` in it, owning ``vnodes`` tokens (0:
    the ring's count), even before gossip told us it joins or grows, so a listing is never
    short because our view lags."""
    view = node.view()
    members = {
        m.placed_later(view.vnodes)
        for m in view.members
        if m.status != "down" and m.state in FUTURE_STATES and m.id != target
    }
    ring = Ring(members | {Member(target, zone, vnodes)}, view.vnodes)
    r = view.replicas
    out = [ChunkItem(k).name() for k in node.store.chunk_keys() if target in ring.replicas(k, r)]
    owns: dict[StoreId, bool] = {}
    for it in node.store.manifest_items():
        if it.store not in owns:
            owns[it.store] = target in ring.replicas(it.placement_key, r)
        if owns[it.store]:
            out.append(it.name())
    out.sort()
    return out


async def handover_items(request: web.Request) -> web.Response:
    """``POST /v1/handover/items``: a page of the items this node holds that a joining node
    will own, and the ring state this node sees for it (``limit`` 0: the state only, and how
    this node sees that member: ``member`` status, state, incarnation, zone, or null)."""
    node = request.app[NODE]
    allow(request, "admin")
    body = decode_json(await read_body(request), HandoverItemsRequest, "handover items")
    assert node.membership is not None
    seen = node.membership.get(body.node)
    state = None if seen is None or seen.status.value == "down" else seen.state.value
    # the token counts this node routes ``body.node`` by (a rebalance waits for them)
    counts = {
        "vnodes": 0 if seen is None else seen.vnodes,
        "next_vnodes": 0 if seen is None else seen.next_vnodes,
    }
    if body.limit == 0:
        member = (
            None
            if seen is None
            else {
                "status": seen.status.value,
                "state": seen.state.value,
                "incarnation": seen.incarnation,
                "zone": seen.zone,
            }
            | (  # only when marked: the answer of a ring that never removed a node is as before
                {"removal": seen.removal, "removed_by": seen.removed_by} if seen.removal else {}
            )
        )
        return web.json_response(
            {"state": state, "member": member, "items": [], "next": None} | counts
        )
    # listing, paging and encoding (5,000 names: ~10 ms of JSON) in a worker thread, so
    # clients' requests go on meanwhile
    page = await asyncio.to_thread(_page, node, body, {"state": state} | counts)
    return web.Response(body=page, content_type="application/json")


def _page(node: Node, body: HandoverItemsRequest, answer: dict[str, Any]) -> bytes:
    items = items_for(node, body.node, body.zone, body.vnodes)
    if body.after:
        items = [i for i in items if i > body.after]
    page = items[: body.limit]
    more = len(items) > body.limit
    return json.dumps(
        answer | {"items": page, "next": page[-1] if more and page else None}
    ).encode()


# -- join ------------------------------------------------------------------------------


def sees_joining(answer: dict[str, Any]) -> bool:
    """Whether a source routes writes to us as a joining node."""
    return bool(answer.get("state") == NodeState.JOINING)


def sees_state(state: NodeState) -> Seen:
    return lambda answer: bool(answer.get("state") == state)


async def _listing(node: Node, address: str, vnodes: int) -> tuple[list[str], dict[str, Any]]:
    """Every item ``address`` holds that we will own (owning ``vnodes`` tokens), and its
    last answer (how it sees us)."""
    items: list[str] = []
    after = ""
    while True:
        resp = await node.transport.request(
            "POST",
            address,
            "/v1/handover/items",
            json_body={
                "node": node.id,
                "zone": node.config.zone,
                "after": after,
                "limit": PAGE,
                "vnodes": vnodes,
            },
        )
        answer = await asyncio.to_thread(resp.json)  # a page of 5,000 names: off the loop
        items += [str(i) for i in answer["items"]]
        if not answer.get("next"):
            return items, answer
        after = str(answer["next"])


def _held(node: Node, items: set[str]) -> set[str]:
    """The listed items we hold already. A name that is no item's is not held: its fetch
    fails (MalformedData), and the round with it."""
    chunks: list[tuple[str, str]] = []
    out: set[str] = set()
    for name in sorted(items):
        try:
            it = parse_item(name)
        except MalformedData:
            continue
        if isinstance(it, ChunkItem):
            chunks.append((name, it.key))
        elif node.store.raw_manifest(it.store, it.version, it.kind, it.epoch) is not None:
            out.add(name)
    flags = node.store.has_chunks([key for _, key in chunks])
    out.update(name for (name, _), has in zip(chunks, flags, strict=True) if has)
    return out


async def _fetch(node: Node, source: str, item: str) -> int:
    """Copy ``item`` from ``source`` into our store; returns its bytes. Raises
    StateStoreError (CorruptChunk when the bytes fail their checksum) when it did not land."""
    it = parse_item(item)  # a name from a source's listing
    if isinstance(it, ChunkItem):
        # ?copy=1: the source serves it after its clients' requests (node/foreground.py)
        resp = await node.transport.request("GET", source, f"/v1/chunks/{it.key}?copy=1")
        await node.write(node.store.put_chunk, it.key, resp.body, order="copy")
        return len(resp.body)
    path = f"/v1/manifests/{it.store.path}/{it.version}/{it.kind}?epoch={it.epoch}&copy=1"
    resp = await node.transport.request("GET", source, path)
    m = decode_manifest(resp.body)
    if ManifestItem.of(m) != it:
        raise CorruptChunk(f"{source} answered manifest {item} with another one")
    if m.version >= node.store.floor(m.store):
        # every epoch held is kept, replaced ones as side keys (core/manifest.py, "Lineage")
        await node.write(node.store.copy_manifest, m, order="copy")
    return len(resp.body)


async def join_round(
    node: Node, move: MoveStatus, vnodes: int = 0, seen: Seen = sees_joining
) -> RoundResult:
    """List what we will own (owning ``vnodes`` tokens, 0: the ring's count), fetch what is
    missing, and say how it went; a source whose answer is not ``seen`` does not route by
    our new state yet."""
    label = f"round {move.handover.rounds + 1}"
    started = node.clock()
    listings: dict[str, list[str]] = {}
    unanswered = unseen = 0
    for _, address in _peers(node):
        try:
            items, answer = await _listing(node, address, vnodes)
        except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
            log.info("join: %s did not list what we will own: %s", address, exc)
            unanswered += 1
            continue
        listings[address] = items
        if not seen(answer):
            unseen += 1
    listed = {i for items in listings.values() for i in items}
    held = await asyncio.to_thread(_held, node, listed)  # off the loop: clients go on
    pulls = pull_plan(listings, held)
    move.span(f"{label} list", started, node.clock())
    started = node.clock()
    move.round_total, move.round_done = len(pulls), 0

    async def fetch(i: int, skip: str = "") -> int | None:
        for source in pulls[i].sources:
            if source == skip:
                continue
            try:
                return await _fetch(node, source, pulls[i].item)
            except StateStoreError as exc:
                log.debug("join: %s from %s failed: %s", pulls[i].item, source, exc)
        return None

    async def fetch_many(batch: list[int]) -> list[int | None]:
        source = pulls[batch[0]].sources[0]  # the batch's: every item's first source
        try:
            got = await fetch_manifests(node, source, [pulls[i].item for i in batch])
            skip = source
        except Unsupported:  # a source that predates batches: one at a time
            got, skip = [None] * len(batch), ""
        # what did not land, one at a time from the other sources that listed it
        return [
            n if n is not None else await fetch(i, skip) for n, i in zip(got, batch, strict=True)
        ]

    keys = [p.sources[0] for p in pulls]
    moved, failed = await copy_round(node, move, [p.item for p in pulls], fetch, (keys, fetch_many))
    move.span(f"{label} copy", started, node.clock())
    return RoundResult(len(listed), len(pulls), failed, unanswered, unseen, moved)


async def join_loop(node: Node) -> None:
    """Run this node's join to the end, if it started as ``joining`` (a node loop)."""
    assert node.membership is not None
    if node.membership.state is not NodeState.JOINING:
        return
    if node.move is None:
        node.move = MoveStatus(Handover("join"), node.clock())
    move = node.move
    if move.handover.phase is Phase.SWITCHED:
        return
    await spread(node, sees_joining, "spread joining")
    while move.handover.phase is Phase.STREAMING:
        movers = node.view().moving_tokens()
        if movers:  # one move at a time (check_join): a resumed join waits for it
            log.warning("join waits: member %s is moving tokens", movers[0])
            await asyncio.sleep(node.config.repair_interval)
            continue
        result = await join_round(node, move, node.vnodes)
        move.handover = move.handover.after_round(result)
        log.info("join round %d: %s", move.handover.rounds, result)
        await pause(node, move, result)
    if node.membership.state is NodeState.JOINING:
        node.set_state(NodeState.NORMAL)
    move.handover = move.handover.switch()


# -- replace a dead node ------------------------------------------------------------------


async def _sighting(transport: Transport, address: str, target: str) -> Sighting | None:
    resp = await transport.request(
        "POST",
        address,
        "/v1/handover/items",
        json_body={"node": target, "limit": 0},
        timeout=5.0,
    )
    m = resp.json().get("member")
    if m is None:
        return None
    return Sighting(
        str(m["status"]),
        str(m["state"]),
        int(m["incarnation"]),
        str(m["zone"]),
        str(m.get("removal", "")),  # statestore removenode wrote it off
        str(m.get("removed_by", "")),
    )


def _startup_transport(config: NodeConfig, node_id: str) -> HttpTransport:
    """A transport for asking the seeds before the node starts, signed as ``node_id``."""
    tls = client_context(config.tls_ca or None) if config.tls_cert else None
    access = Access(node_id, config.cluster_secret_file or None, config.auth_file or None)
    return access.transport(5.0, tls)  # believes only proven answers (with the secret)


async def _seeds_view(transport: Transport, seeds: Sequence[str], why: str) -> RingView | None:
    """The ring as the first seed that answers sees it (None: no seed answered). Raises
    ValueError when none did and a seed answered without proof of being a ring node (with
    the secret on): not a node of this ring, or one with another secret."""
    unproven: list[str] = []
    for seed in seeds:
        try:
            answer = (await transport.request("GET", seed, "/v1/ring", timeout=5.0)).json()
            return RingView.from_json(answer)
        except UnprovenAnswer as exc:
            unproven.append(f"{seed} ({exc})")
        except (StateStoreError, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: seed %s gave no ring view: %s", why, seed, exc)
    if unproven:
        raise ValueError(
            f"cannot {why}: no seed proved it is a node of this ring: {'; '.join(unproven)}; "
            "check --seeds and that every node has the same --cluster-secret-file"
        )
    return None


async def check_join(config: NodeConfig) -> None:
    """A new node joining (``--join``, or ``--replace``): refused while a member moves tokens.

    ``statestore rebalance`` moves one node's tokens at a time so that the ring before the
    move and the ring after it differ by that change only; a node that joined meanwhile
    would pull what it owns on a ring that is neither, and a move that saw it join would
    push to it. The token mover refuses to start while a member joins (``RingView.busy``);
    this is the other side. Raises ValueError naming the mover. A node that was joining or
    is normal per its data dir is not asked (a join it resumes waits in :func:`join_loop`
    while a member moves tokens); a decommissioned one that joins again is. No seed
    answering is left to the join itself (it waits on gossip)."""
    kept = stored_ring_state(config.data_dir)
    if stored_identity(config.data_dir) is not None and kept != NodeState.LEFT:
        return
    transport = _startup_transport(config, config.replace or "joining")
    await transport.start()
    try:
        view = await _seeds_view(transport, config.seeds, "join")
    finally:
        await transport.close()
    movers = [] if view is None else view.moving_tokens()
    if movers:
        raise ValueError(
            f"cannot join the ring now: member {movers[0]} is moving tokens (statestore "
            "rebalance), one move at a time; start this node again when `statestore ring` "
            "shows no token move"
        )


async def _replace_verdict(
    transport: Transport, config: NodeConfig, target: str
) -> tuple[str | None, int, dict[str, Sighting | None]]:
    """Asks the seeds and the members they know how they see ``target`` (``POST
    /v1/handover/items``, ``limit`` 0) and decides with ``core/handover.replace_plan``:
    ``(why not, incarnation, sightings)``."""
    addresses = list(config.seeds)
    view = await _seeds_view(transport, config.seeds, "replace")
    if view is not None:  # every member a seed knows, so no single view decides
        addresses += [m.address for m in view.members if m.id != target and m.status != "down"]
    sightings: dict[str, Sighting | None] = {}
    for address in dict.fromkeys(addresses):
        try:
            sightings[address] = await _sighting(transport, address, target)
        except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("replace: %s did not say how it sees %s: %s", address, target, exc)
    why, incarnation = replace_plan(target, config.zone, sightings, len(set(addresses)))
    return why, incarnation, sightings


async def check_replace(config: NodeConfig) -> int | None:
    """``statestore node --replace ID``: the incarnation to take ID's place at, or None when
    the data dir already holds ID (a replacement restarted: it resumes like ``--join``).

    Decides from how the seeds and the members they know see ID (:func:`_replace_verdict`);
    raises ValueError saying why not (ID alive, unknown, owning nothing, another zone,
    nobody answered), or when the data dir holds another node."""
    target = config.replace
    held = stored_identity(config.data_dir)
    if held == target:
        return None
    if held is not None:
        raise ValueError(
            f"--replace {target}: the data dir {config.data_dir} holds node {held}; a "
            "replacement starts with an empty --data-dir"
        )
    transport = _startup_transport(config, target)
    await transport.start()
    try:
        why, incarnation, _ = await _replace_verdict(transport, config, target)
    finally:
        await transport.close()
    if why is not None:
        raise ValueError(f"cannot replace node {target}: {why}")
    log.warning("replacing dead node %s at incarnation %d", target, incarnation)
    return incarnation


async def check_returning(
    config: NodeConfig,
    transport: Transport | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> tuple[str, int] | None:
    """A node started on an empty data dir, without ``--join`` or ``--replace``, at an
    address the ring knows as member X's: a wiped or swapped disk coming back under the same
    command line. It takes X's place as ``--replace X`` would (X's id, so X's tokens; it
    streams X's share as ``joining`` before it serves). Started as a new member instead, it
    would own X's ranges at once with nothing in them and leave X's copies unreplaced, and a
    read answered by it and another new owner could miss an acknowledged version (the
    simulator's seed 250014316491786, docs/reliability.md).

    Waits while the ring does not call X down yet (a quick restart: X's old process cannot
    answer for X any more, so the failure detector will), up to ``6 x --down-after`` plus
    30 s, then raises ValueError. Returns ``(id, incarnation)`` to adopt, or None: not a
    returning node (a data dir that holds an id, a port the OS picks, no seed answered, no
    member at this address, or X may not be replaced: removed, joining or left when it
    died, another zone), and the node starts as before. ``transport``: the simulator's
    (default: HTTP, signed as the node to be)."""
    address = config.advertise or (f"{config.host}:{config.port}" if config.port else "")
    if stored_identity(config.data_dir) is not None or config.join or config.replace:
        return None
    if not address or not config.seeds:
        return None
    own = transport is None
    transport = transport or _startup_transport(config, "returning")
    if own:
        await transport.start()
    try:
        deadline = 6 * config.down_after + 30.0
        waited = 0.0
        while True:
            view = await _seeds_view(transport, config.seeds, "start")
            if view is None:
                return None
            former = [m for m in view.members if is_self_alias(m.address, address)]
            if not former:
                return None
            # several ids at one address (an older wipe): the one owning ranges first
            target = min(former, key=lambda m: (m.state not in ("normal", "leaving"), m.id)).id
            why, incarnation, sightings = await _replace_verdict(transport, config, target)
            if why is None:
                log.warning(
                    "the data dir %s is empty and the ring knows node %s at %s: this node "
                    "takes its place (as --replace %s) at incarnation %d and streams its "
                    "share before it serves",
                    config.data_dir,
                    target,
                    address,
                    target,
                    incarnation,
                )
                return target, incarnation
            seen = [s for s in sightings.values() if s is not None]
            alive = [s for s in seen if s.status != "down" and not s.removal]
            if not alive:  # removed, owned nothing, another zone: a new member, as before
                log.warning("starting as a new member at %s: %s", address, why)
                return None
            if waited >= deadline:
                raise ValueError(
                    f"the data dir {config.data_dir} is empty and the ring knows node "
                    f"{target} at {address}, not yet down after {waited:.0f} s: {why}"
                )
            log.info("waiting for the ring to call node %s at %s down: %s", target, address, why)
            step = max(config.down_after / 2, 0.5)
            await sleep(step)
            waited += step
    finally:
        if own:
            await transport.close()


# -- leave -----------------------------------------------------------------------------


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
    started = node.clock()
    view = node.view()
    me = node.address
    # every item's future owners, off the loop (a scan of everything held): clients go on
    targets, want = await asyncio.to_thread(_leave_listing, node, view)
    answers = await ask_have(node, want, view)
    pushes, unanswered = await asyncio.to_thread(push_plan, me, targets, answers)
    unseen = 0
    for _, address in _peers(node):
        try:
            if not seen(await _how_seen(node, address, 3.0)):
                unseen += 1
        except (StateStoreError, ValueError, AttributeError):
            unseen += 1
    move.span(f"{label} list", started, node.clock())
    started = node.clock()
    move.round_total, move.round_done = len(pushes), 0

    async def push(i: int) -> int | None:
        return await push_item(node, pushes[i].target, pushes[i].item)

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


async def leave_handler(request: web.Request) -> web.Response:
    """``POST /v1/handover/leave``: decommission this node (202; progress at
    ``GET /v1/handover``)."""
    node = request.app[NODE]
    allow_ring(request)
    move = start_leave(node)
    return web.json_response(move.to_json(node.clock()), status=202)


def move_json(node: Node) -> dict[str, Any]:
    """This node's ring state, its move (null when it never moved), and how many copies
    waited for its clients' requests so far (``yielded``, node/foreground.py)."""
    state = node.membership.state.value if node.membership is not None else "normal"
    move = None if node.move is None else node.move.to_json(node.clock())
    return {
        "id": node.id,
        "address": node.address,
        "state": state,
        "move": move,
        "yielded": node.foreground.yielded,
    }


async def progress(request: web.Request) -> web.Response:
    """``GET /v1/handover``: this node's ring state and the progress of its move."""
    node = request.app[NODE]
    allow(request, "read")
    return web.json_response(move_json(node))


def register(app: web.Application) -> None:
    app.router.add_post("/v1/handover/items", handover_items)
    app.router.add_post("/v1/handover/leave", leave_handler)
    app.router.add_get("/v1/handover", progress)
