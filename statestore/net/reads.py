"""Reading store metadata and single keys: heads, versions, chains, point reads.

A chain read asks the store's replicas for the manifests of a version, merges what they
return (every epoch of a version is kept) and resolves it along the head's lineage (a snapshot
plus the deltas above it, core/manifest.py). Whole-state restores build on it in recovery.py;
a point read fetches, of blocked chunks, an index and one block of each chunk covering its key
(of whole ones, the chunks of its key's key group, newest first), failing over to the next
holder on error, timeout or checksum mismatch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import msgpack
import msgspec

from statestore.core.cache import ChunkCache, rows_cost
from statestore.core.chunk import (
    MAX_CHUNK_RAW,
    BlockIndex,
    decode_block,
    decode_chunk,
    decoded_bound,
    index_span,
    key_group,
    parse_index,
    verify,
)
from statestore.core.errors import (
    CorruptChunk,
    InvalidRequest,
    MalformedData,
    NodeUnavailable,
    NotFound,
    PayloadTooLarge,
    QuorumNotReached,
    StateStoreError,
    StoreNotFound,
    Unavailable,
    VersionNotFound,
)
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import ChunkRef, Head, Manifest, candidates, resolve_chain
from statestore.core.quorum import first_semantic, merge_heads, read_quorum
from statestore.core.retention import MAX_RETAIN
from statestore.core.view import RingView
from statestore.net.failover import first_holder
from statestore.net.quorate import Rest, until_enough
from statestore.net.transport import ERROR_BYTES, Response, Transport
from statestore.wire.bodies import (
    MAX_LOOKUP_INDEX,
    MAX_LOOKUP_INDEX_BYTES,
    MAX_LOOKUP_KEY_HEX,
    MAX_LOOKUP_PATH,
    LookupPart,
    LookupRequest,
)
from statestore.wire.head import from_json as head_from_json
from statestore.wire.manifest import decode_chain

__all__ = [
    "Block",
    "BlockPath",
    "ReadStats",
    "block_path",
    "blocks_wanted",
    "cache_key",
    "decided",
    "fetch_chunk",
    "fetch_part",
    "load_index",
    "lookup_fits",
    "lookup_keys",
    "read_block_rows",
    "read_by_blocks",
    "read_chain",
    "read_chains",
    "read_head",
    "read_heads",
    "read_key",
    "read_retention",
    "read_versions",
]


BATCH_STORES = 500  # stores per POST /v1/heads or /v1/chains (a node takes up to 1,000)


@dataclass
class ReadStats:
    """What a point read fetched: chunks and bytes, per node, and holders skipped."""

    chunks: int = 0
    parts: int = 0  # parts of chunks (a blocked chunk's index or one block), or lookups
    bytes: int = 0
    failovers: int = 0
    chain: int = 0
    by_node: dict[str, int] = field(default_factory=dict)


async def _ask_replicas(
    transport: Transport,
    view: RingView,
    store: StoreId,
    path: str,
    answers: int | None = None,
    *,
    home: bool = False,
    valid: Callable[[bytes], bool] | None = None,
) -> tuple[list[bytes], list[BaseException], set[str]]:
    """Ask the store's replicas; once the read needs are met (``answers``, else the read
    quorum), the read returns: those answers meet every commit acknowledged in this view,
    and the client runs a read again on a fresh view when an answer came from a newer one
    (client ``_routed``). The slower replicas' requests run on (net/quorate.py).

    ``home``: the read needs a read quorum of the store's home replicas as well
    (:func:`_home_need`), and asks those its owners in ``view`` leave out. ``valid``: a
    body it refuses is not an answer (:func:`_ask`)."""
    need = _needed(view, answers)
    owners = view.store_replicas(store)
    homes = view.live_home_replicas(store.path) if home else []
    need_home = min(_home_need(view, answers), len(homes)) if home else 0
    if not need_home or set(view.previous_replicas(store.path)) <= set(owners):
        return await _ask(transport, owners, path, need, rest="run", valid=valid)
    targets = owners + [a for a in homes if a not in owners]

    def enough(answered: set[str], finished: set[str]) -> bool:
        # the home quorum is waited for while it can still be met: a home replica that
        # cannot be reached (killed, not yet called down) leaves the owners' quorum to
        # decide, as it did before (two nodes out is more than R=3, W=2 promise)
        if _among(owners, answered) < need:
            return False
        return _among(homes, answered) >= need_home or all(a in finished for a in homes)

    return await _ask(transport, targets, path, rest="run", enough=enough, valid=valid)


def _among(addresses: Sequence[str], answered: set[str]) -> int:
    return sum(1 for a in addresses if a in answered)


def _home_need(view: RingView, answers: int | None = None) -> int:
    """Answers a latest read needs from the store's home replicas (its owners on the ring
    counting every member, down ones too), besides its owners' read quorum: a commit
    acknowledged by W home replicas on a view where they were all live is met by a read
    quorum of them, not by one of owners that include a stand-in (a node that became an
    owner when a home replica was called down, and may not hold it yet). Found by
    statestore-sim (seed 197272725224341, docs/reliability.md). A read of one answer
    (consistency ``one``) asks for none; more than a read quorum is never asked of them
    (one home replica may be down)."""
    need = _needed(view, answers)
    if need <= 1:
        return 0
    return min(need, read_quorum(view.replicas, view.write_quorum))


def stand_ins(view: RingView, store: StoreId) -> list[str]:
    """Live nodes other than the store's replicas that may hold what its replicas lack: the
    next R on its preference list (where writes went while owners were down: a partition
    that healed gives the owners back before repair brought them what they missed) and its
    replicas on the ring that still counted the down nodes."""
    owners = view.store_replicas(store)
    live = set(view.live_addresses())
    out: list[str] = []
    for node in view.ring.preference(store.path):
        address = view.address(node)
        if address in owners or address in out or address not in live:
            continue
        if len(out) == view.replicas:
            break
        out.append(address)
    for address in view.previous_replicas(store.path):
        if address not in owners and address not in out and address in live:
            out.append(address)
    return out


def _answer(r: Response | BaseException) -> bool:
    return not isinstance(r, BaseException) or isinstance(r, NotFound)


async def _ask(
    transport: Transport,
    targets: Sequence[str],
    path: str,
    need: int = 1,
    *,
    rest: Rest = "wait",
    enough: Callable[[set[str], set[str]], bool] | None = None,
    valid: Callable[[bytes], bool] | None = None,
) -> tuple[list[bytes], list[BaseException], set[str]]:
    """GET ``path`` from every target; after ``need`` answers (a body or NotFound), or once
    ``enough(the targets that answered, the targets done)`` holds, the others are treated as
    ``rest`` says
    (net/quorate.until_enough). Returns the bodies, the errors and the targets that
    answered (with ``valid``: a body it refuses is returned but is not an answer)."""

    def answer(r: Response | BaseException) -> bool:
        if isinstance(r, BaseException) or valid is None:
            return _answer(r)
        return valid(r.body)

    def done_enough(done: dict[int, Response | BaseException]) -> bool:
        if enough is not None:
            answered = {targets[i] for i, r in done.items() if answer(r)}
            return enough(answered, {targets[i] for i in done})
        return sum(map(answer, done.values())) >= need

    results = await until_enough(
        [transport.request("GET", a, path) for a in targets], done_enough, f"GET {path}", rest=rest
    )
    bodies = [r.body for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, StateStoreError):
            raise e
    return bodies, errors, {a for a, r in zip(targets, results, strict=True) if answer(r)}


async def _elsewhere(
    transport: Transport,
    view: RingView,
    store: StoreId,
    path: str,
    answered: set[str],
    answers: int | None = None,
    *,
    owners: bool = False,
) -> tuple[list[bytes], int]:
    """Before a read says that a store (or a version of it) is not there because a read
    quorum of its owners in ``view`` (``answered``) said so: ask where else it may be. Its
    stand-ins (:func:`stand_ins`), and its home replicas (the ring counting every member,
    down ones too) that did not answer yet: a view may call members down wrongly (a node cut
    off from the others calls them all down and names itself and the nodes it still counts
    as the owners; statestore-sim, docs/reliability.md). Returns the bodies found and how
    many home replicas answered in all, for the caller's :func:`_need` before it says "not
    there". Home replicas are asked only when those that answered are fewer than it needs.
    ``owners``: the owners that did not answer yet are asked too (:func:`read_chain`)."""
    home = view.previous_replicas(store.path)
    at_home = sum(1 for a in home if a in answered)
    targets = stand_ins(view, store)
    if owners:
        targets += [a for a in view.store_replicas(store) if a not in answered]
    if at_home < _needed(view, answers):
        targets += [a for a in home if a not in answered and a not in targets]
    if not targets:
        return [], at_home
    bodies, _, more = await _ask(transport, targets, path)
    return bodies, at_home + sum(1 for a in home if a in more and a not in answered)


def _needed(view: RingView, answers: int | None = None) -> int:
    want = read_quorum(view.replicas, view.write_quorum) if answers is None else answers
    return min(want, len(view.members))


def _need(
    view: RingView,
    store: StoreId,
    answered: int,
    errors: list[BaseException],
    answers: int | None = None,
) -> None:
    # Capped by the ring's members, down ones included, not by the live replicas: a node cut
    # off from the others sees itself as the whole ring, and its answer alone must not pass
    # for a quorum (statestore-sim found it, docs/reliability.md).
    # ``answers``: a per-request consistency's count (core/quorum.read_answers) instead.
    need = _needed(view, answers)
    if answered < need:
        raise QuorumNotReached(
            f"reading {store} needs {need} replica answer(s), got {answered}: "
            + "; ".join(str(e) for e in errors)
        )


def _merge_head(
    view: RingView,
    store: StoreId,
    heads: list[Head],
    errors: list[BaseException],
    answers: int | None = None,
) -> Head:
    not_found = [e for e in errors if isinstance(e, NotFound)]
    _need(view, store, len(heads) + len(not_found), errors, answers)
    best = merge_heads(heads)
    if best is None:
        raise StoreNotFound(f"store {store} has no committed version: commit one first")
    return best


async def read_head(
    transport: Transport, view: RingView, store: StoreId, answers: int | None = None
) -> Head:
    """The store's latest head over a read quorum (or ``answers`` replica answers) of its
    owners in ``view`` and one of its home replicas (:func:`_home_need`). Raises
    StoreNotFound if none has one, nor any of its stand-ins (:func:`stand_ins`)."""
    path = f"/v1/stores/{store.path}/head"
    bodies, errors, answered = await _ask_replicas(
        transport, view, store, path, answers, home=True, valid=_is_head
    )
    heads = _heads(bodies, errors)
    try:
        _need(view, store, _among(view.store_replicas(store), answered), errors, answers)
        return _merge_head(view, store, heads, errors, answers)
    except StoreNotFound:
        # a quorum of owners never saw the store: before saying it does not exist, ask
        # where its writes went while owners were down (tests/ring/test_ring.py), and its home
        # replicas, which this view may call down wrongly (:func:`_elsewhere`)
        more, at_home = await _elsewhere(transport, view, store, path, answered, answers)
        best = merge_heads(_heads(more, []))
        if best is None:
            _need(view, store, at_home, errors, answers)
            raise
        return best


def _is_head(body: bytes) -> bool:
    try:
        head_from_json(_json(body, "head"))
    except MalformedData:
        return False
    return True


def _heads(bodies: list[bytes], errors: list[BaseException]) -> list[Head]:
    heads = []
    for body in bodies:
        try:
            heads.append(head_from_json(_json(body, "head")))
        except MalformedData as exc:  # a replica answering garbage counts as no answer
            errors.append(exc)
    return heads


async def _ask_many(
    transport: Transport,
    view: RingView,
    stores: Sequence[StoreId],
    path: str,
    items: Sequence[Any],
    decode: Callable[[bytes], list[Any]],
) -> list[tuple[list[Any], list[BaseException]]]:
    """Like :func:`_ask_replicas` for many stores at once: one batched request per node for
    all the stores it is a replica of. Per store: the answers and the errors (a node that
    holds no version of the store counts as StoreNotFound, as the single endpoints say)."""
    by_node: dict[str, list[int]] = {}
    for i, store in enumerate(stores):
        for address in view.store_replicas(store):
            by_node.setdefault(address, []).append(i)

    async def ask_part(address: str, part: list[int]) -> list[tuple[int, Any]]:
        try:
            resp = await transport.request(
                "POST", address, path, json_body={"stores": [items[i] for i in part]}
            )
        except PayloadTooLarge:
            if len(part) == 1:
                raise
            # its answer is more than the node's whole memory budget: asked in halves (not on
            # a 429, which more requests would not help)
            half = len(part) // 2
            return [
                *(await ask_part(address, part[:half])),
                *(await ask_part(address, part[half:])),
            ]
        except (Unavailable, InvalidRequest):
            raise
        except StateStoreError as exc:  # e.g. a node older than the batched reads (404):
            # not an answer about any store, so the caller may fall back to single reads
            raise NodeUnavailable(f"{address} does not serve {path} ({exc})") from exc
        answers = decode(resp.body)
        if not isinstance(answers, list) or len(answers) != len(part):
            raise MalformedData(f"{address} answered {path} for the wrong number of stores")
        return list(zip(part, answers, strict=True))

    async def ask(address: str, idxs: list[int]) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        for j in range(0, len(idxs), BATCH_STORES):
            out += await ask_part(address, idxs[j : j + BATCH_STORES])
        return out

    nodes = list(by_node.items())
    results = await asyncio.gather(*(ask(a, idxs) for a, idxs in nodes), return_exceptions=True)
    per: list[tuple[list[Any], list[BaseException]]] = [([], []) for _ in stores]
    for (address, idxs), r in zip(nodes, results, strict=True):
        if isinstance(r, BaseException):
            if not isinstance(r, StateStoreError):
                raise r
            for i in idxs:
                per[i][1].append(r)
            continue
        for i, answer in r:
            if answer is None:
                per[i][1].append(StoreNotFound(f"store {stores[i]} has no version on {address}"))
            else:
                per[i][0].append(answer)
    return per


async def read_heads(transport: Transport, view: RingView, stores: Sequence[StoreId]) -> list[Head]:
    """:func:`read_head` of many stores, in one ``POST /v1/heads`` per node."""
    per = await _ask_many(
        transport,
        view,
        stores,
        "/v1/heads",
        [s.path for s in stores],
        _heads_of,
    )
    out = []
    for store, (answers, errors) in zip(stores, per, strict=True):
        if not set(view.previous_replicas(store.path)) <= set(view.store_replicas(store)):
            # owners that are not all its home replicas: read alone, with a read quorum of
            # those too (:func:`_home_need`)
            out.append(await read_head(transport, view, store))
            continue
        try:
            out.append(_merge_head(view, store, answers, errors))
        except StoreNotFound:
            out.append(await read_head(transport, view, store))  # with its stand-ins
    return out


def _heads_of(body: bytes) -> list[Any]:
    obj = _json(body, "batched heads")
    heads = obj.get("heads") if isinstance(obj, dict) else None
    if not isinstance(heads, list):
        raise MalformedData("batched heads: the answer has no list of heads")
    return [None if h is None else head_from_json(h) for h in heads]


def _json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise MalformedData(f"{what} is not JSON ({exc})") from exc


async def read_versions(transport: Transport, view: RingView, store: StoreId) -> list[int]:
    """The store's retained versions, oldest first (a read quorum of its replicas)."""
    return (await read_retention(transport, view, store)).versions


