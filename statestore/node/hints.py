"""Hints of tentative commits: kept, handed off after the heal, decided once (core/tentative.py).

Endpoints (docs/api.md):

- ``PUT /v1/hints/{store}/{version}/{kind}?holders=A,B`` (write): keep a tentative commit's
  manifest, whose chunks the writer sent this node first. Fenced like a manifest by what this
  node holds of the store (a fenced writer gets no tentative acknowledgement).
- ``GET /v1/stores/{store}/outcomes`` (read): what became of the store's tentative commits.
- ``POST /v1/stores/{store}/outcomes`` (ring nodes; an admin token): record verdicts, the
  first one recorded for a commit stays; answers with the verdicts held.

:func:`hint_loop` (supervised, every ``--repair-interval``) walks the hints this node holds
in hand-off order. For each one it reconciles (the first live holder) it takes the verdict
already recorded by the store's owners if there is one; otherwise it waits for the outcome
of the version below when that was a tentative commit of the same writer, and then hands
the commit to the owners through the ordinary write path (net/writes.write_commit: fencing
check, chunks at W, manifest at W):

- acknowledged: **confirmed**;
- refused for a higher epoch (StaleEpoch): **confirmed** still if the head's lineage holds
  the commit (it reached the owners another way and a newer writer built on it), otherwise
  **rolled back**, with the version below and its source positions as the replay point;
- the owners out of reach: tried again next pass.

The verdict is recorded here first, then at the store's owners (W of them), then the hint
goes, with the copies of its chunks this node does not own. Holders that do not reconcile
drop their copy once the owners hold a verdict. Repair leaves chunks named by a hint alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from statestore.core.chunk import EncodedChunk
from statestore.core.errors import (
    InvalidRequest,
    NotFound,
    StaleEpoch,
    StateStoreError,
    VersionConflict,
)
from statestore.core.ids import MAX_EPOCH, MAX_VERSION, StoreId, chunk_key, parse_uint
from statestore.core.manifest import Manifest
from statestore.core.tentative import (
    CONFIRMED,
    ROLLED_BACK,
    Outcome,
    is_reconciler,
    merge,
)
from statestore.core.view import RingView
from statestore.net.reads import read_chain, read_head
from statestore.net.writes import write_commit
from statestore.node.auth import allow
from statestore.node.daemon import NODE, Node
from statestore.node.repair import ask_have
from statestore.node.request import read_body
from statestore.wire.manifest import decode_manifest, encode_chain
from statestore.wire.tentative import (
    decode_outcomes,
    encode_outcomes,
    outcome_json,
    parse_holders,
)

__all__ = ["hint_loop", "hint_pass", "register"]

log = logging.getLogger(__name__)
STORE = "/v1/stores/{query}/{operator}/{partition}/{name}"


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
    created = await node.write(node.store.put_hint, m, holders)
    node.stats["hints_taken"] += int(created)
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
    held = [m for m in node.store.store_hints(store)]
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
    """The verdicts the store's owners hold, merged (core/tentative.merge)."""
    path = f"/v1/stores/{store.path}/outcomes"
    results = await asyncio.gather(
        *(node.transport.request("GET", a, path) for a in view.store_replicas(store)),
        return_exceptions=True,
    )
    answers = []
    for r in results:
        if isinstance(r, BaseException):
            if not isinstance(r, StateStoreError):
                raise r
            continue
        try:
            answers.append(decode_outcomes(r.body, store))
        except StateStoreError:
            continue
    return merge(answers)


async def _record(node: Node, view: RingView, o: Outcome) -> bool:
    """Send ``o`` to the store's owners; True once W of them hold a verdict of it."""
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
    acked = 0
    for r in results:
        if isinstance(r, BaseException):
            if not isinstance(r, StateStoreError):
                raise r
            continue
        acked += 1
    return acked >= view.write_quorum


def _chunks(node: Node, m: Manifest) -> list[EncodedChunk]:
    out = []
    for ref in m.chunks:
        key = chunk_key(m.store, m.version, ref.name)
        data = node.store.get_chunk(key)
        if data is None:
            raise NotFound(f"hinted chunk {key} is gone from this node")
        out.append(
            EncodedChunk(ref.name, ref.lo, ref.hi, data, ref.checksum, ref.raw_size, ref.rows)
        )
    return out


async def _on_lineage(node: Node, view: RingView, m: Manifest) -> bool:
    """Whether the store's head (a read quorum) descends from ``m``, or W owners hold it:
    then it is stable history, whatever happened since. Owners out of reach raise (an
    Unavailable): the verdict waits, it is never guessed."""
    try:
        head = await read_head(node.transport, view, m.store)
        chain = await read_chain(node.transport, view, m.store, head.version)
    except NotFound:
        chain = []
    if any((c.version, c.epoch) == (m.version, m.epoch) for c in chain):
        return True
    item = f"m:{m.store.path}/{m.version}/{m.kind}/{m.epoch}"
    owners = [a for a in view.store_replicas(m.store) if a != node.address]
    answers = await ask_have(node, {a: [item] for a in owners})
    held = sum(1 for a in owners if answers.get((a, item)))
    if node.address in view.store_replicas(m.store):
        held += node.store.get_manifest(m.store, m.version, m.kind, m.epoch) is not None
    return held >= view.write_quorum


