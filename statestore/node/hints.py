"""Hints of tentative commits: kept, handed off after the heal, decided once (core/tentative.py).

Endpoints (docs/api.md):

- ``PUT /v1/hints/{store}/{version}/{kind}?holders=A,B`` (write): keep a tentative commit's
  manifest, whose chunks the writer sent this node first. Fenced like a manifest by what this
  node holds of the store (a fenced writer gets no tentative acknowledgement), refused when
  this node holds other content at its version and epoch, replacing the same writer's
  earlier hint there; counted against the query's quota; at most ``MAX_HINTS`` per node and
  a query's fair share of them (core/hints.py).
- ``GET /v1/hints/{store}`` and ``GET /v1/hints/{store}/{version}/{kind}?epoch=E`` (read):
  the hints held of a store (a read within a bound asks), one hint (the hand-off asks).
- ``GET /v1/stores/{store}/outcomes`` (read): what became of the store's tentative commits.
- ``POST /v1/stores/{store}/outcomes`` (ring nodes; an admin token): record verdicts, the
  first one recorded for a commit stays; answers with the verdicts held.

:func:`hint_loop` (supervised; a pass every second, and at once when a hint arrives; a pass
that decides nothing doubles the wait, up to 30 s) tries at most ``PASS_BUDGET`` of the
hints this node holds, round-robin over their queries, each query's in hand-off order.
Before one is written anywhere, the owners are asked what they hold at its version and
epoch: a hint never sits beside other content there (core/hints.handoff_fate). One
undecidable (its base is not held, no verdict) held past ``hint_ttl`` (node config, 3,600 s)
is dropped. For each one it reconciles (the first live holder that holds it) it takes the
verdict a read quorum of the store's owners already hold; otherwise it waits for the verdict
on the commit's base when the base is not stable (at W owners), and then hands the commit to
the owners through the ordinary write path (net/writes.write_commit: fencing check, chunks
at W, manifest at W):

- acknowledged: **confirmed**;
- refused for a higher epoch (StaleEpoch): **confirmed** still when W owners hold it with
  its content already, or when an owner holds a commit of the next version built on it
  (then it is copied to the owners, so stable history is never orphaned); otherwise
  **rolled back**, with the version below and its source positions as the replay point;
- refused for other content at its version and epoch (VersionConflict): the writer gave
  that attempt up; stale (dropped without a verdict) when the other content is at W owners,
  confirmed when ours is, else it waits (repair reconciles the owners: core/repair.py);
- the owners out of reach: tried again next pass (a verdict is never guessed).

The verdict is recorded here first, then at W owners; then the hint goes. Its chunks are
ordinary copies from then on, which repair hands to their owners (repair leaves chunks named
by a held hint to the hand-off).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from statestore.core.chunk import EncodedChunk, verify
from statestore.core.errors import (
    InvalidRequest,
    InvalidStoreId,
    MalformedData,
    NotFound,
    QuorumNotReached,
    StaleEpoch,
    StateStoreError,
    VersionConflict,
)
from statestore.core.hints import (
    PASS_BUDGET,
    after_conflict,
    expired,
    handoff_fate,
    next_wait,
    pass_order,
)
from statestore.core.ids import MAX_EPOCH, MAX_VERSION, StoreId, chunk_key, parse_uint
from statestore.core.items import KINDS, ManifestItem
from statestore.core.manifest import Manifest
from statestore.core.quorum import held_at_w, read_quorum
from statestore.core.tentative import (
    CONFIRMED,
    ROLLED_BACK,
    Outcome,
    is_reconciler,
    merge,
)
from statestore.core.view import RingView
from statestore.net.failover import first_holder
from statestore.net.tentative import ask_outcomes, outcome_answers
from statestore.net.writes import put_chunks, write_commit
from statestore.node.auth import allow
from statestore.node.daemon import NODE, Node
from statestore.node.quotas import charged_limit
from statestore.node.repair import ask_have
from statestore.node.request import read_body
from statestore.node.tombstones import DROPPING, DropMarks
from statestore.wire.manifest import decode_chain, decode_manifest, encode_chain, encode_manifest
from statestore.wire.tentative import (
    decode_hint,
    decode_outcomes,
    encode_outcomes,
    outcome_json,
    parse_holders,
)

__all__ = ["hint_loop", "hint_pass", "register"]

log = logging.getLogger(__name__)
STORE = "/v1/stores/{query}/{operator}/{partition}/{name}"


_Key = tuple[StoreId, int, int, str]  # store, epoch, version, kind


@dataclass
class _PassState:
    """What the hand-off remembers between passes (not persisted: after a restart a hint's
    undecidable time starts again, so it is dropped later, never earlier)."""

    seen: dict[_Key, float] = field(default_factory=dict)  # first seen held, node clock
    tried: dict[_Key, float] = field(default_factory=dict)  # last tried
    undecidable: set[_Key] = field(default_factory=set)  # undecidable at their last try
    progress: bool = True  # the last pass decided something


_STATE: weakref.WeakKeyDictionary[Node, _PassState] = weakref.WeakKeyDictionary()


def _state(node: Node) -> _PassState:
    st = _STATE.get(node)
    if st is None:
        st = _STATE[node] = _PassState()
    return st


def _count(node: Node, name: str, n: int = 1) -> None:
    node.stats[name] = node.stats.get(name, 0) + n


# -- endpoints ---------------------------------------------------------------------------
async def put_hint(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = _store_checked(request)
    allow(request, "write", store.query)
    node.check_writable()
    version = parse_uint(request.match_info["version"], "version", MAX_VERSION)
    kind = request.match_info["kind"]
    holders = parse_holders(request.query.get("holders"))
    m = decode_manifest(await read_body(request))
    if (m.store, m.version, m.kind) != (store, version, kind):
        raise InvalidRequest(
            f"hint is for {m.store} v{m.version} {m.kind}, but was sent to "
            f"{store} v{version} {kind}"
        )
    if version < node.store.floor(store):
        raise InvalidRequest(f"{store} version {version} is below retention; commit a newer one")
    keys = [chunk_key(store, version, ref.name) for ref in m.chunks]
    missing = [k for k, held in zip(keys, node.store.has_chunks(keys), strict=True) if not held]
    if missing:
        raise InvalidRequest(
            f"hint of {store} v{version} names {len(missing)} chunk(s) this node does not hold "
            f"(first {missing[0]}): send the chunks, then the hint"
        )
    # not while its query is being dropped: again after the body, with no await before
    # the write is queued (node/tombstones.py)
    request.app[DROPPING].check(store.query)
    # the node's cap and the query's share are checked where the hint is written
    # (NodeStore.put_hint, core/hints.admit: 507 past them)
    created = await node.write(node.store.put_hint, m, holders, charged_limit(request, store.query))
    node.stats["hints_taken"] += int(created)
    node.hints_arrived.set()
    return web.json_response({"stored": created}, status=201 if created else 200)


def _store_checked(request: web.Request) -> StoreId:
    m = request.match_info
    return StoreId.parse(f"{m['query']}/{m['operator']}/{m['partition']}/{m['name']}")


async def get_hint(request: web.Request) -> web.Response:
    """Whether this node holds a hint (``?epoch=E``): 200 with the manifest, else 404."""
    node = request.app[NODE]
    store = _store_checked(request)
    allow(request, "read", store.query)
    version = parse_uint(request.match_info["version"], "version", MAX_VERSION)
    epoch = parse_uint(request.query.get("epoch"), "epoch", MAX_EPOCH)
    raw = node.store.raw_hint(store, version, request.match_info["kind"], epoch)
    if raw is None:
        raise NotFound(f"no hint of {store} v{version} at epoch {epoch} on this node")
    return web.Response(body=raw, content_type="application/msgpack")


async def list_hints(request: web.Request) -> web.Response:
    """The hints this node holds of a store (msgpack list of manifests, as a chain)."""
    node = request.app[NODE]
    store = _store_checked(request)
    allow(request, "read", store.query)
    held = node.store.store_hints(store)
    return web.Response(body=encode_chain(held), content_type="application/msgpack")


async def get_outcomes(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = _store_checked(request)
    allow(request, "read", store.query)
    return web.json_response({"outcomes": [outcome_json(o) for o in node.store.outcomes(store)]})


async def post_outcomes(request: web.Request) -> web.Response:
    node = request.app[NODE]
    store = _store_checked(request)
    allow(request, "admin", store.query)  # ring nodes (or an admin token)
    node.check_writable()
    held = [
        await node.write(node.store.put_outcome, o)
        for o in decode_outcomes(await read_body(request), store)
    ]
    return web.json_response({"outcomes": [outcome_json(o) for o in held]})


def register(app: web.Application) -> None:
    hint = "/v1/hints/{query}/{operator}/{partition}/{name}/{version}/{kind}"
    app.router.add_put(hint, put_hint)
    app.router.add_get(hint, get_hint)
    app.router.add_get("/v1/hints/{query}/{operator}/{partition}/{name}", list_hints)
    app.router.add_get(STORE + "/outcomes", get_outcomes)
    app.router.add_post(STORE + "/outcomes", post_outcomes)


# -- the hand-off ------------------------------------------------------------------------
async def owners_outcomes(
    node: Node, view: RingView, store: StoreId
) -> dict[tuple[int, int], Outcome]:
    """The verdicts the store's owners hold, merged (core/tentative.merge), from at least a
    read quorum of them (verdicts are recorded at W: R - W + 1 answers meet every one);
    QuorumNotReached otherwise: a verdict is never decided twice for want of asking."""
    owners = view.store_replicas(store)
    answers = await ask_outcomes(node.transport, owners, store)
    need = min(read_quorum(view.replicas, view.write_quorum), len(owners))
    if len(answers) < need:
        raise QuorumNotReached(
            f"verdicts of {store}: {len(answers)} of {need} owners answered; a verdict waits"
        )
    return merge(answers)


async def _record(node: Node, view: RingView, o: Outcome) -> Outcome | None:
    """Send ``o`` to the store's owners; the verdict W of them hold (the first each was
    sent stays: if they kept another one, that one), None below W."""
    store = StoreId.parse(o.store)
    path = f"/v1/stores/{store.path}/outcomes"
    body = encode_outcomes([o])
    results = await asyncio.gather(
        *(
            node.transport.request(
                "POST", a, path, body=body, headers={"Content-Type": "application/json"}
            )
            for a in view.store_write_replicas(store)
        ),
        return_exceptions=True,
    )
    kept = [x for a in outcome_answers(results, store) for x in a if x.key() == o.key()]
    if len(kept) < view.write_quorum:
        return None
    return merge([kept])[o.key()]


async def _chunks(node: Node, view: RingView, m: Manifest) -> list[EncodedChunk]:
    """The hint's chunks: from this node, else from their owners (repair may have handed a
    copy that arrived before its hint to them)."""
    out = []
    for ref in m.chunks:
        key = chunk_key(m.store, m.version, ref.name)
        data = node.store.get_chunk(key)
        if data is None:

            async def read(address: str, key: str = key) -> bytes:
                return (await node.transport.request("GET", address, f"/v1/chunks/{key}")).body

            _, fetched = await first_holder(key, view.read_order(key), read)
            verify(fetched, ref.checksum, key)
            data = fetched
        out.append(ref.encoded(data))
    return out


async def _owner_manifests(
    node: Node, view: RingView, m: Manifest
) -> list[tuple[str, list[Manifest]]]:
    """What each owner that answers holds around ``m``: its chain answer for ``m.version``
    (every manifest above it, every epoch of it, and lines of descent below:
    core/manifest.local_chain); QuorumNotReached below a read quorum of answers."""
    path = f"/v1/stores/{m.store.path}/chain?version={m.version}"
    owners = view.store_replicas(m.store)
    results = await asyncio.gather(
        *(node.transport.request("GET", a, path) for a in owners),
        return_exceptions=True,
    )
    out: list[tuple[str, list[Manifest]]] = []
    for a, r in zip(owners, results, strict=True):
        if isinstance(r, BaseException):
            if isinstance(r, NotFound):
                out.append((a, []))
            elif not isinstance(r, StateStoreError):
                raise r
            continue
        try:
            out.append((a, decode_chain(r.body)))
        except StateStoreError:
            continue
    if len(out) < min(read_quorum(view.replicas, view.write_quorum), len(view.members)):
        raise QuorumNotReached(f"chains of {m.store}: too few owners answered")
    return out


def _holdings(
    view: RingView, m: Manifest, per_owner: list[tuple[str, list[Manifest]]]
) -> tuple[int, int, bool]:
    """Owners holding ``m`` with its content, owners holding other content at its version,
    kind and epoch, and whether some owner holds a commit of version + 1 built on its epoch
    (a writer that read it within a bound and went on from it). Owners holding ``m`` count
    as W only once W of the store's home replicas are among them (as a write is
    acknowledged, core/quorum.check_write_sets): a stand-in's copy is a hint."""
    same = other = 0
    built_on = False
    holders: list[str] = []
    for address, held in per_owner:
        mine = [h for h in held if (h.version, h.epoch, h.kind) == (m.version, m.epoch, m.kind)]
        if any(h.same_content(m) for h in mine):
            same += 1
            holders.append(address)
        other += any(not h.same_content(m) for h in mine)
        built_on |= any(
            h.version == m.version + 1 and h.kind == "delta" and h.base_epoch == m.epoch
            for h in held
        )
    owners = view.store_replicas(m.store)
    if not held_at_w(holders, owners, view.write_homes(m.store.path), view.write_quorum):
        same = min(same, view.write_quorum - 1)
    return same, other, built_on