@dataclass(frozen=True)
class Retention:
    """What a store's replicas retain: its versions (oldest first, none below a floor one of
    them answered) and how many versions its writer asked them to keep (``retain=N``; None
    when none did: the nodes' ``--retain`` applies). Where replicas differ, the most kept."""

    versions: list[int]
    retain: int | None


async def read_retention(transport: Transport, view: RingView, store: StoreId) -> Retention:
    path = f"/v1/stores/{store.path}/versions"
    bodies, errors, answered = await _ask_replicas(transport, view, store, path, home=True)
    _need(view, store, _among(view.store_replicas(store), answered), errors)
    if not bodies:  # as read_head: asked elsewhere before the store is said not to exist
        bodies, at_home = await _elsewhere(transport, view, store, path, answered)
        if not bodies:
            _need(view, store, at_home, errors)
    out: set[int] = set()
    floor = 0
    retain: int | None = None
    for o in map(json.loads, bodies):
        out.update(int(v) for v in o["versions"])
        floor = max(floor, int(o.get("floor", 0)))
        asked = o.get("retain")
        if type(asked) is int and 1 <= asked <= MAX_RETAIN:  # else a node of an older build
            retain = max(retain or 0, asked)
    if not out:
        raise StoreNotFound(f"store {store} has no committed version: commit one first")
    return Retention(sorted(v for v in out if v >= floor), retain)


