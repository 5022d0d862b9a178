"""Executing a recovery plan at the restorer (the async shell around plan.py).

``Restorer.plan`` reads the chain and builds the plan; ``Restorer.run`` carries it out:

- star: every chunk from its assigned source first, then the other holders, ``fan_in`` at a
  time, decoded on worker threads as they land;
- line / tree: one ``POST /v1/relay`` to the hop nearest the restorer, whose stream carries
  the chunks (line) or the folded rows (tree) of the whole plan.

Whatever a streamed plan did not deliver (a hop died, a chunk was corrupt, the stream went
quiet for too long) is fetched afterwards from the other replicas, skipping the hops that
failed: only the missing part is rerouted, nothing starts over. Which part that is, and from
whom, is decided by :func:`statestore.core.reroute.reroute` over the events the streams
delivered; this module records the events and performs the decision. Rows are folded by chain
position, so a row that arrives twice (folded and again from a replica) is harmless.
``Restorer.run_many`` runs many plans at once and reads the star plans' chunks in one
``POST /v1/chunks`` stream per source before handing each store to ``run``.
Links are measured from every transfer (an EWMA of throughput and latency per source) and
fed back to the planner.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from statestore.core.bucket import TokenBucket
from statestore.core.calibration import Calibration
from statestore.core.chunk import MAX_CHUNK_RAW, decode_chunk, verify
from statestore.core.errors import (
    CorruptChunk,
    StateStoreError,
)
from statestore.core.fold import STATE_ROW_HELD, ChainFold, Positioned, fold_held
from statestore.core.ids import StoreId
from statestore.core.links import LinkTable
from statestore.core.manifest import Manifest
from statestore.core.plan import ChunkTask, CostModel, Plan, build, learn_fold_ratio
from statestore.core.reroute import (
    ChunkArrived,
    Covered,
    FoldedArrived,
    HopFailed,
    Refetch,
    StreamCut,
    StreamEnded,
    StreamEvent,
    reroute,
)
from statestore.core.stats import RestoreStats
from statestore.core.view import RingView
from statestore.net.failover import first_holder
from statestore.net.reads import read_chain
from statestore.net.streams import read_frames
from statestore.net.transport import ERROR_BYTES, Transport
from statestore.wire.frames import decode_folded, encode_hop

__all__ = [
    "FOLD",
    "HEDGE",
    "HOLD",
    "FoldHold",
    "Hold",
    "RecoveryResult",
    "Restorer",
    "chain_tasks",
    "decode_measured",
    "hedge_after",
    "held_rows",
    "hold_fold",
]

Rows = list[tuple[bytes, bytes | None]]
BATCH_KEYS = 4096  # chunks per POST /v1/chunks (the node accepts up to 10,000)


@dataclass
class RecoveryResult:
    state: dict[bytes, bytes]
    chain: list[Manifest]
    plan: Plan
    stats: RestoreStats = field(default_factory=RestoreStats)


def chain_tasks(view: RingView, store: StoreId, chain: Sequence[Manifest]) -> list[ChunkTask]:
    tasks = []
    for pos, m in enumerate(chain):
        for ref in m.chunks:
            key = f"{store.path}/{m.version}/{ref.name}"
            tasks.append(
                ChunkTask(
                    key,
                    pos,
                    m.version,
                    ref.name,
                    ref.checksum,
                    ref.size,
                    ref.raw_size,
                    ref.rows,
                    tuple(view.read_order(key)),
                    ref.lo,
                    ref.hi,
                )
            )
    return tasks


@dataclass
class _Prefetched:
    """What a batched read (:meth:`Restorer.run_many`) delivered for one store."""

    started: float
    fold: ChainFold = field(default_factory=ChainFold)
    events: list[StreamEvent] = field(default_factory=list)
    bytes_in: int = 0
    bytes_by_node: dict[str, int] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)


def hedge_after(size: int) -> float:
    """Seconds a chunk read waits on one holder before asking the next one too: half a
    second (``HEDGE`` of the current task) plus the chunk at 20 MB/s (a paused or overloaded
    holder costs that, not its request timeout; a healthy one answers well within it)."""
    return HEDGE.get() + size / HEDGE_RATE


HEDGE_RATE = 20e6
# the fixed part of hedge_after; a read within a delay bound sets a shorter one for its task
HEDGE: contextvars.ContextVar[float] = contextvars.ContextVar("hedge", default=0.5)


class Hold(Protocol):
    """Where a restore takes the memory its fold holds (node/budget.FoldLease: a memory
    budget's lease), each call with the bytes (core/fold.fold_held) and what for."""

    async def claim(self, nbytes: int, what: str) -> None:
        """What the chain's manifests say the fold holds, before a chunk is read: may wait
        for room, may refuse."""

    async def beyond(self, nbytes: int, what: str) -> None:
        """What the rows decoded hold beyond the claims, as they come: no wait (they are
        held already); refused (RateLimited) when there is no room, which fails the restore
        and drops its rows."""


# a node restoring for a caller, or compacting, sets it for the task; None (a client's own
# restores): nothing is taken
HOLD: contextvars.ContextVar[Hold | None] = contextvars.ContextVar("restore_hold", default=None)


class FoldHold:
    """A node's restore held to its memory budget (:data:`HOLD`): the chain's claims first
    (:func:`hold_fold`), then what the rows it decodes (chunks, a tree's folded frames) hold
    beyond all it took, as a running total: the claims are a writer's word (its manifests'
    sizes) and a tree hop's folded rows a hop's, and either may understate. A chain's
    chunks take nothing more (a chunk's keys and values are within its raw size, which
    counts their encoding too); a tree restore may (a hop cut after its folded rows keeps
    them in the fold its parent sends, and the restorer fetches the chunks again)."""

    def __init__(self, hold: Hold, what: str, taken: int) -> None:
        self._hold = hold
        self.what = what
        self.taken = taken
        self.decoded = 0

    async def rows(self, rows: int, raw: int) -> None:
        """``rows`` rows of ``raw`` bytes (keys and values) decoded into the fold."""
        self.decoded += fold_held([(raw, rows)], STATE_ROW_HELD)
        if self.decoded > self.taken:
            await self._hold.beyond(self.decoded - self.taken, f"{self.what}: rows beyond claims")
            self.taken = self.decoded


# the fold the current restore holds, if a node runs it (set by Restorer.run)
FOLD: contextvars.ContextVar[FoldHold | None] = contextvars.ContextVar("restore_fold", default=None)


async def hold_fold(store: StoreId, chain: Sequence[Manifest]) -> FoldHold | None:
    """Take what folding ``chain`` holds from the task's :data:`HOLD`, if it has one, and
    return what to charge its decoded rows to."""
    hold = HOLD.get()
    if hold is None:
        return None
    cost = fold_held(((c.raw_size, c.rows) for m in chain for c in m.chunks), STATE_ROW_HELD)
    what = f"a restore of {store}"
    await hold.claim(cost, what)
    return FoldHold(hold, what, cost)


def decode_measured(data: bytes, max_raw: int, what: str) -> tuple[Rows, int]:
    """A chunk's rows (core/chunk.decode_chunk) and, when the task's restore holds its fold
    (:data:`FOLD`: a node restoring), the bytes of their keys and values; for an executor
    thread (the context copied into it), off the event loop."""
    rows = decode_chunk(data, max_raw=max_raw, what=what)
    return rows, sum(len(k) + len(v or b"") for k, v in rows) if FOLD.get() is not None else 0


def _folded_measured(data: bytes, max_raw: int) -> tuple[list[Positioned], int]:
    """A tree hop's folded rows and, as :func:`decode_measured`, their bytes."""
    rows = decode_folded(data, max_raw)
    return rows, sum(len(k) + len(v or b"") for k, _, v in rows) if FOLD.get() is not None else 0


async def held_rows(rows: int, raw: int) -> None:
    """Charge decoded rows to the current restore's :data:`FOLD`, if a node runs it."""
    fold = FOLD.get()
    if fold is not None:
        await fold.rows(rows, raw)


class Restorer:
    """Plans and runs restores for one client (its transport, links and limits)."""

    def __init__(
        self,
        transport: Transport,
        *,
        fan_in: int = 16,
        tree_fan_in: int = 2,
        ingress: float | None = None,
        max_raw: int = MAX_CHUNK_RAW,
        model: CostModel | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.fan_in = fan_in
        self.tree_fan_in = tree_fan_in
        self.ingress = ingress
        self.max_raw = max_raw
        self.model = model or CostModel()
        self.links = LinkTable()
        self.clock = clock
        self._fold_ratio: dict[StoreId, float] = {}
        # whether hops may fold (tree plans): their folded rows and the chunks they say they
        # covered are believed as streamed (a node with identity on and no TLS says no: a
        # stream is not proven, core/plan.build)
        self.folds = True
        self.calibration = Calibration()  # per shape: actual / predicted (core/calibration.py)
        self._bucket = (
            TokenBucket(ingress, max(ingress / 10, 1 << 20), clock()) if ingress else None
        )

    async def _throttle(self, nbytes: int) -> None:
        if self._bucket is not None:
            wait = self._bucket.reserve(nbytes, self.clock())
            if wait > 0:
                await asyncio.sleep(wait)

    async def plan(
        self,
        view: RingView,
        store: StoreId,
        version: int,
        kind: str,
        load: Mapping[str, float] | None = None,
    ) -> tuple[list[Manifest], Plan]:
        chain = await read_chain(self.transport, view, store, version)
        return chain, self.plan_chain(view, store, chain, kind, load)

    def plan_chain(
        self,
        view: RingView,
        store: StoreId,
        chain: list[Manifest],
        kind: str,
        load: Mapping[str, float] | None = None,
    ) -> Plan:
        """The plan for a chain already read (no I/O)."""
        tasks = chain_tasks(view, store, chain)
        model = self.model
        if store in self._fold_ratio:  # what the last tree restore of this store showed
            model = replace(model, fold_ratio=self._fold_ratio[store])
        return build(
            kind,
            tasks,
            links=self.links.snapshot(),
            load=load,
            ingress=self.ingress,
            fan_in=self.fan_in,
            tree_fan_in=self.tree_fan_in,
            replicas=view.replicas,
            model=model,
            calibration=self.calibration.factors(),
            avoid=view.leaving(),
            folds=self.folds,
        )

    async def run(
        self,
        view: RingView,
        store: StoreId,
        chain: list[Manifest],
        plan: Plan,
        *,
        progress: Callable[[int], None] | None = None,
        sem: asyncio.Semaphore | None = None,
        prefetched: _Prefetched | None = None,
    ) -> RecoveryResult:
        """Carry out ``plan``; ``prefetched`` holds what :meth:`run_many` already read."""
        token = FOLD.set(await hold_fold(store, chain))
        try:
            return await self._run(view, store, chain, plan, progress, sem, prefetched)
        finally:
            FOLD.reset(token)

    async def _run(
        self,
        view: RingView,
        store: StoreId,
        chain: list[Manifest],
        plan: Plan,
        progress: Callable[[int], None] | None,
        sem: asyncio.Semaphore | None,
        prefetched: _Prefetched | None,
    ) -> RecoveryResult:
        pre = prefetched or _Prefetched(self.clock())
        started = pre.started
        fold = pre.fold
        stats = RestoreStats(
            plan=plan.kind,
            reason=plan.reason,
            predicted_seconds=round(plan.predicted, 4),
            sr3_rule=plan.sr3,
            chunks=len(plan.tasks),
            chain=len(chain),
            bytes_in=pre.bytes_in,
            failed_hops=list(pre.failed),
            bytes_by_node=dict(pre.bytes_by_node),
            batched=sum(1 for e in pre.events if isinstance(e, ChunkArrived) and e.intact),
        )
        events = list(pre.events)
        if plan.kind != "star" and plan.root is not None:
            await self._stream(store, chain[-1].key_groups, plan, fold, events, stats, progress)
        missing = reroute(plan.tasks, plan.assignment, events).missing
        if plan.kind != "star":
            stats.rerouted = len(missing)
        if plan.kind == "tree" and not missing:
            ratio = learn_fold_ratio(plan.tasks, stats.bytes_in)
            if ratio is not None:
                self._fold_ratio[store] = ratio
        await self._star(plan.tasks, missing, fold, stats, progress, sem)
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(None, fold.result)
        stats.seconds = round(self.clock() - started, 4)
        if prefetched is None:  # one of many at once is slowed by the others: not a sample
            self._calibrate(plan, stats.seconds, len(missing))
        return RecoveryResult(state, chain, plan, stats)

    def _calibrate(self, plan: Plan, seconds: float, rerouted: int) -> None:
        """Learn how far off the raw prediction for this shape was (a clean run only). The raw
        prediction is the plan's divided by the factor the plan was built with: restores
        learned from while this one ran have moved the factor since, and dividing by the
        moved one fed the move back into the sample."""
        raw = plan.predictions.get(plan.kind, 0.0) / plan.calibration.get(plan.kind, 1.0)
        if raw <= 0 or (rerouted and plan.kind != "star") or not plan.tasks:
            return
        self.calibration.learn(plan.kind, seconds / raw)

    async def _stream(
        self,
        store: StoreId,
        groups: int,
        plan: Plan,
        fold: ChainFold,
        events: list[StreamEvent],
        stats: RestoreStats,
        progress: Callable[[int], None] | None,
    ) -> None:
        """Run the streamed plan, folding what arrives and recording in ``events`` what the
        stream delivered (core/reroute.py decides from them what is still missing)."""
        assert plan.root is not None
        loop = asyncio.get_running_loop()
        body = encode_hop(store, plan.root, plan.kind == "tree", groups=groups)
        # A stream that goes quiet for too long is abandoned and what it did not deliver is
        # fetched from other replicas. Quiet, not slow: a tree root sends nothing until its
        # subtree is folded, so the allowance scales with the predicted time.
        idle = max(30.0, plan.predicted * 3)
        by_key = {t.key: t for t in plan.tasks}
        stream = None
        pending: list[asyncio.Future[None]] = []
        try:
            async with asyncio.timeout(idle) as quiet:
                stream = await self.transport.open_stream(
                    plan.root.address, f"/v1/relay?store={store.path}", body, timeout=idle
                )
                opened = self.clock()
                async for kind, meta, data, _raw in read_frames(stream, self.max_raw):
                    quiet.reschedule(loop.time() + idle)
                    await self._throttle(len(data))
                    stats.bytes_in += len(data)
                    if progress is not None and data:
                        progress(len(data))
                    if kind == b"C":
                        t = by_key.get(str(meta.get("k")))
                        if t is None:
                            continue
                        source = plan.assignment.get(t.key, "")
                        pending.append(
                            asyncio.ensure_future(self._decode_into(fold, t, data, source, events))
                        )
                    elif kind == b"F":
                        if plan.kind != "tree":
                            continue  # only a tree's hops fold: anything else is not believed
                        folded, raw = await loop.run_in_executor(
                            None, contextvars.copy_context().run, _folded_measured, data,
                            self.max_raw,
                        )  # fmt: skip
                        await held_rows(len(folded), raw)
                        fold.add_folded(folded)
                        g = meta.get("g")
                        if isinstance(g, list) and len(g) == 2:
                            events.append(FoldedArrived(int(g[0]), int(g[1])))
                    elif kind == b"D":
                        if "out" in meta:
                            hop = {k: meta.get(k) for k in ("hop", "depth", "own", "in", "out")}
                            stats.hops.append(hop)
                        if plan.kind == "tree":  # only a tree's hops fold what they cover
                            events.append(Covered(tuple(str(k) for k in meta.get("covers", []))))
                    elif kind == b"E":
                        stats.failed_hops.append(
                            {"hop": meta.get("hop"), "error": meta.get("error")}
                        )
                        events.append(HopFailed(str(meta.get("hop"))))
                events.append(StreamEnded())
                # the root's link, as the whole stream showed it (not frame by frame)
                self.links.observe(plan.root.address, stats.bytes_in, self.clock() - opened)
        except (StateStoreError, asyncio.IncompleteReadError, TimeoutError, OSError) as exc:
            stats.failed_hops.append(
                {"hop": plan.root.address, "error": f"{type(exc).__name__}: {exc}"}
            )
            events.append(StreamCut(plan.root.address, isinstance(exc, TimeoutError)))
        finally:
            if stream is not None:
                stream.close()
            results = await asyncio.gather(*pending, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, CorruptChunk):
                    raise r

    async def run_many(
        self,
        view: RingView,
        jobs: Sequence[tuple[StoreId, list[Manifest], Plan]],
        *,
        progress: Callable[[int], None] | None = None,
        sem: asyncio.Semaphore | None = None,
    ) -> list[RecoveryResult]:
        """Run many plans at once. The chunks of every star plan are read in one stream per
        source (``POST /v1/chunks``) instead of one request per chunk; whatever a stream does
        not deliver, and the line and tree plans, then run as :meth:`run` runs them."""
        now = self.clock()
        pre = [_Prefetched(now) for _ in jobs]
        per_source: dict[str, list[tuple[_Prefetched, ChunkTask]]] = {}
        for p, (_, _, plan) in zip(pre, jobs, strict=True):
            if plan.kind == "star":
                for t in plan.tasks:
                    per_source.setdefault(plan.assignment[t.key], []).append((p, t))
        batches = [
            asyncio.ensure_future(self._batch(address, items[i : i + BATCH_KEYS], progress))
            for address, items in per_source.items()
            for i in range(0, len(items), BATCH_KEYS)
        ]
        # A source that trickles must not hold every store back: past a deadline scaled from
        # the plans' predictions, what has not arrived is fetched the normal way below.
        deadline = max(30.0, 3 * sum(plan.predicted for _, _, plan in jobs))
        try:
            async with asyncio.timeout(deadline):
                await asyncio.gather(*batches)
        except TimeoutError:
            pass
        finally:
            for b in batches:
                b.cancel()
            await asyncio.gather(*batches, return_exceptions=True)
        return list(
            await asyncio.gather(
                *(
                    self.run(view, sid, chain, plan, progress=progress, sem=sem, prefetched=p)
                    for p, (sid, chain, plan) in zip(pre, jobs, strict=True)
                )
            )
        )

    async def _batch(
        self,
        address: str,
        items: Sequence[tuple[_Prefetched, ChunkTask]],
        progress: Callable[[int], None] | None,
    ) -> None:
        """One ``POST /v1/chunks`` stream from ``address``; a chunk it leaves out, or a
        stream that fails, leaves the rest to the per-store fetch that follows."""
        loop = asyncio.get_running_loop()
        by_key = {t.key: (p, t) for p, t in items}
        body = json.dumps({"keys": list(by_key)}).encode()
        pending: list[asyncio.Future[None]] = []
        idle = 30.0
        stream = None
        nbytes = 0
        opened = self.clock()
        try:
            async with asyncio.timeout(idle) as quiet:
                stream = await self.transport.open_stream(address, "/v1/chunks", body)
                async for kind, meta, data, _raw in read_frames(stream, self.max_raw):
                    quiet.reschedule(loop.time() + idle)
                    hit = by_key.get(str(meta.get("k"))) if kind == b"C" else None
                    if hit is None:
                        continue
                    p, t = hit
                    await self._throttle(len(data))
                    nbytes += len(data)
                    p.bytes_in += len(data)
                    p.bytes_by_node[address] = p.bytes_by_node.get(address, 0) + len(data)
                    if progress is not None:
                        progress(len(data))
                    pending.append(
                        asyncio.ensure_future(self._decode_into(p.fold, t, data, address, p.events))
                    )
            self.links.observe(address, nbytes, self.clock() - opened)
        except (StateStoreError, asyncio.IncompleteReadError, TimeoutError, OSError) as exc:
            for p in {id(p): p for p, _ in items}.values():
                p.failed.append({"hop": address, "error": f"{type(exc).__name__}: {exc}"})
                p.events.append(StreamCut(address, isinstance(exc, TimeoutError)))
        finally:
            if stream is not None:
                stream.close()
            results = await asyncio.gather(*pending, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, CorruptChunk):
                    raise r

    async def _decode_into(
        self, fold: ChainFold, t: ChunkTask, data: bytes, source: str, events: list[StreamEvent]
    ) -> None:
        """Check, decode and fold one streamed chunk; record whether it arrived intact."""
        loop = asyncio.get_running_loop()
        try:
            verify(data, t.checksum, t.key)
            rows, raw = await loop.run_in_executor(
                None, contextvars.copy_context().run, decode_measured, data, self.max_raw, t.key
            )
        except CorruptChunk:
            events.append(ChunkArrived(t.key, source, intact=False))
            return
        await held_rows(len(rows), raw)
        fold.add_chunk(t.pos, rows, t.name[:1] in ("s", "w"))
        events.append(ChunkArrived(t.key, source))

    async def _star(
        self,
        tasks: Sequence[ChunkTask],
        missing: Sequence[Refetch],
        fold: ChainFold,
        stats: RestoreStats,
        progress: Callable[[int], None] | None,
        sem: asyncio.Semaphore | None,
    ) -> None:
        sem = sem or asyncio.Semaphore(self.fan_in)
        loop = asyncio.get_running_loop()
        # per source: bytes and the span from its first request to its last answer. Requests
        # to one source overlap, so one request's own rate would understate the source.
        spans: dict[str, list[float]] = {}

        by_key = {t.key: t for t in tasks}

        async def one(r: Refetch) -> None:
            t = by_key[r.key]

            async def read(address: str) -> bytes:
                span = spans.setdefault(address, [self.clock(), 0.0, 0.0])
                resp = await self.transport.request(
                    "GET", address, f"/v1/chunks/{t.key}", max_bytes=max(t.size, ERROR_BYTES)
                )
                span[1] = self.clock()
                span[2] += len(resp.body)
                await self._throttle(len(resp.body))
                verify(resp.body, t.checksum, t.key)
                return resp.body

            def failed(_address: str, _exc: StateStoreError) -> None:
                stats.failovers += 1

            async with sem:  # one slot per chunk: a hedged second ask shares it
                address, body = await first_holder(
                    t.key, r.order, read, on_failover=failed, hedge_after=hedge_after(t.size)
                )
            stats.bytes_in += len(body)
            by = stats.bytes_by_node
            by[address] = by.get(address, 0) + len(body)
            if progress is not None:
                progress(len(body))
            rows, raw = await loop.run_in_executor(
                None, contextvars.copy_context().run, decode_measured, body, self.max_raw, t.key
            )
            await held_rows(len(rows), raw)
            fold.add_chunk(t.pos, rows, t.name[:1] in ("s", "w"))

        tasks_ = [asyncio.ensure_future(one(r)) for r in missing]
        try:
            await asyncio.gather(*tasks_)
            for address, (first, last, nbytes) in spans.items():
                if last > first:
                    self.links.observe(address, int(nbytes), last - first)
        finally:
            for f in tasks_:
                f.cancel()
            await asyncio.gather(*tasks_, return_exceptions=True)
