"""Re-replication, hinted handoff and anti-entropy in one loop.

Every node walks what it holds: for each chunk and manifest it computes the replicas at the
current epoch, asks each of them in one batched ``/v1/sync/have`` call which items they lack,
and pushes those (chunks one at a time, then manifests in batches per target,
node/moves/copies.py). An item this node holds but no longer owns (the ring moved: a node
joined, or came back after its writes were handed to us) is deleted locally only once every
current replica has confirmed it, and only when the epoch has not moved since the previous
pass, so a half-formed view never costs a copy. A pass runs when who owns what changes
(``RingView.placement``: not for a member that only starts joining or leaving, whose copies
the hand-over moves), while handoffs are pending, and every ``full_every`` seconds as a
safety net on a per-node grid. When a pass is due and how it runs is the pure
``core/repair_clock.RepairClock`` (docs/design.md, Repair).

A pass walks everything held, on every node at once when ownership changes. At 1 GiB it
was most of the CPU in a decommission's first seconds, when it ran for the ``leaving``
state too, and clients' requests waited behind it (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from statestore.core.chunk import verify
from statestore.core.errors import (
    CorruptChunk,
    InvalidRequest,
    StaleEpoch,
    StateStoreError,
    VersionConflict,
)
from statestore.core.handover import NodeState
from statestore.core.ids import MAX_VERSION, StoreId, chunk_key, parse_chunk_key
from statestore.core.items import ChunkItem, Item, ManifestItem, is_manifest, parse_manifest
from statestore.core.items import parse as parse_item
from statestore.core.manifest import Manifest
from statestore.core.repair import Holding, acknowledged, content_digest, decide
from statestore.core.repair_clock import RepairClock, phase_of
from statestore.core.retention import MAX_RETAIN, Thinning
from statestore.core.retention import check_floor as floor_allowed
from statestore.core.view import RingView
from statestore.net.reads import read_head
from statestore.node.daemon import Node
from statestore.node.digests import narrow
from statestore.node.moves.copies import Unsupported, push_manifests
from statestore.node.tombstones import DropMarks, copy_mark
from statestore.wire.manifest import decode_manifest

__all__ = [
    "ask_have",
    "ask_owners",
    "check_floor",
    "check_thinning",
    "push_item",
    "raise_floor",
    "repair_loop",
    "repair_pass",
]

log = logging.getLogger(__name__)
BATCH = 1000
RECONCILE_BUDGET = 64  # same-epoch divergences a pass reconciles (reconcile)
CATCH_UP_EVERY = 5  # repair ticks between passes a caught-up store sets off (repair_loop)
# Items are named as core/items.py names them (core/repair.Holding carries the names): every
# epoch of a version a replica keeps is an item of its own, so a manifest that a higher epoch
# replaced here is copied to the owners that lack it too (core/manifest.py, "Lineage").


async def push_item(node: Node, address: str, item: str, *, handoff: bool = False) -> int | None:
    """Copy one item we hold to ``address``; returns the bytes sent, None if it did not land
    (or we lack it). ``handoff``: we do not own the item, so ``address`` charges it to its
    quota (node/quotas.py); a copy between owners never is."""
    copy = "copy=1&handoff=1" if handoff else "copy=1"
    try:
        it = parse_item(item)
        if isinstance(it, ChunkItem):
            return await _push_chunk(node, address, it.key, copy)
        return await _push_manifest(node, address, it, copy)
    except StateStoreError as exc:
        log.debug("push of %s to %s failed: %s", item, address, exc)
        return None


async def _push_chunk(node: Node, address: str, key: str, copy: str) -> int | None:
    query = parse_chunk_key(key)[0].query
    marks = DropMarks(node)
    marks.read(query)  # before the data: a copy read before a drop is refused after it
    try:
        data = node.store.get_chunk(key)
        if data is None:
            return None
        await node.transport.request(
            "PUT", address, f"/v1/chunks/{key}?{copy}", body=data, headers=marks.headers([query])
        )
        return len(data)
    except CorruptChunk:
        node.store.delete_chunks([key])  # our copy rotted: drop it, a replica will push back
        return None


async def _push_manifest(node: Node, address: str, it: ManifestItem, copy: str) -> int | None:
    marks = DropMarks(node)
    marks.read(it.store.query)  # before the manifest, as for a chunk
    raw = node.store.raw_manifest(it.store, it.version, it.kind, it.epoch)
    if raw is None:
        return None
    try:  # a copy, kept at any epoch (a node that predates copies fences it)
        await node.transport.request(
            "PUT",
            address,
            f"/v1/manifests/{it.store.path}/{it.version}/{it.kind}?{copy}",
            body=raw,
            headers={"Content-Type": "application/msgpack"} | marks.headers([it.store.query]),
        )
    except (StaleEpoch, VersionConflict):
        pass  # an older target holds a newer manifest and refused ours: fine there
    return len(raw)


async def ask_have(
    node: Node,
    want: dict[str, list[str]],
    view: RingView | None = None,
    digests: Mapping[str, int] | None = None,
    differ: set[tuple[str, str]] | None = None,
) -> dict[tuple[str, str], bool]:
    """Ask each target (batched ``/v1/sync/have``) whether it holds the items listed for it;
    returns ``(target, item) -> holds it`` for every answered question (a target or batch
    that failed is simply absent). Floors in the answers are applied here: a GC we missed.
    With ``view``, token ranges are compared by digest first (node/digests.py) and only the
    items of ranges that differ are listed. With ``digests`` (a manifest item's content
    digest), the ``(target, item)`` pairs where the target holds that version and epoch with
    other content are added to ``differ``."""
    answers: dict[tuple[str, str], bool] = {}
    if view is not None:
        answers, want = await narrow(node, view, want)
    for address, items in want.items():
        for i in range(0, len(items), BATCH):
            batch = items[i : i + BATCH]
            parsed = [parse_item(it) for it in batch]
            exact = [it for it in parsed if isinstance(it, ManifestItem)]
            body: dict[str, Any] = {
                "chunks": [it.key for it in parsed if isinstance(it, ChunkItem)],
                # by version and kind for nodes that predate epochs (the version in digits,
                # as it was read from the name), and by epoch too
                "manifests": [[m.store.path, str(m.version), m.kind] for m in exact],
                "epochs": [[m.store.path, m.version, m.kind, m.epoch] for m in exact],
            }
            if digests is not None:
                body["digests"] = [digests.get(it, 0) for it in batch if is_manifest(it)]
            retains = _retains(node, parsed)
            if retains:  # the writers' retain=N, for a target that missed their commits
                body["retains"] = retains
            try:
                resp = await node.transport.request(  # floors and drops follow: proven
                    "POST",
                    address,
                    "/v1/sync/have",
                    json_body=body,
                    headers=node.access.prove_headers(),
                )
            except StateStoreError:
                continue
            node.stats["have_asked"] += len(batch)  # items listed to a peer that answered
            answer = resp.json()
            # the writers' retain first: the floors are checked against it
            await _adopt_retains(node, parsed, answer.get("retains"))
            await _apply_floors(node, address, parsed, answer.get("floors"))
            await _apply_thinning(node, address, parsed, answer.get("thinning"))
            flags = iter(answer["chunks"]), iter(answer.get("epochs", answer["manifests"]))
            for it, p in zip(batch, parsed, strict=True):
                flag = flags[0] if isinstance(p, ChunkItem) else flags[1]
                answers[(address, it)] = bool(next(flag))
            if differ is not None and "differ" in answer:
                ms = [it for it in batch if is_manifest(it)]
                differ.update(
                    (address, it) for it, d in zip(ms, answer["differ"], strict=False) if d
                )
    return answers


async def _adopt_retains(node: Node, batch: list[Item], retains: object) -> None:
    """Take the writer-set ``retain`` a peer's ``sync/have`` answer gives, of stores the batch
    named, where it makes the store keep more (NodeStore.retains_to_adopt); anything else
    is ignored."""
    if not isinstance(retains, dict) or not retains:
        return
    asked = {it.store.path: it.store for it in batch}
    offered = {
        asked[path]: n
        for path, n in retains.items()
        if path in asked and type(n) is int and 1 <= n <= MAX_RETAIN
    }
    default = node.config.retain_versions
    if node.store.retains_to_adopt(offered, default):  # seldom: a write only then
        await node.write(node.store.adopt_retains, offered, default, order="copy")


async def ask_owners(node: Node, view: RingView, stores: Iterable[StoreId]) -> set[StoreId]:
    """Ask the other live owners (replicas and home replicas) of each of ``stores`` about its
    head's item, in one batched ``sync/have`` per owner: its answers carry the store's
    thinning line and writer-set ``retain``, which :func:`ask_have` takes (a store with no
    head here is left out: nothing of it is refused or folded). :func:`recover_lines` asks
    for lost lines; the compaction loop asks once about each store it leads with no
    ``retain`` held (one that joined, or missed the writer's commits, would otherwise fold
    and raise the floor by ``--retain``). Returns the stores settled: some owner answered
    about it, or there was none to ask."""
    live = set(view.live_addresses())
    want: dict[str, list[str]] = defaultdict(list)
    settled: set[StoreId] = set()
    of: dict[str, StoreId] = {}
    for store in stores:
        head = node.store.head(store)
        others = set(view.store_replicas(store)) | set(view.write_homes(store.path))
        others = others & live - {node.address}
        if head is None or not others:
            settled.add(store)
            continue
        item = ManifestItem(store, head.version, "delta", head.epoch).name()
        of[item] = store
        for a in sorted(others):
            want[a].append(item)
    if want:
        settled.update(of[item] for _, item in await ask_have(node, dict(want)))
    return settled


def _retains(node: Node, items: list[Item]) -> dict[str, int]:
    """The writer-set ``retain`` this node holds of each store ``items`` name (a read per
    store, not per item)."""
    out: dict[str, int] = {}
    for store in {it.store for it in items}:
        n = node.store.retain(store, if_rotted=None)
        if n is not None:
            out[store.path] = n
    return out


async def recover_lines(node: Node, view: RingView) -> None:
    """Ask the other live owners of each store whose thinning line rotted here for theirs
    (its head's item in ``sync/have``, batched by owner: an answer carries the line of each
    store asked about, taken as :func:`_apply_thinning` takes one). The pass's own questions
    may carry no item of the store (its ranges agree by digest), and until the line is back
    this node refuses every snapshot below the head and, as the store's leader, folds only
    its head and draws no line. The scan of the line records (a few bytes a store) runs off
    the event loop."""
    # a store with chunks only here is left out: nothing of it is refused, the next gc
    # gives the line
    await ask_owners(node, view, await asyncio.to_thread(node.store.lost_lines))


async def check_floor(node: Node, store: StoreId, floor: int) -> None:
    """InvalidRequest unless raising ``store``'s floor to ``floor`` here keeps it restorable
    (NodeStore.check_floor): a compactor's ``gc`` and a floor a peer's ``sync/have`` answer
    carries take the same checks, before anything is applied; :func:`raise_floor` takes
    them again where it applies the floor. The head is this node's, else the ring's."""
    if floor <= node.store.floor(store):
        return  # nothing would be dropped
    if node.store.head(store) is None:
        view = node.view()
        head = await read_head(node.transport, view, store)
        floor_allowed(store, floor, head.version, None)
        # a node holding none of the store's manifests (a chunk holder, a hint holder, an
        # owner not repaired yet) cannot tell whether the floor keeps the retained versions
        # restorable (their lineage, the writer's retain): it takes only a floor every home
        # replica took (floors only rise there, so it stays safe when applied later)
        agreed = await _homes_floor(node, view, store)
        if floor > agreed:
            raise InvalidRequest(
                f"gc floor {floor} of {store}: its home replicas keep versions from {agreed}; "
                "this node holds none of its manifests and takes only a floor they took"
            )
        return
    # off the event loop: a snapshot off the head's epoch decodes the store's manifests
    await asyncio.to_thread(node.store.check_floor, store, floor)


async def _homes_floor(node: Node, view: RingView, store: StoreId, mine: bool = True) -> int:
    """The lowest retention floor of ``store`` among its live home replicas (``GET
    .../versions``), with fewer than W of them down (an acknowledged commit is on W homes,
    so on one of those that answer, which refuses a floor that would drop what it needs): 0
    when W or more are down, or one does not answer, holds no version of it or answers no
    version. ``mine``: this node's own floor counts too, where it is a home."""
    homes = view.write_homes(store.path)
    down = [a for a in homes if a.startswith("down:")]
    if len(down) >= view.write_quorum:
        return 0
    live = [a for a in homes if a not in down]
    path = f"/v1/stores/{store.path}/versions"
    got = await asyncio.gather(
        *(node.transport.request("GET", a, path) for a in live if a != node.address),
        return_exceptions=True,
    )
    floors = [node.store.floor(store)] if mine and node.address in live else []
    for r in got:
        if isinstance(r, BaseException):
            if not isinstance(r, StateStoreError):
                raise r
            return 0
        try:
            floor = r.json().get("floor")
        except (StateStoreError, ValueError, AttributeError):
            return 0
        if type(floor) is not int or not 0 <= floor <= MAX_VERSION:
            return 0
        floors.append(floor)
    return min(floors, default=0)