def _merge_chain(
    view: RingView,
    store: StoreId,
    version: int,
    bodies: list[bytes],
    errors: list[BaseException],
    answers: int | None = None,
) -> list[Manifest]:
    # "Not found" takes a read quorum, as for heads: an isolated node's view names it the
    # store's only replica, and its StoreNotFound ended a restore of a store with acknowledged
    # versions (statestore-sim seed 263719285619475, docs/reliability.md); a version missing
    # from fewer answers may be on the replicas that were silent. A chain that resolves is
    # used as it comes (a restore from the last replica standing, tests/ring/test_ring.py).
    not_found = [e for e in errors if isinstance(e, NotFound)]
    answered = len(bodies) + len(not_found)
    if answers is not None:  # a per-request consistency asks for this many answers first
        _need(view, store, answered, errors, answers)
    if not bodies:
        _need(view, store, answered, errors)
        sem = first_semantic(errors)
        if sem is not None:
            raise sem
        raise NodeUnavailable(
            f"no replica of {store} answered: " + "; ".join(str(e) for e in errors)
        )
    # every replica's manifests, one per (version, kind, epoch): the chain follows the head's
    # lineage through them (core/manifest.py), not the highest epoch of each version
    deltas, snaps = candidates(m for body in bodies for m in decode_chain(body))
    try:
        return resolve_chain(store, version, deltas, snaps)
    except VersionNotFound:
        _need(view, store, answered, errors, answers)
        raise


