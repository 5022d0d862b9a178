"""The write path, shared by the client and the node's compactor: chunks then manifest, at W.

Each chunk goes to its own R replicas (its key has its own token, so a store's chunks spread
over the whole ring); the manifest goes to the store's R replicas last, so a manifest that
any node holds only ever names chunks that were already acknowledged at W (docs/design.md,
Writes). A fencing refusal from any replica fails the commit with StaleEpoch.

Once a chunk has W acknowledgements the commit goes on to the next step, and the chunk's
replicas still writing get their grace period *behind* it (``REST``, net/quorate.py): a
chunk is named by its checksum, so no replica can hold other content under its key, and
the copy only adds redundancy. A manifest waits for every replica's answer (up to the
grace): a replica may hold a manifest that never reached W (a newer writer's failed
commit, another attempt at the same epoch), and its refusal is what fences the next writer
(docs/design.md, "A commit hears every replica").

An acknowledgement is a well-formed answer naming what was stored (wire/bodies ``ChunkAck``,
``ManifestAck``), not any 2xx: a replica (or an impostor) answering an empty 200 counts as
a failed write. Before any chunk goes out, the store's replicas are asked for its head: a
writer already fenced by a newer epoch is refused there, so a fenced commit leaves no chunks
behind (a writer fenced between this check and its manifest still can; repair does not
collect such orphans yet). A compactor's snapshot skips that check: it is fenced by the
head's lineage at its manifest (node/replica.py), and the chunks of one refused there go
when the retention floor passes its version.

Quotas (node/quotas.py): when the ring view says some node enforces per-query quotas, the
writer asks every node it is about to write to whether the bytes it will send there fit
(``GET /v1/queries/{q}/room``), and a refusal fails the commit with QuotaExceeded before any
chunk is sent. A replica's own refusal of a manifest, or of a chunk before W acknowledged it
(a write that raced the check), fails the commit too, as fencing does. A compactor's
snapshot is sent with ``compaction=1``, never charged: it is what lets retention free old
versions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from statestore.core.chunk import EncodedChunk
from statestore.core.errors import (
    AccessDenied,
    InsufficientStorage,
    MalformedData,
    NodeUnavailable,
    NotFound,
    QuotaExceeded,
    StaleEpoch,
    StateStoreError,
    VersionConflict,
)
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import Manifest
from statestore.core.quorum import check_write_sets, home_need
from statestore.core.quota import RECORD_SEAL
from statestore.core.view import RingView
from statestore.net.quorate import Rest, until_enough
from statestore.net.transport import Response, Transport
from statestore.wire.bodies import MAX_HAVE_ITEMS, ChunkAck, ManifestAck, decode_json
from statestore.wire.head import from_json as head_from_json
from statestore.wire.manifest import encode_manifest

__all__ = [
    "WriteStats",
    "check_fence",
    "check_room",
    "put_chunks",
    "put_manifest",
    "write_commit",
]


@dataclass
class WriteStats:
    chunks: int = 0
    bytes: int = 0
    replica_writes: int = 0


Ack = Callable[[Response], bool]


def _chunk_ack(key: str) -> Ack:
    return lambda resp: decode_json(resp.body, ChunkAck, "chunk acknowledgement").stored == key


def _manifest_ack(resp: Response) -> bool:
    decode_json(resp.body, ManifestAck, "manifest acknowledgement")
    return True


async def _put_one(
    transport: Transport,
    address: str,
    path: str,
    body: bytes,
    headers: dict[str, str] | None,
    ack: Ack,
) -> None:
    resp = await transport.request("PUT", address, path, body=body, headers=headers)
    try:
        good = ack(resp)
    except MalformedData:
        good = False
    if not good:
        raise NodeUnavailable(
            f"replica {address} answered PUT {path} with {resp.status} but no valid "
            f"acknowledgement ({resp.body[:80]!r}): not counted as a copy"
        )


# What a write does with its replicas' requests still running once it has W acknowledgements
# (net/quorate.py), by item: "behind", they get their grace period behind the write, which
# returns at once; "wait", the write waits for them up to the grace. bench/elastic.py
# alternates settings side by side.
REST: dict[str, Rest] = {"chunk": "behind", "manifest": "wait"}

# refusals that decide a write whatever the other replicas say (a credential one replica
# refuses is not one: the others may take it)
_FINAL = (StaleEpoch, VersionConflict, QuotaExceeded)


async def _put_everywhere(
    transport: Transport,
    addresses: list[str],
    path: str,
    body: bytes,
    ack: Ack,
    headers: dict[str, str] | None = None,
    enough: Callable[[set[str]], bool] | None = None,
    rest: Rest = "wait",
) -> tuple[set[str], list[BaseException]]:
    """PUT to every address; returns the addresses that acknowledged, and the errors.

    ``enough(acked)``: once true (or once a replica refused for good), the replicas that
    have not answered get a grace period, not their whole timeout, as ``rest`` says
    (net/quorate.py, :data:`REST`): waited for, or behind the write, which returns at
    once. W acknowledgements meet every higher epoch's quorum without them."""

    def done_enough(done: dict[int, BaseException | None]) -> bool:
        if any(isinstance(r, _FINAL) for r in done.values()):
            return True
        acked = {addresses[i] for i, r in done.items() if not isinstance(r, BaseException)}
        return enough is not None and enough(acked)

    results = await until_enough(
        [_put_one(transport, a, path, body, headers, ack) for a in addresses],
        done_enough,
        f"PUT {path}",
        rest=rest,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors:
        if not isinstance(e, StateStoreError):
            raise e
    acked = {a for a, r in zip(addresses, results, strict=True) if not isinstance(r, BaseException)}
    return acked, errors


def _check(
    what: str,
    acked: set[str],
    current: list[str],
    future: list[str],
    w: int,
    errors: list[BaseException],
    homes: list[str] | None = None,
) -> None:
    """Refusals of the caller's credential and full disks first, then W of the current
    owners and W of the future ones, and of the home replicas for a manifest
    (core/quorum.check_write_sets)."""
    acks = min(sum(1 for a in current if a in acked), sum(1 for a in future if a in acked))
    if homes and not set(current) <= set(homes):  # below W of the home replicas: say why too
        acks = min(acks, sum(1 for a in homes if a in acked) + w - home_need(homes, w))
    _full_disks(what, acks, w, errors)
    check_write_sets(what, acked, current, future, w, errors, homes or ())


def _full_disks(what: str, acks: int, quorum: int, errors: list[BaseException]) -> None:
    """Below W because the caller's credential was refused, or because replicas' disks are
    full: say so (401/403, 507), not "quorum not reached"."""
    for e in errors:
        if acks < quorum and isinstance(e, AccessDenied):
            raise e
    full = [e for e in errors if isinstance(e, InsufficientStorage)]
    if acks < quorum and full:
        raise InsufficientStorage(
            f"{what}: {acks} of {quorum} replicas stored it; {len(full)} are read-only with a "
            f"full disk ({full[0]}): free space on them or add nodes"
        )


def _quorum_of(
    current: list[str], future: list[str], w: int, homes: list[str] | None = None
) -> Callable[[set[str]], bool]:
    """W acknowledgements from the current owners and W from the future ones (and from the
    home replicas, ``homes``, for a manifest: core/quorum.home_need)."""
    need_c, need_f = min(w, len(current)), min(w, len(future))
    home = homes or []
    need_h = home_need(home, w)
    return lambda acked: (
        sum(1 for a in current if a in acked) >= need_c
        and sum(1 for a in future if a in acked) >= need_f
        and sum(1 for a in home if a in acked) >= need_h
    )


async def put_chunks(
    transport: Transport,
    view: RingView,
    store: StoreId,
    version: int,
    chunks: list[EncodedChunk],
    *,
    concurrency: int = 8,
    stats: WriteStats | None = None,
    acks: int | None = None,
    compaction: bool = False,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Store every chunk on its R replicas (and its pending owners while nodes join or
    leave); raises QuorumNotReached below W (or ``acks``) for any chunk, QuotaExceeded if a
    replica refused one over its query's quota. ``headers``: sent with every chunk (a
    compactor's drop marks, node/tombstones.py)."""
    sem = asyncio.Semaphore(concurrency)
    suffix = "?compaction=1" if compaction else ""

    async def one(chunk: EncodedChunk) -> None:
        key = chunk_key(store, version, chunk.name)
        targets = view.write_replicas_of(key)
        current, future = view.replicas_of(key), view.future_replicas_of(key)
        w = view.write_quorum if acks is None else acks
        async with sem:
            acked, errors = await _put_everywhere(
                transport,
                targets,
                f"/v1/chunks/{key}{suffix}",
                chunk.data,
                _chunk_ack(key),
                dict(headers) if headers else None,
                enough=_quorum_of(current, future, w),
                rest=REST["chunk"],
            )
        for e in errors:
            if isinstance(e, QuotaExceeded):
                raise e
        _check(f"chunk {key}", acked, current, future, w, errors)
        if stats is not None:
            stats.chunks += 1
            stats.bytes += len(chunk.data)
            stats.replica_writes += len(acked)

    await asyncio.gather(*(one(c) for c in chunks))


async def put_manifest(
    transport: Transport,
    view: RingView,
    m: Manifest,
    retain: int | None = None,
    acks: int | None = None,
    compaction: bool = False,
    headers: Mapping[str, str] | None = None,
) -> int:
    """Store the manifest on the store's replicas; returns the acks. Fencing errors win.
    ``headers``: sent besides its content type (as :func:`put_chunks`').

    ``retain`` asks the replicas to keep the store's last ``retain`` versions instead of
    their ``--retain`` default (Spark's ``minBatchesToRetain``)."""
    targets = view.store_write_replicas(m.store)
    path = f"/v1/manifests/{m.store.path}/{m.version}/{m.kind}"
    params = ([f"retain={retain}"] if retain is not None else []) + (
        ["compaction=1"] if compaction else []
    )
    if params:
        path += "?" + "&".join(params)
    key = m.store.path
    w = view.write_quorum if acks is None else acks
    current, future = view.replicas_of(key), view.future_replicas_of(key)
    # W of the home replicas too: a stand-in's copy is a hint (core/quorum.home_need)
    homes = view.write_homes(key)
    targets += [a for a in view.live_home_replicas(key) if a not in targets]
    acked, errors = await _put_everywhere(
        transport,
        targets,
        path,
        encode_manifest(m),
        _manifest_ack,
        {"Content-Type": "application/msgpack", **(headers or {})},
        enough=_quorum_of(current, future, w, homes),
        rest=REST["manifest"],
    )
    for e in errors:
        if isinstance(e, StaleEpoch | VersionConflict | QuotaExceeded):
            raise e
    what = f"manifest of {m.store} v{m.version}"
    _check(what, acked, current, future, w, errors, homes)
    return len(acked)


async def check_fence(transport: Transport, view: RingView, m: Manifest) -> None:
    """Raise StaleEpoch if a replica of ``m.store`` holds a head of a higher epoch than
    ``m.epoch``. W answers of the current owners and W of the future ones are enough: they
    meet the replicas that acknowledged any higher epoch's commit, and the manifest write,
    which hears every replica, checks again (replicas that do not answer, answer garbage or
    are not waited for are left to it)."""
    path = f"/v1/stores/{m.store.path}/head"
    targets = view.store_write_replicas(m.store)
    key = m.store.path
    quorum = _quorum_of(view.replicas_of(key), view.future_replicas_of(key), view.write_quorum)

    def enough(done: dict[int, Response | BaseException]) -> bool:
        # W of the current owners and W of the future ones, as a commit is acknowledged
        answered = {
            targets[i]
            for i, r in done.items()
            if not isinstance(r, BaseException) or isinstance(r, NotFound)
        }
        return quorum(answered)

    results = await until_enough(
        [transport.request("GET", a, path) for a in targets],
        enough,
        f"GET {path}",
        rest="run",
    )
    for r in results:
        if isinstance(r, Response):
            try:
                head = head_from_json(r.json())
            except (MalformedData, ValueError):
                continue
            if head.epoch > m.epoch:
                raise StaleEpoch(
                    f"store {m.store} is at epoch {head.epoch}; a writer with epoch {m.epoch} "
                    "is fenced: a newer writer took over, so stop this one (nothing was written)"
                )
        elif not isinstance(r, StateStoreError):
            raise r


async def check_room(
    transport: Transport, view: RingView, manifest: Manifest, chunks: list[EncodedChunk]
) -> None:
    """Raise QuotaExceeded if a node this commit writes to has no room for what it would get
    (its chunks and the manifest) under the query's quota. Nodes that do not answer are left
    to the writes themselves, which check again."""
    sends: dict[str, list[tuple[str, int]]] = {}
    for chunk in chunks:
        key = chunk_key(manifest.store, manifest.version, chunk.name)
        for address in view.write_replicas_of(key):
            sends.setdefault(address, []).append((key, len(chunk.data)))
    size = len(encode_manifest(manifest)) + RECORD_SEAL  # as the replica stores it
    extra = dict.fromkeys(view.store_write_replicas(manifest.store), size)
    query = manifest.store.query
    # the chunks each node would get (those it holds already, a retry's, count nothing there)
    # and the manifest; batches bounded as the node bounds them
    asks = []
    for address in sends.keys() | extra.keys():
        items = sends.get(address, [])
        for i in range(0, max(len(items), 1), MAX_HAVE_ITEMS):
            body = {
                "chunks": items[i : i + MAX_HAVE_ITEMS],
                "bytes": extra.get(address, 0) if i == 0 else 0,
            }
            asks.append(
                transport.request("POST", address, f"/v1/queries/{query}/room", json_body=body)
            )
    results = await asyncio.gather(*asks, return_exceptions=True)
    for r in results:
        if isinstance(r, QuotaExceeded | AccessDenied):
            raise r
        if isinstance(r, BaseException) and not isinstance(r, StateStoreError):
            raise r


async def write_commit(
    transport: Transport,
    view: RingView,
    manifest: Manifest,
    chunks: list[EncodedChunk],
    *,
    concurrency: int = 8,
    retain: int | None = None,
    acks: int | None = None,
    compaction: bool = False,
    headers: Mapping[str, str] | None = None,
) -> WriteStats:
    """Write one commit: fencing check, room check (quotas on), chunks, manifest, each
    acknowledged by W replicas (``acks`` instead: a per-request consistency,
    core/quorum.write_acks; every replica is written to whatever ``acks`` says, it only
    decides how many acknowledgements make the commit succeed). ``compaction``: a
    compactor's snapshot (node/compaction.py), never charged to a quota, and fenced by the
    replicas' manifest write alone, by the head's lineage rather than its epoch
    (node/replica.py ``_fence_head``): the head's epoch would refuse a rung below the
    version a newer writer started at. ``headers``: sent with
    each chunk and the manifest (a compactor's drop marks, node/tombstones.py)."""
    stats = WriteStats()
    if not compaction:
        await check_fence(transport, view, manifest)
        if view.quotas:
            await check_room(transport, view, manifest, chunks)
    await put_chunks(
        transport,
        view,
        manifest.store,
        manifest.version,
        chunks,
        concurrency=concurrency,
        stats=stats,
        acks=acks,
        compaction=compaction,
        headers=headers,
    )
    await put_manifest(transport, view, manifest, retain, acks, compaction, headers)
    return stats