async def raise_floor(node: Node, store: StoreId, floor: int) -> int:
    """Apply ``floor`` to ``store`` here, checked again on the writer thread
    (NodeStore.raise_floor): what landed since :func:`check_floor` (a newer writer's delta
    at the floor) is seen. Returns items dropped; InvalidRequest if refused now."""
    return await node.write(node.store.raise_floor, store, floor)


async def _apply_floors(node: Node, address: str, batch: list[Item], floors: object) -> None:
    """Apply the floors in a peer's ``sync/have`` answer (a GC we missed while down): only
    of stores the batch named, only those :func:`check_floor` allows, and where this node
    holds the store's manifests only a floor every other live home replica took."""
    if not isinstance(floors, dict) or not floors:
        return
    asked = {it.store.path for it in batch}
    for path, floor in floors.items():
        if path not in asked:
            continue  # a floor for a store not asked about: not this answer's to give
        if isinstance(floor, bool) or not isinstance(floor, int) or not 0 < floor <= MAX_VERSION:
            log.warning("%s answered floor %r for %s: not a version", address, floor, path)
            continue
        store = StoreId.parse(path)
        head = node.store.head(store)
        if head is not None and floor > head.version:
            # this node lags (it missed the versions up to the floor): refused below, and
            # asked again by a pass once repair brought its head there (_caught_up)
            # (the lowest such floor: one a peer answered too high hides no lower one)
            node.lagging_floors[path] = min(floor, node.lagging_floors.get(path, floor))
        try:
            await check_floor(node, store, floor)
            if floor > node.store.floor(store) and node.store.head(store) is not None:
                # where it holds the store's manifests, a floor every other live home took
                # (hostile review 72: one holding no writer's retain took a stale leader's
                # floor, which the leader's own compactor had withheld, and passed it on)
                agreed = await _homes_floor(node, node.view(), store, mine=False)
                if floor > agreed:
                    raise InvalidRequest(
                        f"its other home replicas keep {store} from version {agreed}"
                    )
        except StateStoreError as exc:
            log.warning("floor %d of %s from %s not applied: %s", floor, path, address, exc)
            continue
        if floor > node.store.floor(store):
            try:
                await raise_floor(node, store, floor)
            except StateStoreError as exc:
                log.warning("floor %d of %s from %s not applied: %s", floor, path, address, exc)