async def read_chain(
    transport: Transport,
    view: RingView,
    store: StoreId,
    version: int,
    answers: int | None = None,
) -> list[Manifest]:
    """The manifests to apply for ``version``, merged over the store's replicas (at least
    ``answers`` of them when given: a per-request consistency)."""
    path = f"/v1/stores/{store.path}/chain?version={version}"
    bodies, errors, answered = await _ask_replicas(transport, view, store, path, answers)
    try:
        return _merge_chain(view, store, version, bodies, errors, answers)
    except NotFound as first:
        # not on a quorum of owners: the manifests may be where writes went while owners
        # were down, or on home replicas this view calls down (as read_head); merged with
        # what the owners have. And, when the chain has a gap under the version asked for,
        # on the owners that did not answer yet: a version it needs can be missing from a
        # read quorum's answers where one owner missed it and the other, a 0.1.0 node,
        # answers only down to its first missing version (docs/operations.md, "Versions and
        # upgrades"; tests/ring/test_stand_ins.py)
        gap = isinstance(first, VersionNotFound) and first.gap is not None
        more, at_home = await _elsewhere(
            transport, view, store, path, answered, answers, owners=gap
        )
        verdict = first
        if more:
            try:
                return _merge_chain(view, store, version, bodies + more, errors, answers)
            except NotFound as exc:
                verdict = exc
        _need(view, store, at_home, errors, answers)
        raise verdict from None


