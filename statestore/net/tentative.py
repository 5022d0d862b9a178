"""Commits and reads within a delay bound, tentative when the bound runs out
(core/tentative.py).

:func:`commit_within` is shared by the client and the node's coordinator: it runs the stable
write (W replicas) and, when that has not finished after half the bound and the caller
allows it, also writes the commit as **hints** to the nodes of the store's preference list
(its replicas, then its stand-ins, net/reads.stand_ins): every chunk, then the manifest as a
hint (``PUT /v1/hints/...?holders=``). Whichever finishes first answers: the stable write
(an ordinary acknowledgement), or the hints once every target answered, or at the bound
whatever holds a hint (at least one node: the commit is *tentative*). Nothing reached by the
bound: DelayBoundExceeded, as without ``allow_tentative``.

:func:`read_reachable` is a read's counterpart (a restore with a delay bound whose quorum
read has not finished after half of it): the best version the nodes that answer hold, the
stable head one replica gives plus the hints above it, marked tentative by the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from statestore.core.chunk import MAX_CHUNK_RAW, EncodedChunk, verify
from statestore.core.errors import (
    DelayBoundExceeded,
    StaleEpoch,
    StateStoreError,
    StoreNotFound,
    Unavailable,
    VersionConflict,
    VersionNotFound,
)
from statestore.core.ids import StoreId, chunk_key
from statestore.core.manifest import Head, Manifest
from statestore.core.stats import RestoreStats
from statestore.core.tentative import Outcome, switch_after, tentative_line
from statestore.core.view import RingView
from statestore.net.failover import first_holder
from statestore.net.quorate import GRACE, until_enough
from statestore.net.reads import read_chain, read_head, stand_ins
from statestore.net.restorer import (
    FOLD,
    HEDGE,
    Restorer,
    decode_measured,
    held_rows,
    hold_fold,
)
from statestore.net.transport import ERROR_BYTES, Transport
from statestore.wire.manifest import decode_chain, encode_manifest
from statestore.wire.tentative import MAX_HOLDERS, decode_outcomes

__all__ = ["ask_outcomes", "commit_within", "hint_targets", "read_reachable", "write_hints"]

T = TypeVar("T")
# what the hint writes get past the bound to say who held them (they stop at the bound)
HINT_GRACE = 0.015
# how long a read within a bound waits on others once one node answered
READ_GRACE = 0.02


def _now() -> float:
    return asyncio.get_running_loop().time()  # the simulator's clock under statestore-sim


def hint_targets(view: RingView, manifest: Manifest) -> list[str]:
    """Where a tentative commit's hints go: the store's replicas, then its stand-ins (as
    many as a hint may name, wire/tentative.MAX_HOLDERS)."""
    owners = view.store_write_replicas(manifest.store)
    return (owners + [a for a in stand_ins(view, manifest.store) if a not in owners])[:MAX_HOLDERS]


async def write_hints(
    transport: Transport,
    view: RingView,
    manifest: Manifest,
    chunks: list[EncodedChunk],
    deadline: float,
    *,
    enough: int,
) -> list[str]:
    """Store the commit as a hint on its targets until ``deadline`` (the event loop's clock) or
    until ``enough`` of them hold it; returns the holders. Fencing refusals (a target that
    holds a higher epoch of the store) are raised: a fenced writer gets no tentative ack."""
    targets = hint_targets(view, manifest)
    holders_q = ",".join(targets)
    path = f"/v1/hints/{manifest.store.path}/{manifest.version}/{manifest.kind}"
    body = encode_manifest(manifest)
    held: list[str] = []
    refused: list[BaseException] = []
    enough_held = asyncio.Event()

    async def one(address: str) -> None:
        try:
            for c in chunks:
                key = chunk_key(manifest.store, manifest.version, c.name)
                await transport.request("PUT", address, f"/v1/chunks/{key}", body=c.data)
            await transport.request(
                "PUT",
                address,
                f"{path}?holders={holders_q}",
                body=body,
                headers={"Content-Type": "application/msgpack"},
            )
        except (StaleEpoch, VersionConflict) as exc:
            refused.append(exc)
            enough_held.set()
            return
        except StateStoreError:
            return
        held.append(address)
        if len(held) >= enough:
            enough_held.set()

    tasks = [asyncio.create_task(one(a)) for a in targets]
    waiter = asyncio.create_task(enough_held.wait())
    try:
        await _wait_any(tasks, waiter, deadline)
    finally:
        for t in (*tasks, waiter):
            t.cancel()
        await asyncio.gather(*tasks, waiter, return_exceptions=True)
    if refused:
        raise refused[0]
    return held


async def _wait_any(
    tasks: list[asyncio.Task[None]], waiter: asyncio.Task[Any], deadline: float
) -> None:
    """Until every task is done, ``waiter`` is, or the deadline passed."""
    pending: set[asyncio.Task[Any]] = {*tasks}
    while pending and not waiter.done():
        left = deadline - _now()
        if left <= 0:
            return
        _, pending = await asyncio.wait(
            {*pending, waiter}, timeout=left, return_when=asyncio.FIRST_COMPLETED
        )
        pending.discard(waiter)


async def commit_within(
    stable: Callable[[], Coroutine[Any, Any, T]],
    tentative: Callable[[float], Coroutine[Any, Any, T | None]],
    delay_bound: float | None,
    allow_tentative: bool,
    what: str,
    only_tentative: bool = False,
) -> T:
    """Run ``stable()`` within ``delay_bound``; with ``allow_tentative``, after
    :func:`switch_after` also ``tentative(deadline)`` (it returns None when no node took the
    hint). The first result wins; the other is cancelled. ``only_tentative``: the commit
    builds on a tentative one, so it can only be tentative: the hints alone, at once."""
    if only_tentative:
        assert allow_tentative and delay_bound is not None
        deadline = _now() + delay_bound
        result = await tentative(deadline)
        if result is None:
            raise _exceeded(what, delay_bound)
        return result
    if delay_bound is None:
        return await stable()
    deadline = _now() + delay_bound
    task = asyncio.create_task(stable())
    hints: asyncio.Task[T | None] | None = None
    try:
        if not allow_tentative:
            try:
                return await asyncio.wait_for(asyncio.shield(task), delay_bound)
            except TimeoutError:
                raise _exceeded(what, delay_bound) from None
        await asyncio.wait({task}, timeout=switch_after(delay_bound))
        if task.done():
            exc = task.exception()
            if exc is None:
                return task.result()
            if not isinstance(exc, Unavailable):
                raise exc  # fenced, a conflict, refused: final, tentative or not
        hints = asyncio.create_task(tentative(deadline))
        pending: set[asyncio.Task[Any]] = {hints} if task.done() else {task, hints}
        while pending:
            done, pending = await asyncio.wait(
                pending,
                timeout=max(deadline + HINT_GRACE - _now(), 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                break
            if task in done:
                exc = task.exception()
                if exc is None:
                    return task.result()
                if not isinstance(exc, Unavailable):
                    raise exc
            if hints in done:
                exc = hints.exception()
                if isinstance(exc, StaleEpoch | VersionConflict) or (
                    exc is not None and not isinstance(exc, StateStoreError)
                ):
                    raise exc  # a fencing refusal is final; a bug is not hidden
                if exc is None and (result := hints.result()) is not None:
                    return result
                # no node took the hint, or the fallback read failed: the stable path may
                # still finish within the bound
        raise _exceeded(what, delay_bound)
    finally:
        for t in (task, hints):
            if t is not None:
                t.cancel()
        await asyncio.gather(task, *([hints] if hints else []), return_exceptions=True)


def _exceeded(what: str, bound: float) -> DelayBoundExceeded:
    return DelayBoundExceeded(f"{what} did not finish within its delay bound of {bound:g} s")


async def ask_outcomes(
    transport: Transport, owners: list[str], store: StoreId
) -> list[list[Outcome]]:
    """``GET /v1/stores/{store}/outcomes`` of each owner: the lists of the answers that
    decode (failed and garbled answers left out: one owner's garbage is not the ring's)."""
    path = f"/v1/stores/{store.path}/outcomes"
    results = await asyncio.gather(
        *(transport.request("GET", a, path) for a in owners), return_exceptions=True
    )
    return outcome_answers(results, store)


def outcome_answers(results: list[Any], store: StoreId) -> list[list[Outcome]]:
    """The outcome lists in ``results`` (answers or exceptions) that decode; anything but a
    StateStoreError is raised."""
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
    return answers


# -- reads within a bound ------------------------------------------------------------------
async def _hints_of(
    transport: Transport, view: RingView, store: StoreId
) -> list[tuple[str, Manifest]]:
    """(holder, manifest) of every hint of ``store`` the nodes that answer hold."""
    targets = view.store_replicas(store) + stand_ins(view, store)
    path = f"/v1/hints/{store.path}"
    results = await until_enough(
        [transport.request("GET", a, path) for a in targets], lambda done: bool(done), path
    )
    out: list[tuple[str, Manifest]] = []
    for address, r in zip(targets, results, strict=True):
        if isinstance(r, BaseException):
            if not isinstance(r, StateStoreError):
                raise r
            continue
        try:
            out.extend((address, m) for m in decode_chain(r.body) if m.store == store)
        except StateStoreError:
            continue
    return out


async def read_reachable(
    transport: Transport,
    view: RingView,
    restorer: Restorer,
    store: StoreId,
    *,
    max_raw: int = MAX_CHUNK_RAW,
) -> tuple[dict[bytes, bytes], Manifest, RestoreStats, bool]:
    """The best version the nodes that answer have: the highest head one replica gives,
    with the tentative commits held as hints above it (core/tentative.tentative_line)
    applied on top. Not known stable: the caller marks it tentative. The last value says
    whether the version returned is a hint (a tentative commit not decided yet)."""

    GRACE.set(READ_GRACE)  # this task takes what answers: silent nodes are not waited on
    HEDGE.set(READ_GRACE)

    async def head() -> Head | None:
        try:
            return await read_head(transport, view, store, answers=1)
        except StoreNotFound:
            return None

    top, hinted = await asyncio.gather(head(), _hints_of(transport, view, store))
    line = tentative_line(top.key() if top else None, [m for _, m in hinted])
    if line:
        bottom = line[0]
        base, base_epoch = (
            (0, None) if bottom.kind == "snapshot" else (bottom.version - 1, bottom.base_epoch)
        )
    elif top is not None:
        base, base_epoch = top.version, top.epoch
    else:
        raise StoreNotFound(f"store {store} has no version on the nodes that answered")
    state: dict[bytes, bytes] = {}
    stats = RestoreStats(plan="star", reason="within the delay bound: what answered")
    last: Manifest | None = None
    if base >= 1:
        chain = await read_chain(transport, view, store, base, answers=1)
        if base_epoch is not None and chain[-1].epoch != base_epoch:
            raise VersionNotFound(
                f"{store} v{base} at epoch {base_epoch} (the base of its tentative commits) "
                "is not what the nodes that answered hold"
            )
        result = await restorer.run(
            view, store, chain, restorer.plan_chain(view, store, chain, "star")
        )
        state, stats, last = result.state, result.stats, chain[-1]
    token = FOLD.set(await hold_fold(store, line))  # the tentative commits', beside the base
    try:
        state, last = await _fold_line(transport, store, line, hinted, state, last, stats, max_raw)
    finally:
        FOLD.reset(token)
    return state, last, stats, bool(line)


async def _fold_line(
    transport: Transport,
    store: StoreId,
    line: list[Manifest],
    hinted: list[tuple[str, Manifest]],
    state: dict[bytes, bytes],
    last: Manifest | None,
    stats: RestoreStats,
    max_raw: int,
) -> tuple[dict[bytes, bytes], Manifest]:
    """``state`` with the tentative ``line`` applied on top, each chunk read from a node that
    holds it as a hint."""
    holders: dict[tuple[int, int, str], list[str]] = {}
    for address, m in hinted:
        holders.setdefault((m.epoch, m.version, m.kind), []).append(address)
    for m in line:
        if m.kind == "snapshot":
            state = {}
        for ref in m.chunks:
            key = chunk_key(store, m.version, ref.name)

            async def read(
                address: str, key: str = key, checksum: int = ref.checksum, size: int = ref.size
            ) -> bytes:
                resp = await transport.request(
                    "GET", address, f"/v1/chunks/{key}", max_bytes=max(size, ERROR_BYTES)
                )
                verify(resp.body, checksum, key)
                return resp.body

            _, body = await first_holder(key, holders[(m.epoch, m.version, m.kind)], read)
            stats.bytes_in += len(body)
            rows, raw = decode_measured(body, max_raw, key)
            await held_rows(len(rows), raw)
            for k, v in rows:
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
        last = m
    assert last is not None
    return state, last