async def check_thinning(node: Node, store: StoreId, thin: Thinning) -> Thinning:
    """The part of a thinning line from a compactor's ``gc`` or a peer's ``sync/have``
    answer that this node takes: where it is an owner of the store's manifests (a replica,
    or a home replica) and holds them, up to its own newest snapshot (a line above it would
    drop the base the newest reads are served from here); else up to the store's head:
    a chunk holder only drops chunks, and a node that holds manifests it no longer owns (a
    stand-in's, a former owner's, which the owners refuse once thinned, so repair never
    confirms them) serves no read from them, but would name a dropped snapshot again if it
    became an owner once more (a node removed, a token moved)."""
    view = node.view()
    owner = node.address in view.store_write_replicas(store) or node.address in (
        view.write_homes(store.path)
    )
    snaps = node.store.snapshot_versions(store)
    if owner and node.store.head(store) is not None:
        cap = snaps[-1] if snaps else 0
    else:
        cap = (await read_head(node.transport, view, store)).version
    below = min(thin.below, cap)
    return Thinning(below, thin.every, min(thin.chunks, below), thin.floor)


async def _apply_thinning(node: Node, address: str, batch: list[Item], lines: object) -> None:
    """Apply the thinning lines in a peer's ``sync/have`` answer (a ``gc`` we missed while
    down), as :func:`_apply_floors` does floors: only of stores the batch named, and only
    what :func:`check_thinning` takes."""
    if not isinstance(lines, dict) or not lines:
        return
    asked = {it.store.path for it in batch}
    for path, line in lines.items():
        if path not in asked:
            continue
        if (
            not isinstance(line, list)
            or len(line) != 4
            or not all(type(x) is int and 0 <= x <= MAX_VERSION for x in line)
            or not line[1]
        ):
            log.warning("%s answered thinning %r for %s: not four versions", address, line, path)
            continue
        store = StoreId.parse(path)
        held = node.store.thinning(store)
        if line[0] <= held.below and line[2] <= held.chunks and line[3] <= held.floor:
            continue  # nothing would rise: no head read, no scan
        try:
            thin = await check_thinning(node, store, Thinning(*line))
        except StateStoreError as exc:
            log.warning("thinning %r of %s from %s not applied: %s", line, path, address, exc)
            continue
        if thin.below > held.below or thin.chunks > held.chunks or thin.floor > held.floor:
            await node.write(node.store.apply_thinning, store, thin)