async def read_chains(
    transport: Transport, view: RingView, wanted: Sequence[tuple[StoreId, int]]
) -> list[list[Manifest]]:
    """:func:`read_chain` of many (store, version) pairs, in one ``POST /v1/chains`` per
    node."""
    stores = [s for s, _ in wanted]
    per = await _ask_many(
        transport,
        view,
        stores,
        "/v1/chains",
        [[s.path, v] for s, v in wanted],
        _unpack_list,
    )
    out = []
    for (store, version), (answers, errors) in zip(wanted, per, strict=True):
        try:
            out.append(_merge_chain(view, store, version, answers, errors))
        except NotFound:
            out.append(await read_chain(transport, view, store, version))  # with stand-ins
    return out


def _unpack_list(body: bytes) -> list[Any]:
    try:
        out = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise MalformedData(f"batched chains do not decode ({exc})") from exc
    if not isinstance(out, list):
        raise MalformedData("batched chains are not a list")
    return out


async def fetch_chunk(
    transport: Transport,
    view: RingView,
    store: StoreId,
    version: int,
    ref: ChunkRef,
    stats: ReadStats,
    *,
    skip: Callable[[str], bool] | None = None,
) -> bytes:
    """Fetch one chunk from the first holder that returns verified bytes."""
    key = chunk_key(store, version, ref.name)

    async def read(address: str) -> bytes:
        resp = await transport.request(
            "GET", address, f"/v1/chunks/{key}", max_bytes=max(ref.size, ERROR_BYTES)
        )
        verify(resp.body, ref.checksum, key)
        return resp.body

    def failed(_address: str, _exc: StateStoreError) -> None:
        stats.failovers += 1

    order = [a for a in view.read_order(key) if skip is None or not skip(a)]
    address, body = await first_holder(key, order, read, on_failover=failed)
    stats.chunks += 1
    stats.bytes += len(body)
    stats.by_node[address] = stats.by_node.get(address, 0) + len(body)
    return body


async def fetch_part(
    transport: Transport,
    view: RingView,
    store: StoreId,
    version: int,
    ref: ChunkRef,
    span: tuple[int, int],
    expected: int,
    stats: ReadStats,
    skipped: list[StateStoreError] | None = None,
) -> bytes:
    """Fetch bytes ``span`` = (offset, length) of one chunk (a blocked chunk's index or one
    block) from the first holder whose answer has checksum ``expected``; what each holder
    skipped answered goes to ``skipped`` when given."""
    key = chunk_key(store, version, ref.name)
    offset, length = span
    what = f"{key} bytes {offset}+{length}"

    async def read(address: str) -> bytes:
        resp = await transport.request(
            "GET",
            address,
            f"/v1/chunks/{key}?offset={offset}&length={length}",
            max_bytes=max(length, ERROR_BYTES),
        )
        verify(resp.body, expected, what)
        return resp.body

    def failed(_address: str, exc: StateStoreError) -> None:
        stats.failovers += 1
        if skipped is not None:
            skipped.append(exc)

    address, body = await first_holder(key, view.read_order(key), read, on_failover=failed)
    stats.parts += 1
    stats.bytes += len(body)
    stats.by_node[address] = stats.by_node.get(address, 0) + len(body)
    return body