async def _replay_point(node: Node, view: RingView, m: Manifest) -> tuple[int, dict[str, Any]]:
    """The version below ``m`` (its base) and that version's source positions; waits
    (QuorumNotReached) when no owner gives the base."""
    base = m.version - 1
    if base < 1 or (m.kind == "snapshot" and m.base_epoch is None):
        return max(base, 0), {}
    q = "" if m.base_epoch is None else f"?epoch={m.base_epoch}"
    for kind in ("delta", "snapshot"):
        path = f"/v1/manifests/{m.store.path}/{base}/{kind}{q}"
        for a in view.store_replicas(m.store):
            try:
                resp = await node.transport.request("GET", a, path)
                return base, dict(decode_manifest(resp.body).positions)
            except StateStoreError:
                continue
    if node.store.floor(m.store) > base:
        return base, {}  # gone below retention: the version is the replay point
    raise QuorumNotReached(f"the base of {m.store} v{m.version} is not readable yet")


def _rolled_back(m: Manifest, replay_from: int, positions: dict[str, Any]) -> Outcome:
    return Outcome(m.store.path, m.version, m.epoch, ROLLED_BACK, replay_from, positions)


# _decide's answer for a hint whose version and epoch hold other content, stable: no verdict
STALE = Outcome("-/0/0/-", 1, 0, CONFIRMED)