def _digest(m: Manifest) -> int:
    return content_digest(m.kind, [c.checksum for c in m.chunks])


async def reconcile(node: Node, view: RingView, item: str, mine: int) -> bool:
    """Two owners hold one version, kind and epoch with different content (a partial write
    of an attempt its writer gave up, or a hint that raced the retry): make this node's copy
    the content W owners hold (core/repair.acknowledged), its chunks first. Each node fixes
    only its own copy, so no node is told by another what to overwrite. True when it did;
    False when it holds the acknowledged content already, or none is at W yet."""
    store, v, kind, e = parse_manifest(item)
    path = store.path
    owners = view.store_replicas(store)
    mark = copy_mark(node, store.query)  # a drop meanwhile: its chunks are not brought back
    got: dict[str, Manifest] = {}
    for a in owners:
        if a == node.address:
            continue
        try:
            resp = await node.transport.request(
                "GET", a, f"/v1/manifests/{path}/{v}/{kind}?epoch={e}"
            )
            m = decode_manifest(resp.body)
        except StateStoreError:
            continue
        if (m.store, m.version, m.kind, m.epoch) == (store, v, kind, e):
            got[a] = m
    held: list[int | None] = [_digest(m) for m in got.values()]
    if node.address in owners:
        held.append(mine)
    winner = acknowledged(held, view.write_quorum)
    if winner is None or winner == mine:
        return False
    sources = [a for a, m in got.items() if _digest(m) == winner]
    m = got[sources[0]]
    keys = [chunk_key(store, v, ref.name) for ref in m.chunks]
    for ref, key, has in zip(m.chunks, keys, node.store.has_chunks(keys), strict=True):
        if has:
            continue
        for a in sources:
            try:
                data = (await node.transport.request("GET", a, f"/v1/chunks/{key}")).body
                verify(data, ref.checksum, key)
            except StateStoreError:
                continue
            if not await node.write(node.store.put_chunk_copy, key, data, mark):
                return False  # dropped (or past retention) meanwhile
            break
        else:
            return False  # its chunks are not readable yet: next pass
    replaced: bool = await node.write(node.store.replace_manifest, m, mine)
    if replaced:
        log.warning(
            "%s v%d %s epoch %d: this node held other content than the %d owners that hold "
            "the acknowledged one; replaced",
            store,
            v,
            kind,
            e,
            len(sources),
        )
        node.stats["reconciled"] = node.stats.get("reconciled", 0) + 1
    return replaced


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
        name = ChunkItem(key).name()
        holdings.append(Holding(name, key, owners, previous(key), pending(key, owners)))
    for it in node.store.manifest_items():
        owners = tuple(view.store_replicas(it.store))
        key = it.placement_key
        holdings.append(Holding(it.name(), key, owners, previous(key), pending(key, owners)))
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
    digests = await asyncio.to_thread(node.store.manifest_digests)
    differ: set[tuple[str, str]] = set()
    answers = await ask_have(node, want, view, digests, differ)
    await recover_lines(node, view)
    # one version and epoch held with different content: reconciled to the content W owners
    # hold, never pushed meanwhile (a copy would spread the one that is not acknowledged)
    divergent = sorted({item for _, item in differ})
    if divergent:
        node.stats["divergent"] = node.stats.get("divergent", 0) + len(divergent)
    differ_items = set(divergent)
    for item in divergent[:RECONCILE_BUDGET]:
        try:
            await reconcile(node, view, item, digests[item])
        except StateStoreError as exc:
            log.warning("reconciling %s failed: %s", item, exc)
    decision = await asyncio.to_thread(
        decide, me, holdings, live, answers, epoch_moved=not allow_handoff, planned=planned
    )
    failed: list[tuple[str, str]] = []
    # an item we do not own is handed off: the target charges it to its quota (node/quotas)
    owned = {h.item for h in holdings if me in h.owners}
    # by target, and whether handed off: sent in batches
    manifests: dict[tuple[str, bool], list[str]] = defaultdict(list)
    for push in decision.pushes:
        handoff = push.item not in owned
        if push.item in differ_items:
            failed.append((push.target, push.item))  # until reconciled
        elif is_manifest(push.item):
            manifests[(push.target, handoff)].append(push.item)
        elif await push_item(node, push.target, push.item, handoff=handoff) is not None:
            node.stats["repaired"] += 1
        else:
            failed.append((push.target, push.item))
    # after the chunks they name; never to a target whose push of one of them failed (a
    # manifest there without its chunks would be a head nothing can restore)
    lacking = _lacking_chunks(failed)
    for (target, handoff), items in manifests.items():
        gaps = lacking.get(target)
        skipped = {item for item in items if gaps and not _complete(node, item, gaps)}
        items = [item for item in items if item not in skipped]
        failed.extend((target, item) for item in skipped)
        if not items:
            continue
        try:
            sizes = await push_manifests(node, target, items, handoff=handoff)
        except Unsupported:  # a target that predates batches: one at a time
            sizes = [await push_item(node, target, item, handoff=handoff) for item in items]
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
        it = parse_item(item)
        if isinstance(it, ChunkItem):
            await node.write(node.store.delete_chunks, [it.key])
        else:
            await node.write(node.store.delete_manifest, it.store, it.version, it.kind, it.epoch)
        node.stats["handed_off"] += 1
    return decision.outstanding