class ReadBudget(Protocol):
    """Memory a reader takes before it decodes what a writer's word sized, and gives back
    (a node's request lease, node/budget.Lease)."""

    async def take(self, nbytes: int, what: str) -> None: ...

    async def give(self, nbytes: int) -> None: ...


async def _decoding(budget: ReadBudget | None, data: bytes, max_raw: int, what: str) -> int:
    """Take from ``budget`` (if any) what decoding ``data`` makes at most (core/chunk's
    decoded_bound: its frames' own declared sizes); what was taken, to give back."""
    if budget is None:
        return 0
    bound = decoded_bound(data, max_raw)
    await budget.take(bound, what)
    return bound


async def _hold_instead(budget: ReadBudget, taken: int, cost: int, what: str) -> int:
    """Turn ``taken`` of ``budget`` (a decode's bound) into ``cost`` (what its rows hold),
    never holding less than the rows meanwhile; what is held now (none if refused)."""
    if cost > taken:
        try:
            await budget.take(cost - taken, what)
        except BaseException:
            await budget.give(taken)
            raise
    elif taken > cost:
        await budget.give(taken - cost)
    return cost


async def load_index(
    fetch: Callable[[tuple[int, int], int], Awaitable[bytes]],
    ref: ChunkRef,
    ckey: str,
    cache: ChunkCache,
) -> BlockIndex:
    """Blocked chunk ``ref``'s index: from ``cache``, else fetched by ``fetch(span,
    checksum)``, verified, parsed and cached under ``ckey``."""
    index = cache.get_index(ckey)
    if index is None:
        span = index_span(ref.size, ref.index_len)
        raw = await fetch(span, ref.index_checksum)
        index = parse_index(raw, what=ckey, limit=span[0] - 1)
        cache.put_index(ckey, index)
    return index


async def read_block_rows(
    fetch: Callable[[tuple[int, int], int], Awaitable[bytes]],
    ref: ChunkRef,
    ckey: str,
    group: int,
    key: bytes,
    cache: ChunkCache,
    *,
    max_raw: int = MAX_CHUNK_RAW,
    budget: ReadBudget | None = None,
    held: list[int] | None = None,
) -> dict[bytes, bytes | None] | None:
    """The rows of the one block of blocked chunk ``ref`` that can hold ``key`` (None if no
    block can): its index and that block, each fetched by ``fetch(span, checksum)`` unless
    ``cache`` holds it, verified, and cached under ``ckey``. With a ``budget``, its decode is
    taken from it, then what its rows hold, added to ``held`` for the caller to give back."""
    index = await load_index(fetch, ref, ckey, cache)
    i = index.find(group, key)
    if i is None:
        return None
    bkey = f"{ckey}#{i}"
    rows = cache.get(bkey)
    if rows is None:
        frame = await fetch((index.offsets[i], index.lengths[i]), index.checksums[i])
        taken = await _decoding(budget, frame, max_raw, "a point read's block")
        try:
            rows = dict(decode_block(frame, index, i, max_raw=max_raw, what=ckey))
        except BaseException:
            if budget is not None:
                await budget.give(taken)
            raise
        cost = rows_cost(rows)
        if budget is not None:
            taken = await _hold_instead(budget, taken, cost, "a point read's block rows")
            if held is not None:
                held.append(taken)
            else:
                await budget.give(taken)
        cache.put(bkey, rows, cost)
    return rows


BlockPath = list[tuple[int, ChunkRef]]  # (version, chunk) pairs a point read looks into


def cache_key(store: StoreId, version: int, ref: ChunkRef) -> str:
    """What a blocked chunk's index and blocks are cached under: its key and where and what
    its reader expects the index to be, so that a cache shared by readers (a node's, for its
    lookups) gives each only what was verified against its own manifest."""
    return (
        f"{chunk_key(store, version, ref.name)}@{ref.index_checksum:016x}"
        f"+{ref.size}-{ref.index_len}"
    )


def block_path(chain: Sequence[Manifest], key: bytes) -> BlockPath | None:
    """The chunks a point read of ``key`` looks into, newest manifest first down to the
    newest snapshot: those with rows whose group range covers the key's group, as (version,
    chunk). None if one of them is not blocked (or the chain is cut by several key-group
    counts): then the read goes chunk by chunk."""
    out = []
    for m in reversed(chain):
        if m.key_groups != chain[-1].key_groups:
            return None
        g = key_group(key, m.key_groups)
        for ref in m.chunks:
            if ref.rows and ref.lo <= g <= ref.hi:
                if not ref.blocked:
                    return None
                out.append((m.version, ref))
        if m.kind == "snapshot":
            break
    return out


