"""Re-replication, hinted handoff and anti-entropy in one loop.

Every node walks what it holds: for each chunk and manifest it computes the replicas at the
current epoch, asks each of them in one batched ``/v1/sync/have`` call which items they lack,
and pushes those (chunks one at a time, then manifests in batches per target,
node/copies.py). An item this node holds but no longer owns (the ring moved: a node joined,
or came back after its writes were handed to us) is deleted locally only once every current
replica has confirmed it, and only when the epoch has not moved since the previous pass, so a
half-formed view never costs a copy. A pass runs when who owns what changes
(``RingView.placement``: not for a member that only starts joining or leaving, whose copies
the hand-over moves), while handoffs are pending, and every ``full_every`` seconds as a
safety net on a per-node grid. When a pass is due and how it runs is the pure
``core/repair_clock.RepairClock`` (DESIGN.md, Write path).

A pass walks everything held, on every node at once when ownership changes. At 1 GiB it
was most of the CPU in a decommission's first seconds, when it ran for the ``leaving``
state too, and clients' requests waited behind it (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from statestore.core.errors import CorruptChunk, StaleEpoch, StateStoreError, VersionConflict
from statestore.core.handover import NodeState
from statestore.core.ids import StoreId
from statestore.core.repair import Holding, decide
from statestore.core.repair_clock import RepairClock, phase_of
from statestore.core.view import RingView
from statestore.node.copies import Unsupported, push_manifests
from statestore.node.daemon import Node
from statestore.node.digests import narrow

__all__ = ["ask_have", "push_item", "repair_loop", "repair_pass"]

log = logging.getLogger(__name__)
BATCH = 1000
# An item is "c:<chunk key>" or "m:<store path>/<version>/<kind>/<epoch>" (core/repair.Holding):
# every epoch of a version a replica keeps is an item of its own, so a manifest that a higher
# epoch replaced here is copied to the owners that lack it too (core/manifest.py, "Lineage").


async def push_item(node: Node, address: str, item: str) -> int | None:
    """Copy one item we hold to ``address``; returns the bytes sent, None if it did not land
    (or we lack it)."""
    kind, key = item[0], item[2:]
    try:
        if kind == "c":
            data = node.store.get_chunk(key)
            if data is None:
                return None
            # a copy: never refused by the target's quota (node/quotas.py)
            await node.transport.request("PUT", address, f"/v1/chunks/{key}?copy=1", body=data)
            return len(data)
        else:
            path, version, mkind, epoch = key.rsplit("/", 3)
            raw = node.store.raw_manifest(StoreId.parse(path), int(version), mkind, int(epoch))
            if raw is None:
                return None
            try:  # a copy, kept at any epoch (a node that predates copies fences it)
                await node.transport.request(
                    "PUT",
                    address,
                    f"/v1/manifests/{path}/{version}/{mkind}?copy=1",
                    body=raw,
                    headers={"Content-Type": "application/msgpack"},
                )
            except (StaleEpoch, VersionConflict):
                pass  # an older target holds a newer manifest and refused ours: fine there
            return len(raw)
    except CorruptChunk:
        node.store.delete_chunks([key])  # our copy rotted: drop it, a replica will push back
        return None
    except StateStoreError as exc:
        log.debug("push of %s to %s failed: %s", key, address, exc)
        return None


async def ask_have(
    node: Node, want: dict[str, list[str]], view: RingView | None = None
) -> dict[tuple[str, str], bool]:
    """Ask each target (batched ``/v1/sync/have``) whether it holds the items listed for it;
    returns ``(target, item) -> holds it`` for every answered question (a target or batch
    that failed is simply absent). Floors in the answers are applied here: a GC we missed.
    With ``view``, token ranges are compared by digest first (node/digests.py) and only the
    items of ranges that differ are listed."""
    answers: dict[tuple[str, str], bool] = {}
    if view is not None:
        answers, want = await narrow(node, view, want)
    for address, items in want.items():
        for i in range(0, len(items), BATCH):
            batch = items[i : i + BATCH]
            exact = [it[2:].rsplit("/", 3) for it in batch if it[0] == "m"]
            body = {
                "chunks": [it[2:] for it in batch if it[0] == "c"],
                # by version and kind for nodes that predate epochs, and by epoch too
                "manifests": [[p, v, k] for p, v, k, _ in exact],
                "epochs": [[p, int(v), k, int(e)] for p, v, k, e in exact],
            }
            try:
                resp = await node.transport.request(
                    "POST", address, "/v1/sync/have", json_body=body
                )
            except StateStoreError:
                continue
            node.stats["have_asked"] += len(batch)  # items listed to a peer that answered
            answer = resp.json()
            for path, floor in answer.get("floors", {}).items():
                store = StoreId.parse(path)
                if int(floor) > node.store.floor(store):  # a GC we missed while down
                    await node.write(node.store.apply_floor, store, int(floor))
            flags = iter(answer["chunks"]), iter(answer.get("epochs", answer["manifests"]))
            for it in batch:
                answers[(address, it)] = bool(next(flags[0] if it[0] == "c" else flags[1]))
    return answers


def _holdings(
    node: Node, view: RingView, planned: bool
) -> tuple[list[Holding], dict[str, list[str]]]:
    """Every item this node holds with its owners (and, ``planned``, its previous owners;
    while a member moves, its pending ones), and the items to ask each other owner about."""
    me = node.address

    def previous(key: str) -> tuple[str, ...]:
        # only a planned pass consults them: spare the placement walk otherwise
        return tuple(view.previous_replicas(key)) if planned else ()

    def pending(key: str, owners: tuple[str, ...]) -> tuple[str, ...]:
        # pending owners keep their copies; pushes to them are the hand-over's, not ours
        if not view.moving:
            return ()
        return tuple(a for a in view.future_replicas_of(key) if a not in owners)

    holdings: list[Holding] = []
    hinted = node.store.hinted_chunks()  # a tentative commit's: its hand-off moves them
    for key in node.store.chunk_keys():
        if key in hinted:
            continue
        owners = tuple(view.replicas_of(key))
        holdings.append(Holding(f"c:{key}", key, owners, previous(key), pending(key, owners)))
    for store, version, kind, epoch in node.store.manifest_items():
        owners = tuple(view.store_replicas(store))
        item = f"m:{store.path}/{version}/{kind}/{epoch}"
        holdings.append(
            Holding(item, store.path, owners, previous(store.path), pending(store.path, owners))
        )
    want: dict[str, list[str]] = defaultdict(list)
    for h in holdings:
        for t in h.owners:
            if t != me:
                want[t].append(h.item)
    return holdings, want


async def repair_pass(
    node: Node, view: RingView, *, allow_handoff: bool, planned: bool = False
) -> int:
    """One pass; returns how many items still wait to be handed off (or to be copied).

    ``planned``: the passes within a grace period after the epoch moved leave each copy to
    its designated source; the passes after it (while anything is pending) push from every
    holder, so a designated source that failed is covered. What to push and what to drop is
    :func:`statestore.core.repair.decide`; this asks, pushes and drops.
    """
    me = node.address
    live = set(view.live_addresses())
    # a scan of everything held: in a worker thread, so clients' requests go on meanwhile
    holdings, want = await asyncio.to_thread(_holdings, node, view, planned)
    answers = await ask_have(node, want, view)
    decision = await asyncio.to_thread(
        decide, me, holdings, live, answers, epoch_moved=not allow_handoff, planned=planned
    )
    failed: list[tuple[str, str]] = []
    manifests: dict[str, list[str]] = defaultdict(list)  # by target: sent in batches
    for push in decision.pushes:
        if push.item[0] == "m":
            manifests[push.target].append(push.item)
        elif await push_item(node, push.target, push.item) is not None:
            node.stats["repaired"] += 1
        else:
            failed.append((push.target, push.item))
    for target, items in manifests.items():  # after the chunks they name
        try:
            sizes = await push_manifests(node, target, items)
        except Unsupported:  # a target that predates batches: one at a time
            sizes = [await push_item(node, target, item) for item in items]
        for item, size in zip(items, sizes, strict=True):
            if size is not None:
                node.stats["repaired"] += 1
            else:
                failed.append((target, item))
    if failed:
        decision = decide(
            me,
            holdings,
            live,
            answers,
            epoch_moved=not allow_handoff,
            planned=planned,
            failed=failed,
        )
    for item in decision.drops:
        if item[0] == "c":
            await node.write(node.store.delete_chunks, [item[2:]])
        else:
            path, ver, kind, held = item[2:].rsplit("/", 3)
            await node.write(
                node.store.delete_manifest, StoreId.parse(path), int(ver), kind, int(held)
            )
        node.stats["handed_off"] += 1
    return decision.outstanding


async def repair_loop(node: Node, full_every: float = 30.0) -> None:
    # Each node declares a death on its own clock, up to a failure-detector period apart, so
    # a designated source may run its planned pass well after its peers. Until every live node
    # has had that long (plus two passes), the others leave its copies to it; after that they
    # cover for it, in case it failed.
    grace = node.config.down_after + 2 * node.config.repair_interval
    clock = RepairClock(full_every, grace, phase=phase_of(node.id, full_every))
    # let gossip settle before the first pass, so a fresh node does not judge a partial view
    await asyncio.sleep(node.config.down_after)
    while True:
        view = node.view()
        now = node.clock()
        joining = node.membership is not None and node.membership.state is NodeState.JOINING
        plan = (
            clock.due(
                view.epoch,
                view.placement(),
                now,
                moving=view.moving,
                joining=joining,
                left_only=view.only_left_since(clock.placement),
            )
            if len(view.ring)
            else None
        )
        if plan is not None:
            pending = None
            try:
                pending = await repair_pass(
                    node, view, allow_handoff=plan.allow_handoff, planned=plan.planned
                )
                node.stats["repair_backlog"] = pending  # /metrics, /v1/activity
            except StateStoreError as exc:
                log.warning("repair pass failed: %s", exc)
            clock.ran(view.epoch, view.placement(), now, pending)
        await asyncio.sleep(node.config.repair_interval)