def _lacking_chunks(failed: list[tuple[str, str]]) -> dict[str, set[str]]:
    """Per target, the chunk keys whose push to it failed."""
    out: dict[str, set[str]] = defaultdict(set)
    for target, item in failed:
        it = parse_item(item)
        if isinstance(it, ChunkItem):
            out[target].add(it.key)
    return out


def _complete(node: Node, item: str, lacking: set[str]) -> bool:
    """Whether the manifest ``item`` names none of the chunks in ``lacking`` (False when we
    no longer hold it: nothing to send)."""
    store, version, kind, epoch = parse_manifest(item)
    m = node.store.get_manifest(store, version, kind, epoch)
    return m is not None and all(
        chunk_key(store, m.version, ref.name) not in lacking for ref in m.chunks
    )


def _reached(node: Node, floors: dict[str, int]) -> dict[str, bool | None]:
    """Per store of ``floors`` (a copy of Node.lagging_floors): True once its head here
    reached the floor it refused, None when it is gone from here or its floor rose
    meanwhile (forget it), False while it still lags. Storage reads: off the event loop."""
    out: dict[str, bool | None] = {}
    for path, floor in floors.items():
        store = StoreId.parse(path)
        head = node.store.head(store)
        if head is None or node.store.floor(store) >= floor:
            out[path] = None
        else:
            out[path] = head.version >= floor
    return out