Block = tuple[int, ChunkRef, str, int]  # a block of a chunk: (version, chunk, cache key, i)


def blocks_wanted(
    path: Sequence[tuple[int, ChunkRef]],
    store: StoreId,
    group: int,
    key: bytes,
    cache: ChunkCache,
    held: dict[str, dict[bytes, bytes | None]] | None = None,
    ckeys: Sequence[str] | None = None,
) -> tuple[bytes | None, list[Block]] | None:
    """What deciding ``key``'s value along ``path`` (:func:`block_path`) still needs, from
    what ``cache`` holds (and ``held``: the blocks a caller keeps for itself, where every
    block found in ``cache`` is put too, so that it stays while the rest are read): None when
    an index is not cached; else ``(value, [])`` when the blocks held decide (the newest
    naming the key does), or ``(value, blocks)``: the blocks not held, newest first, down to
    the newest block held that names the key (without ``held``, only the first), and
    ``value`` that block's value of the key (None without one): the key's value unless one
    of ``blocks`` names it (:func:`decided`, once they are held). ``ckeys``: the path's
    cache keys (:func:`cache_key`), where the caller keeps them."""
    wanted: list[Block] = []
    for n, (version, ref) in enumerate(path):
        ckey = cache_key(store, version, ref) if ckeys is None else ckeys[n]
        index = cache.get_index(ckey)
        if index is None:
            return None
        i = index.find(group, key)
        if i is None:
            continue
        bkey = f"{ckey}#{i}"
        rows = held.get(bkey) if held is not None else None
        if rows is None:
            rows = cache.get(bkey)
            if rows is None:
                wanted.append((version, ref, ckey, i))
                if held is None:
                    return None, wanted  # not decided by the cache: that is all it asks
                continue
            if held is not None:
                held[bkey] = rows
        if key in rows:
            return rows[key], wanted
    return None, wanted


def decided(
    key: bytes,
    value: bytes | None,
    blocks: Sequence[Block],
    held: dict[str, dict[bytes, bytes | None]],
) -> bytes | None:
    """``key``'s value once ``held`` holds the ``blocks`` :func:`blocks_wanted` returned with
    ``value``: the newest of them naming the key decides, else ``value``."""
    for _v, _ref, ckey, i in blocks:
        rows = held[f"{ckey}#{i}"]
        if key in rows:
            return rows[key]
    return value


async def read_by_blocks(
    path: Sequence[tuple[int, ChunkRef]],
    groups: int,
    fetch_for: Callable[[int, ChunkRef], Callable[[tuple[int, int], int], Awaitable[bytes]]],
    store: StoreId,
    key: bytes,
    cache: ChunkCache,
    *,
    max_raw: int = MAX_CHUNK_RAW,
    budget: ReadBudget | None = None,
) -> bytes | None:
    """``key``'s value along ``path`` (:func:`block_path`, of a chain of ``groups`` key
    groups): of every chunk at once, its index then the one block that can hold the key (two
    round trips whatever the chain's length), and the newest manifest naming the key
    decides. ``budget``: each block's decode is taken from it, then what its rows hold until
    every block is read and the key looked up."""
    if not path:
        return None
    g = key_group(key, groups)
    cached = blocks_wanted(path, store, g, key, cache)
    if cached is not None and not cached[1]:
        return cached[0]
    held: list[int] = []
    try:
        return await _by_blocks(path, g, fetch_for, store, key, cache, max_raw, budget, held)
    finally:
        if budget is not None and held:
            await budget.give(sum(held))


async def _by_blocks(
    path: Sequence[tuple[int, ChunkRef]],
    g: int,
    fetch_for: Callable[[int, ChunkRef], Callable[[tuple[int, int], int], Awaitable[bytes]]],
    store: StoreId,
    key: bytes,
    cache: ChunkCache,
    max_raw: int,
    budget: ReadBudget | None,
    held: list[int],
) -> bytes | None:
    found = await asyncio.gather(
        *(
            read_block_rows(
                fetch_for(version, ref),
                ref,
                cache_key(store, version, ref),
                g,
                key,
                cache,
                max_raw=max_raw,
                budget=budget,
                held=held,
            )
            for version, ref in path
        )
    )
    for rows in found:
        if rows is not None and key in rows:
            return rows[key]
    return None