async def _decide(
    node: Node,
    view: RingView,
    m: Manifest,
    known: dict[tuple[int, int], Outcome],
    marks: DropMarks,
) -> Outcome | None:
    """The verdict on ``m`` (None: not yet, its base is still undecided or out of reach;
    STALE: no verdict, the hint is dropped). ``marks``: for :func:`_copy_to_owners`."""
    if m.kind == "delta" and m.base_epoch is not None and m.version > 1:
        # built on a tentative commit (its own writer's, or one a writer read within a
        # bound): that one's verdict first
        base = known.get((m.base_epoch, m.version - 1)) or node.store.outcome(
            m.store.path, m.version - 1, m.base_epoch
        )
        if base is not None and base.outcome == ROLLED_BACK:
            return _rolled_back(m, base.replay_from, base.positions)
        if base is None and not await _base_held(node, view, m):
            return None  # a tentative base not handed off yet (by its own reconciler)
    # a hint never sits beside other content at its version and epoch (core/hints.py): the
    # owners are asked first. Other content there is its writer's later attempt (a failed
    # commit, then other content; one epoch is one writer, and a writer that was told
    # "tentative" goes on from it, never back): at W owners this hint is stale; at fewer, a
    # write in flight or a partial one, which repair completes or reconciles: it waits
    same, other, _ = _holdings(view, m, await _owner_manifests(node, view, m))
    fate = handoff_fate(same, other, view.write_quorum)
    if fate == "stale":
        return STALE
    if fate == "wait":
        return None
    try:
        headers = marks.headers([m.store.query])  # read before the hint: not across a drop
        await write_commit(node.transport, view, m, await _chunks(node, view, m), headers=headers)
        return Outcome(m.store.path, m.version, m.epoch, CONFIRMED)
    except VersionConflict:
        # the other content arrived meanwhile (a race with the writer's retry): the content
        # at W owners wins; where ours landed beside it, repair reconciles it to that one
        same, other, _ = _holdings(view, m, await _owner_manifests(node, view, m))
        fate = after_conflict(same, other, view.write_quorum)
        if fate == "stale":
            return STALE
        if fate == "confirmed":
            return Outcome(m.store.path, m.version, m.epoch, CONFIRMED)
        return None
    except (StaleEpoch, InvalidRequest):
        # refused for good: a higher epoch, or below retention
        same, other, built_on = _holdings(view, m, await _owner_manifests(node, view, m))
        if same >= view.write_quorum:  # handed off another way already
            return Outcome(m.store.path, m.version, m.epoch, CONFIRMED)
        if built_on and not other:  # stable history built on it: make it whole
            await _copy_to_owners(node, view, m, marks)
            return Outcome(m.store.path, m.version, m.epoch, CONFIRMED)
        replay_from, positions = await _replay_point(node, view, m)
        return _rolled_back(m, replay_from, positions)