async def _caught_up(node: Node) -> bool:
    """Whether a store whose floor this node refused while it lagged (Node.lagging_floors)
    has since reached it here (repair brought the versions it missed): its next pass asks
    the owners again and takes the floor, where the safety net would wait up to a slot.
    Entries of stores gone from here, or whose floor rose meanwhile, are forgotten. The
    heads and floors are read in a thread (one read each a lagging store); the entries are
    changed on the loop, and only those no refusal lowered meanwhile."""
    if not node.lagging_floors:
        return False
    floors = dict(node.lagging_floors)
    reached = await asyncio.to_thread(_reached, node, floors)
    ready = False
    for path, state in reached.items():
        if state is False:
            continue
        if node.lagging_floors.get(path) == floors[path]:
            del node.lagging_floors[path]
            ready |= bool(state)
    return ready


async def repair_loop(node: Node, full_every: float = 30.0) -> None:
    # Each node declares a death on its own clock, up to a failure-detector period apart, so
    # a designated source may run its planned pass well after its peers. Until every live node
    # has had that long (plus two passes), the others leave its copies to it; after that they
    # cover for it, in case it failed.
    grace = node.config.down_after + 2 * node.config.repair_interval
    clock = RepairClock(full_every, grace, phase=phase_of(node.id, full_every))
    # let gossip settle before the first pass, so a fresh node does not judge a partial view
    await asyncio.sleep(node.config.down_after)
    last_want = -math.inf
    while True:
        view = node.view()
        now = node.clock()
        joining = node.membership is not None and node.membership.state is NodeState.JOINING
        # a caught-up store passes at once, at most once in CATCH_UP_EVERY repair ticks
        # (a peer that kept answering a floor just above the head would pass every tick)
        if now - last_want >= CATCH_UP_EVERY * node.config.repair_interval and await _caught_up(
            node
        ):
            clock.want()
            last_want = now
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