async def lookup_keys(
    transport: Transport,
    view: RingView,
    store: StoreId,
    groups: int,
    path: BlockPath,
    keys: Sequence[bytes],
    stats: ReadStats,
) -> list[bytes | None]:
    """The values of ``keys`` (None: absent) along ``path`` (:func:`block_path`, every key's
    group covered by it), read by one node (``POST .../lookup``, node/lookup.py): a holder
    of the path's snapshot chunk, the largest, so that its index and blocks are read from
    the node's own storage and stay in its cache; the next holder when one fails."""
    request = LookupRequest(
        groups,
        [k.hex() for k in keys],
        [LookupPart(v, r.name, r.lo, r.hi, r.size, r.index_len, r.index_checksum) for v, r in path],
    )
    body = msgspec.json.encode(request)
    anchor = chunk_key(store, path[-1][0], path[-1][1].name)

    async def read(address: str) -> list[bytes | None]:
        resp = await transport.lookup(address, store.path, body)
        stats.bytes += len(resp.body)
        return _lookup_values(resp.body, len(keys), address)

    def failed(_address: str, _exc: StateStoreError) -> None:
        stats.failovers += 1

    _, values = await first_holder(anchor, view.read_order(anchor), read, on_failover=failed)
    stats.parts += 1
    return values


def lookup_fits(key: bytes, path: BlockPath) -> bool:
    """Whether a lookup can read ``key`` along ``path`` (a key, a chain and indexes within a
    lookup's bounds, wire/bodies.py); else it is read by parts or by groups."""
    return (
        len(key) <= MAX_LOOKUP_KEY_HEX // 2
        and len(path) <= MAX_LOOKUP_PATH
        and all(r.index_len <= MAX_LOOKUP_INDEX for _, r in path)
        and sum(r.index_len for _, r in path) <= MAX_LOOKUP_INDEX_BYTES
    )


def _lookup_values(body: bytes, n: int, address: str) -> list[bytes | None]:
    """A lookup's answer, checked; one that is not ``n`` values or nils is the node's fault:
    the next holder is asked (CorruptChunk)."""
    try:
        values = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise CorruptChunk(f"the lookup answer of {address} does not decode ({exc})") from exc
    if (
        not isinstance(values, list)
        or len(values) != n
        or not all(v is None or isinstance(v, bytes) for v in values)
    ):
        raise CorruptChunk(f"the lookup answer of {address} is not {n} values or nils")
    return values


async def read_key(
    transport: Transport,
    view: RingView,
    store: StoreId,
    version: int,
    key: bytes,
    cache: ChunkCache,
    *,
    max_raw: int = MAX_CHUNK_RAW,
    budget: ReadBudget | None = None,
) -> bytes | None:
    """The value of ``key`` at ``version`` (None if absent): a point read.

    Of blocked chunks (:func:`read_by_blocks`), it fetches the index and the one block the key
    can be in of every chunk covering the key's group down to the newest snapshot, all at
    once. Else it walks the chain from the newest manifest down and stops at the first that
    mentions the key, fetching only the chunks of the key's key group. What is fetched is
    cached decoded, counted in the cache at what its rows take (the manifest's raw size is
    its writer's word). ``budget`` (a node's: its request's lease) holds one chunk's or
    block's decode at a time: what it makes at most (its frames' declared sizes) while it
    decodes, then what its rows hold until the key is looked up in them.
    """
    chain = await read_chain(transport, view, store, version)
    stats = ReadStats(chain=len(chain))
    path = block_path(chain, key)
    if path is not None:

        def fetch_for(
            version: int, ref: ChunkRef
        ) -> Callable[[tuple[int, int], int], Awaitable[bytes]]:
            return partial(fetch_part, transport, view, store, version, ref, stats=stats)

        groups = chain[-1].key_groups
        return await read_by_blocks(
            path, groups, fetch_for, store, key, cache, max_raw=max_raw, budget=budget
        )
    loop = asyncio.get_running_loop()
    for m in reversed(chain):
        g = key_group(key, m.key_groups)
        for ref in m.chunks:
            if not ref.lo <= g <= ref.hi:
                continue
            ckey = chunk_key(store, m.version, ref.name)
            rows = cache.get(ckey)
            held = 0  # of the budget, for these rows until the key is looked up in them
            if rows is None:
                data = await fetch_chunk(transport, view, store, m.version, ref, stats)
                taken = await _decoding(budget, data, max_raw, "a point read's chunk")
                try:
                    decoded = await loop.run_in_executor(
                        None, partial(decode_chunk, data, max_raw=max_raw, what=ref.name)
                    )
                except BaseException:
                    if budget is not None:
                        await budget.give(taken)
                    raise
                rows = dict(decoded)
                cost = rows_cost(rows)
                if budget is not None:
                    held = await _hold_instead(budget, taken, cost, "a point read's rows")
                cache.put(ckey, rows, cost)
            try:
                if key in rows:
                    return rows[key]
            finally:
                if budget is not None and held:
                    await budget.give(held)
        if m.kind == "snapshot":
            break
    return None