async def _copy_to_owners(node: Node, view: RingView, m: Manifest, marks: DropMarks) -> None:
    """Put ``m`` (chunks, then the manifest as repair's unfenced copy) on W owners: a later
    commit of another epoch names it as its base. ``marks``: its query's drop, read before
    the hint (node/tombstones.py, "Copies pushed across a drop")."""
    chunks = await _chunks(node, view, m)
    headers = marks.headers([m.store.query])
    await put_chunks(node.transport, view, m.store, m.version, chunks, headers=headers)
    path = f"/v1/manifests/{m.store.path}/{m.version}/{m.kind}?copy=1"
    results = await asyncio.gather(
        *(
            node.transport.request(
                "PUT",
                a,
                path,
                body=encode_manifest(m),
                headers={"Content-Type": "application/msgpack"} | marks.headers([m.store.query]),
            )
            for a in view.store_write_replicas(m.store)
        ),
        return_exceptions=True,
    )
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, StateStoreError):
            raise r
    # an owner holding other content at this version and epoch answers but keeps its own:
    # count the owners that hold ours now
    same, _, _ = _holdings(view, m, await _owner_manifests(node, view, m))
    if same < view.write_quorum:
        raise QuorumNotReached(f"copy of {m.store} v{m.version}: fewer than W owners hold it")


