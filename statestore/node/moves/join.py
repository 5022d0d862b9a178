"""Join (``statestore node --join``, and a replacement's streaming): the node gossips
``joining``, so writes already reach it while reads still go to the current owners. In
rounds, it asks every live member which of the items it holds the joining node will own
(``POST /v1/handover/items``, paged, node/moves/routes.py), fetches what it lacks (each item
from the source rendezvous hashing names, failing over to the others that listed it) under
the ``--stream-mbps`` budget, and checks. The first round in which every source answered,
nothing was missing and every source already routes writes to it verifies the copy; the node
then gossips ``normal``. Old owners drop what they no longer own through repair, which keeps
a copy until every new owner confirmed it.

A source that dies mid-round costs another round, not the move; a joining node that dies is
declared down and drops out of both rings (writes go to the old owners alone). A token move
that gains tokens runs the same rounds (node/moves/rebalance.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from statestore.core.errors import CorruptChunk, MalformedData, QueryDropping, StateStoreError
from statestore.core.handover import Handover, NodeState, Phase, RoundResult, pull_plan
from statestore.core.ids import StoreId, parse_chunk_key
from statestore.core.items import ChunkItem, ManifestItem
from statestore.core.items import parse as parse_item
from statestore.node.daemon import MoveStatus, Node
from statestore.node.moves.copies import Unsupported, fetch_manifests
from statestore.node.moves.rounds import Seen, copy_round, pause, peers, spread
from statestore.node.tombstones import copy_mark
from statestore.wire.manifest import decode_manifest

__all__ = ["PAGE", "join_loop", "join_round", "sees_joining"]

log = logging.getLogger(__name__)
PAGE = 5000  # items per listing page


def sees_joining(answer: dict[str, Any]) -> bool:
    """Whether a source routes writes to us as a joining node."""
    return bool(answer.get("state") == NodeState.JOINING)


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
    """The listed items we hold already, or do not want: a manifest or chunk below our
    retention floor (a source whose floor is lower still lists it; a copy of a manifest
    there is not kept, so fetching it again every round never ended the join, a hot loop the
    simulator found; a chunk there would be an orphan until the next gc), or of a snapshot
    our thinning drops (likewise; a folded snapshot's manifest once offered: one round
    fetches it, so that a whole one is kept). A name that is no item's is not held: its
    fetch fails (MalformedData), and the round with it."""
    chunks: list[tuple[str, str]] = []
    out: set[str] = set()
    floors: dict[StoreId, int] = {}
    for name in sorted(items):
        try:
            it = parse_item(name)
        except MalformedData:
            continue
        store, version = _store_version(it)
        if store not in floors:
            floors[store] = node.store.floor(store)
        if version < floors[store]:
            out.add(name)  # below our floor: not wanted
        elif _thinned(node, it, store, version, name):
            out.add(name)  # a snapshot our thinning dropped: not kept, so not wanted
        elif isinstance(it, ChunkItem):
            chunks.append((name, it.key))
        elif node.store.raw_manifest(it.store, it.version, it.kind, it.epoch) is not None:
            out.add(name)
    flags = node.store.has_chunks([key for _, key in chunks])
    out.update(name for (name, _), has in zip(chunks, flags, strict=True) if has)
    return out


def _thinned(
    node: Node, it: ChunkItem | ManifestItem, store: StoreId, version: int, name: str
) -> bool:
    """Whether ``it`` is of a snapshot this node's thinning drops (core/retention.Thinning):
    a folded snapshot's manifest, which no path stores here, once a copy of it was offered
    and refused (its name does not say whether it is folded or whole, and a whole one is
    kept: core/manifest.Manifest.whole), or its chunk (an ``s`` one, past the chunks'
    line)."""
    if isinstance(it, ManifestItem):
        thinned = it.kind == "snapshot" and node.store.thinned(store, version)
        return thinned and name in node.store.thinned_offers
    name = parse_chunk_key(it.key)[2]
    line = node.store.thinning(store)
    return name.startswith("s") and line.drops_chunks(version, node.store.floor(store))


def _store_version(it: ChunkItem | ManifestItem) -> tuple[StoreId, int]:
    if isinstance(it, ChunkItem):
        store, version, _ = parse_chunk_key(it.key)
        return store, version
    return it.store, it.version


async def _fetch(node: Node, source: str, item: str) -> int:
    """Copy ``item`` from ``source`` into our store; returns its bytes. Raises
    StateStoreError (CorruptChunk when the bytes fail their checksum) when it did not land."""
    it = parse_item(item)  # a name from a source's listing
    store, _ = _store_version(it)
    mark = copy_mark(node, store.query)  # a drop meanwhile: what it deleted stays deleted
    if isinstance(it, ChunkItem):
        # ?copy=1: the source serves it after its clients' requests (node/foreground.py)
        resp = await node.transport.request("GET", source, f"/v1/chunks/{it.key}?copy=1")
        await node.write(node.store.put_chunk_copy, it.key, resp.body, mark, order="copy")
        return len(resp.body)
    path = f"/v1/manifests/{it.store.path}/{it.version}/{it.kind}?epoch={it.epoch}&copy=1"
    resp = await node.transport.request("GET", source, path)
    m = decode_manifest(resp.body)
    if ManifestItem.of(m) != it:
        raise CorruptChunk(f"{source} answered manifest {item} with another one")
    # every epoch held is kept, replaced ones as side keys (core/manifest.py, "Lineage");
    # one below the floor or of a query dropped meanwhile is not
    await node.write(node.store.copy_pulled, [m], {store.query: mark}, order="copy")
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
    for _, address in peers(node):
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

    dropping: set[str] = set()

    async def fetch(i: int, skip: str = "") -> int | None:
        for source in pulls[i].sources:
            if source == skip:
                continue
            try:
                return await _fetch(node, source, pulls[i].item)
            except QueryDropping as exc:  # a drop that never sealed holds it: said once a round
                if str(exc) not in dropping:
                    dropping.add(str(exc))
                    log.warning("join: %s (run `statestore drop` again to finish it)", exc)
                return None
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