async def _replay_point(node: Node, view: RingView, m: Manifest) -> tuple[int, dict[str, Any]]:
    """The version below ``m`` (its base) and that version's source positions."""
    base = m.version - 1
    if base < 1:
        return 0, {}
    for kind in ("delta", "snapshot"):
        q = "" if m.base_epoch is None else f"?epoch={m.base_epoch}"
        path = f"/v1/manifests/{m.store.path}/{base}/{kind}{q}"
        for a in view.store_replicas(m.store):
            try:
                resp = await node.transport.request("GET", a, path)
                return base, dict(decode_manifest(resp.body).positions)
            except StateStoreError:
                continue
    return base, {}


async def _decide(
    node: Node, view: RingView, m: Manifest, known: dict[tuple[int, int], Outcome]
) -> Outcome | None:
    """The verdict on ``m`` (None: not yet, its base is still undecided or out of reach)."""
    if m.kind == "delta" and m.base_epoch == m.epoch and m.version > 1:
        base = known.get((m.epoch, m.version - 1)) or node.store.outcome(
            m.store.path, m.version - 1, m.epoch
        )
        if base is not None and base.outcome == ROLLED_BACK:
            return Outcome(
                m.store.path, m.version, m.epoch, ROLLED_BACK, base.replay_from, base.positions
            )
        if base is None and not await _base_held(node, view, m):
            return None  # a tentative base not handed off yet (by its own reconciler)
    try:
        await write_commit(node.transport, view, m, _chunks(node, m))
        return Outcome(m.store.path, m.version, m.epoch, CONFIRMED)
    except (StaleEpoch, VersionConflict):
        if await _on_lineage(node, view, m):
            return Outcome(m.store.path, m.version, m.epoch, CONFIRMED)
        replay_from, positions = await _replay_point(node, view, m)
        return Outcome(m.store.path, m.version, m.epoch, ROLLED_BACK, replay_from, positions)


async def _base_held(node: Node, view: RingView, m: Manifest) -> bool:
    """Whether an owner holds version - 1 of ``m`` at its epoch (a stable base), or it is
    below the store's retention floor."""
    if node.store.floor(m.store) > m.version - 1:
        return True
    items = [f"m:{m.store.path}/{m.version - 1}/{k}/{m.epoch}" for k in ("delta", "snapshot")]
    owners = [a for a in view.store_replicas(m.store) if a != node.address]
    answers = await ask_have(node, {a: items for a in owners})
    if any(answers.get((a, it)) for a in owners for it in items):
        return True
    return any(
        node.store.get_manifest(m.store, m.version - 1, k, m.epoch) is not None
        for k in ("delta", "snapshot")
    ) and node.address in view.store_replicas(m.store)


async def _drop(node: Node, view: RingView, m: Manifest) -> None:
    """Forget the hint, and the copies of its chunks this node holds only for it."""
    await node.write(node.store.delete_hint, m)
    still = node.store.hinted_chunks()
    mine = [
        key
        for ref in m.chunks
        if (key := chunk_key(m.store, m.version, ref.name)) not in still
        and node.address not in view.replicas_of(key)
    ]
    if mine:
        await node.write(node.store.delete_chunks, mine)


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
    """One walk over the hints held; returns how many are still held."""
    live = view.live_addresses()
    waiting: set[tuple[str, int]] = set()  # a writer's chain waits behind its oldest hint
    known: dict[StoreId, dict[tuple[int, int], Outcome]] = {}
    for m, holders in sorted(
        node.store.hints(), key=lambda h: (h[0].store.path, h[0].epoch, h[0].version)
    ):
        line = (m.store.path, m.epoch)
        if line in waiting:
            continue
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
                o = await _decide(node, view, m, known[m.store])
                if o is None:
                    waiting.add(line)
                    continue
                o = await node.write(node.store.put_outcome, o)
                node.stats["tentative_" + o.outcome] += 1
            known[m.store][(m.epoch, m.version)] = o
            if not await _record(node, view, o):
                waiting.add(line)
                continue
            await _drop(node, view, m)
        except StateStoreError as exc:
            log.warning(
                "hint of %s v%d (epoch %d) not handed off yet: %s", m.store, m.version, m.epoch, exc
            )
            waiting.add(line)
    left = node.store.hint_count()
    node.stats["hints"] = left
    return left


async def hint_loop(node: Node) -> None:
    """Hand hints off while any are held (a pass every ``--repair-interval``)."""
    while True:
        if node.store.hint_count():
            await hint_pass(node, node.view())
        await asyncio.sleep(min(node.config.repair_interval, 1.0))