async def _base_held(node: Node, view: RingView, m: Manifest) -> bool:
    """Whether W owners hold version - 1 of ``m`` at its base epoch (a stable base), or it
    is below the store's retention floor."""
    if node.store.floor(m.store) > m.version - 1:
        return True
    e = m.base_epoch
    if e is None:  # _decide asks only about a delta that names its base
        return False
    items = [ManifestItem(m.store, m.version - 1, k, e).name() for k in KINDS]
    owners = view.store_replicas(m.store)
    others = [a for a in owners if a != node.address]
    answers = await ask_have(node, {a: items for a in others})
    held = {a for a in others if any(answers.get((a, it)) for it in items)}
    if node.address in owners and any(
        node.store.get_manifest(m.store, m.version - 1, k, e) is not None
        for k in ("delta", "snapshot")
    ):
        held.add(node.address)
    return held_at_w(held, owners, view.write_homes(m.store.path), view.write_quorum)


async def _reconciles(node: Node, m: Manifest, holders: list[str], live: list[str]) -> bool:
    """Whether this node hands ``m`` off: no live holder listed before it holds the hint
    (core/tentative.is_reconciler over the holders that answer that they hold it)."""
    before = holders[: holders.index(node.address)] if node.address in holders else []
    path = f"/v1/hints/{m.store.path}/{m.version}/{m.kind}?epoch={m.epoch}"
    holding = []
    for address in before:
        if address not in live:
            continue
        try:
            await node.transport.request("GET", address, path)
            holding.append(address)
        except NotFound:
            continue
        except StateStoreError:
            holding.append(address)  # alive to the view, silent to us: it may hold it
    return is_reconciler(node.address, [*holding, node.address], live)


async def hint_pass(node: Node, view: RingView) -> int:
    """One pass over at most ``PASS_BUDGET`` of the hints held (core/hints.pass_order:
    round-robin over their queries); returns how many are still held."""
    st = _state(node)
    st.progress = False
    _count(node, "hint_passes")
    live = view.live_addresses()
    now = node.clock()
    ttl = node.config.hint_ttl
    waiting: set[tuple[str, int]] = set()  # a writer's chain waits behind its oldest hint
    known: dict[StoreId, dict[tuple[int, int], Outcome]] = {}
    keys = node.store.hint_keys()
    held = {(s, e, v, k): q for q, s, e, v, k in keys}
    st.seen = {k: st.seen.get(k, now) for k in held}
    st.tried = {k: t for k, t in st.tried.items() if k in held}
    st.undecidable &= held.keys()
    # undecidable at their last try and held past the TTL: dropped without asking again
    for key in sorted(k for k in st.undecidable if expired(st.seen[k], now, ttl)):
        store, epoch, version, kind = key
        log.warning("hint of %s v%d (epoch %d) undecidable for %.0f s: dropped", store, version,
                    epoch, now - st.seen[key])  # fmt: skip
        await node.write(node.store.drop_hint_record, store, version, kind, epoch)
        st.undecidable.discard(key)
        _count(node, "hints_expired")
        st.progress = True
        held.pop(key, None)
    # the least recently tried first (so every hint gets its turn), round-robin over queries
    ordered = sorted(held, key=lambda k: st.tried.get(k, -1.0))
    chosen = pass_order([(held[k], k) for k in ordered], PASS_BUDGET)
    for key in chosen:
        store, epoch, version, kind = key
        line = (store.path, epoch)
        if line in waiting:
            continue
        marks = DropMarks(node)
        marks.read(store.query)  # before the hint: a copy of it read before a drop is refused
        raw = node.store.raw_hint(store, version, kind, epoch)
        if raw is None and not node.store.hint_rotted(store, version, kind, epoch):
            continue  # gone meanwhile
        try:
            if raw is None:  # rotted on disk: its seal does not match
                raise MalformedData("its seal does not match")
            m, holders = decode_hint(raw)
        except (MalformedData, InvalidStoreId, ValueError):
            log.warning("hint of %s v%d (epoch %d) does not decode: dropped", store, version, epoch)
            await node.write(node.store.drop_hint_record, store, version, kind, epoch)
            continue
        _count(node, "hints_tried")
        st.tried[key] = now
        st.undecidable.discard(key)
        try:
            if m.store not in known:
                known[m.store] = await owners_outcomes(node, view, m.store)
            o = known[m.store].get((m.epoch, m.version)) or node.store.outcome(
                m.store.path, m.version, m.epoch
            )
            if o is None:
                if not await _reconciles(node, m, holders, live):
                    waiting.add(line)
                    continue
                o = await _decide(node, view, m, known[m.store], marks)
                if o is None:
                    # undecidable for now (its base held by no owner and undecided, or other
                    # content in flight at its version): dropped once held past the TTL
                    st.undecidable.add(key)
                    waiting.add(line)
                    continue
                if o is STALE:
                    log.info("hint of %s v%d (epoch %d): other content is stable", m.store,
                             m.version, m.epoch)  # fmt: skip
                    await node.write(node.store.delete_hint, m)
                    _count(node, "hints_superseded")
                    st.progress = True
                    continue
                o = await node.write(node.store.put_outcome, o)
            kept = await _record(node, view, o)
            if kept is None:
                waiting.add(line)
                continue
            if kept.outcome != o.outcome:
                log.warning("verdict on %s v%d: the owners kept %s", m.store, m.version, kept)
            known[m.store][(m.epoch, m.version)] = kept
            node.stats["tentative_" + kept.outcome] += 1
            # only the hint goes: its chunks are ordinary copies now, which repair hands to
            # their owners and drops here once they hold them (never by key alone)
            await node.write(node.store.delete_hint, m)
            st.progress = True
        except StateStoreError as exc:
            log.warning(
                "hint of %s v%d (epoch %d) not handed off yet: %s", m.store, m.version, m.epoch, exc
            )
            waiting.add(line)
    left = node.store.hint_count()
    node.stats["hints"] = left
    return left


async def hint_loop(node: Node) -> None:
    """Hand hints off while any are held: a pass every second, and at once when a hint
    arrives (a writer that went tentative on a healthy ring is confirmed in milliseconds,
    so its next commit can be stable again); a pass that decides nothing doubles the wait
    before the next, up to 30 s (core/hints.next_wait: no busy loop over hints nobody can
    decide)."""
    # a node started again hands nothing off before it learned the drops it missed: a hint
    # of a query dropped meanwhile would be written back to owners that purged it
    await node.until_copies_served()
    base = min(node.config.repair_interval, 1.0)
    wait = base
    while True:
        progress = True
        if node.store.hint_count():
            await hint_pass(node, node.view())
            progress = _state(node).progress
        wait = next_wait(progress, wait, base)
        node.hints_arrived.clear()
        try:
            await asyncio.wait_for(node.hints_arrived.wait(), wait)
        except TimeoutError:
            pass
