"""AsyncRingClient: the SDK for asyncio programs (the sync RingClient runs this on a thread)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from statestore.core.cache import ChunkCache
from statestore.core.chunk import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_KEY_GROUPS,
    MAX_CHUNK_RAW,
)
from statestore.core.errors import (
    AccessDenied,
    DelayBoundExceeded,
    InvalidRequest,
    NodeUnavailable,
    NotFound,
    QuorumNotReached,
    RateLimited,
    StateStoreError,
    TentativeRolledBack,
    TlsFailed,
    Unavailable,
)
from statestore.core.ids import StoreId, check_version, chunk_key
from statestore.core.keygroups import chain_for_groups, check_groups, only_groups
from statestore.core.manifest import ChunkRef, Head, Manifest
from statestore.core.plan import Plan
from statestore.core.quorum import check_consistency, read_answers, write_acks
from statestore.core.tentative import ROLLED_BACK, Correction, Outcome, corrections, merge
from statestore.core.view import RingView
from statestore.net.credentials import client_token
from statestore.net.http import HttpTransport
from statestore.net.quorate import finish_left
from statestore.net.reads import (
    BlockPath,
    ReadStats,
    fetch_chunk,
    fetch_part,
    lookup_keys,
    read_chain,
    read_chains,
    read_head,
    read_heads,
    read_key,
    read_versions,
)
from statestore.net.restorer import Restorer
from statestore.net.tentative import ask_outcomes, commit_within, read_reachable, write_hints
from statestore.net.tls import client_context, tls_ca_file
from statestore.net.transport import Transport
from statestore.net.writes import write_commit

from ._core import CommitResult, RestoredState, build_commit, check_plan, check_store, parse_seeds
from ._open import DEFAULT_OPEN_CACHE, AsyncLazyState

__all__ = ["AsyncRingClient"]

T = TypeVar("T")


async def _bounded(what: str, call: Awaitable[T], delay_bound: float | None) -> T:
    """Await ``call``; with a ``delay_bound``, give up after that many seconds with
    DelayBoundExceeded (the request is cancelled: nothing more is sent)."""
    if delay_bound is None:
        return await call
    try:
        return await asyncio.wait_for(call, delay_bound)
    except TimeoutError:
        raise DelayBoundExceeded(
            f"{what} did not finish within its delay bound of {delay_bound:g} s: "
            "the replicas it needs did not all answer in time (a partition, a paused or slow "
            "node); retry, relax the consistency, or raise the bound"
        ) from None


def _check_request(consistency: str, delay_bound: float | None) -> None:
    check_consistency(consistency)
    if delay_bound is not None and (
        not isinstance(delay_bound, int | float) or not delay_bound > 0
    ):
        raise ValueError(f"delay_bound must be a positive number of seconds, got {delay_bound!r}")


class AsyncRingClient:
    """Talks to the ring directly: learns it from any seed, routes to replicas itself.

    Args:
        seeds: ``HOST:PORT`` of one or more nodes (a list or a comma-separated string).
        timeout: seconds for one request to one node.
        concurrency: chunks in flight at once (the restorer's fan-in).
        chunk_size: target raw bytes per chunk.
        block_size: target raw bytes per block of a chunk (each compressed and checksummed on
            its own, so a point read fetches one block: core/chunk.py); 0 writes whole
            chunks, the layout before 0.3.0.
        key_groups: key groups of newly written stores.
        max_chunk: the decompressed size past which a chunk is refused as a bomb.
        ingress: cap on the bytes per second this client takes in while restoring (a token
            bucket); None for no cap. The planner takes it into account.
        tree_fan_in: children per inner hop of a tree plan.
        cache_bytes: decoded chunks kept for point reads (chunks are immutable, so the
            cache is never stale).
        transport: what carries the requests (default: HTTP with ``timeout``); the
            simulator passes an in-memory one (net/memory.py). The client starts and closes
            it either way.
        clock: the restorer's clock (link measurements, the ingress cap).
        token: the bearer token sent with every request to nodes started with
            ``--auth-file`` (default: the ``STATESTORE_TOKEN`` environment variable, else
            the content of the file ``STATESTORE_TOKEN_FILE`` names; SetupError when that
            file cannot be read).
        tls_ca: a PEM file of the CA that signed the nodes' certificates, for a ring started
            with ``--tls-cert`` (default: the file named by ``STATESTORE_TLS_CA``); every
            request is then HTTPS, each node verified against it. Unset: plain HTTP.

    Raises:
        ValueError: a bad option, or a ``tls_ca`` file that cannot be read.
    """

    def __init__(
        self,
        seeds: Iterable[str] | str,
        *,
        timeout: float = 10.0,
        concurrency: int = 16,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        block_size: int = DEFAULT_BLOCK_SIZE,
        key_groups: int = DEFAULT_KEY_GROUPS,
        max_chunk: int = MAX_CHUNK_RAW,
        ingress: float | None = None,
        tree_fan_in: int = 2,
        cache_bytes: int = 64 * 1024 * 1024,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
        token: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.seeds = parse_seeds(seeds)
        ca = tls_ca_file(tls_ca)
        token = client_token(token)  # or $STATESTORE_TOKEN, or $STATESTORE_TOKEN_FILE's
        bearer = {"Authorization": f"Bearer {token}"} if token else {}
        if concurrency < 1 or chunk_size < 1 or not 1 <= key_groups <= 65536:
            raise ValueError("concurrency and chunk_size must be positive, key_groups 1..65536")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 0:
            raise ValueError(f"block_size must be a non-negative int, got {block_size!r}")
        self.concurrency = concurrency
        self.chunk_size = chunk_size
        self.block_size = block_size
        self.key_groups = key_groups
        self.max_chunk = max_chunk
        self._transport: Transport = transport or HttpTransport(
            timeout=timeout,
            connections=max(64, concurrency * 4),
            rcvbuf=256 * 1024 if ingress else None,
            auth=(lambda method, address, path, body: bearer) if token else None,
            tls=client_context(ca) if ca and transport is None else None,
        )
        self._view: RingView | None = None
        # per store, the (version, epoch) this client last restored or committed: the base a
        # commit of the next version names when the caller does not (core/manifest.py)
        self._bases: dict[StoreId, tuple[int, int]] = {}
        # this client's tentative commits not known decided yet: (version, epoch) by store,
        # and the background asks for their outcomes (_settle)
        self._tentative: dict[StoreId, set[tuple[int, int]]] = {}
        self._polls: dict[StoreId, asyncio.Task[dict[tuple[int, int], Outcome]]] = {}
        self._cache = ChunkCache(cache_bytes)
        self._restorer = Restorer(
            self._transport,
            fan_in=concurrency,
            tree_fan_in=tree_fan_in,
            ingress=ingress,
            max_raw=max_chunk,
            clock=clock,
        )

    async def __aenter__(self) -> AsyncRingClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        await self._transport.start()
        try:
            await self.refresh()
        except BaseException:
            await self._transport.close()
            raise

    async def close(self) -> None:
        for poll in self._polls.values():
            poll.cancel()
        await asyncio.gather(*self._polls.values(), return_exceptions=True)
        self._polls.clear()
        await self._transport.close()
        await finish_left()  # the reads' slower replicas, not waited for (net/quorate.py)

    # -- ring view -----------------------------------------------------------------------
    async def refresh(self) -> RingView:
        """Fetch the ring view from any known node (live members first, then the seeds)."""
        candidates = (self._view.live_addresses() if self._view else []) + self.seeds
        errors: list[StateStoreError] = []
        for address in dict.fromkeys(candidates):
            try:
                resp = await self._transport.request("GET", address, "/v1/ring", timeout=3.0)
            except AccessDenied:
                raise  # the token: another node would say the same
            except StateStoreError as exc:
                errors.append(exc)
                continue
            view = RingView.from_json(resp.json())
            if self._view is None or view.epoch >= self._view.epoch:
                self._view = view
            return self._view
        tls = next((e for e in errors if isinstance(e, TlsFailed)), None)
        if tls is not None:  # not "no node answered": the CA (or its absence) is the problem
            raise TlsFailed(f"no node of the ring could be verified: {tls}")
        if errors and all(isinstance(e, RateLimited) for e in errors):
            raise errors[0]  # every node answered, to say the token is over its rate
        raise NodeUnavailable(
            "no node of the ring answered ("
            + "; ".join(map(str, errors[:3]))
            + "): start a node, or pass seeds of running ones"
        )

    def _first_reader(self, key: str) -> str:
        """The node a read of item ``key`` asks first, on the view held now ("" before any)."""
        order = self._view.read_order(key) if self._view is not None else []
        return order[0] if order else ""

    async def view(self) -> RingView:
        if self._view is None or self._transport.seen_epoch > self._view.epoch:
            await self.refresh()
        assert self._view is not None
        return self._view

    async def _view_within(self) -> RingView:
        """The view for the part of a call that runs within its delay bound (hints, a read of
        what answers): the one at hand, not refreshed first when an answer carried a newer
        epoch. A refresh asks the members the view names one at a time, each for up to 3 s,
        so a paused one asked first ate a 0.3 s bound whole (docs/reliability.md, What the runs
        found); a stale view's owners and stand-ins still take hints, which the hand-off routes
        to the owners of the day. The next call refreshes as usual (:meth:`view`)."""
        if self._view is None:
            return await self.view()
        return self._view

    async def _routed(
        self,
        op: Callable[[RingView], Awaitable[T]],
        *,
        read: bool = False,
        stores: Sequence[StoreId] = (),
    ) -> T:
        """Run ``op`` on the current view; on an availability error refresh once and retry.

        ``read``: a read whose answers came from a newer ring epoch than the view it used
        (the view was stale, so its replicas may not be the store's replicas any more) is
        run again on a fresh view, as is a NotFound from a stale view: quorum reads intersect
        quorum writes only within one view (found by statestore-sim, docs/reliability.md).
        Not when the fresh view, as new as any answer, gives each of ``stores`` (the stores
        ``op`` read) the replicas it read from: its answers are those a run on the fresh
        view would ask for. A member that starts joining or leaving moves the epoch but not
        the owners, so a move's state changes do not make every read in flight run twice.
        """
        view = await self.view()
        try:
            result = await op(view)
        except Unavailable:
            fresh = await self.refresh()
            if fresh.epoch == view.epoch:
                await asyncio.sleep(0.2)
            return await op(await self.view())
        except NotFound:
            if not read or self._transport.seen_epoch <= view.epoch:
                raise
            again = await self._fresher(view, stores)
            if again is None:
                raise
            return await op(again)
        if read and self._transport.seen_epoch > view.epoch:
            again = await self._fresher(view, stores)
            return result if again is None else await op(again)
        return result

    async def _fresher(self, view: RingView, stores: Sequence[StoreId]) -> RingView | None:
        """A fresh view to run a read on again, or None when it is as new as every answer
        seen and names the same replicas as ``view`` for each of ``stores``."""
        seen = self._transport.seen_epoch
        fresh = await self.refresh()
        if stores and fresh.epoch >= seen and fresh.same_owners(view, [s.path for s in stores]):
            return None
        return fresh

    async def ring(self) -> RingView:
        return await self.refresh()

    # -- state ---------------------------------------------------------------------------
    async def commit(
        self,
        store: StoreId,
        version: int,
        puts: Mapping[bytes, bytes],
        deletes: Iterable[bytes] = (),
        positions: Mapping[str, Any] | None = None,
        epoch: int = 0,
        *,
        snapshot: bool = False,
        base_epoch: int | None = None,
        consistency: str = "quorum",
        delay_bound: float | None = None,
        allow_tentative: bool = False,
    ) -> CommitResult:
        """Commit ``version`` of ``store``: a delta on top of ``version - 1``, or a snapshot.

        ``consistency`` is how many replicas must hold it durably before it is acknowledged:
        ``"quorum"`` (W, the default), ``"all"`` (every current replica, R) or ``"one"``
        (a single copy: fast and available with most replicas away, but that one disk is
        the only copy until repair copies it, and a quorum read may not see it yet; see
        docs/client.md, "Consistency"). The commit is sent to every replica either way.
        ``delay_bound`` (seconds) fails the call with DelayBoundExceeded when it has not
        finished by then. ``allow_tentative=True`` (needs a ``delay_bound``): when W
        replicas have not acknowledged after half the bound, the commit is also stored as a
        *hint* on the nodes of the store's preference list it reaches, and acknowledged
        *tentative* (``result.tentative``) once they hold it, by the bound at the latest. A
        tentative commit is confirmed or rolled back after the heal (core/tentative.py):
        ``outcomes(store)`` and ``corrections(store)`` say which; this client's next commit
        of the store raises TentativeRolledBack when its tentative versions were rolled
        back, and a commit on top of a tentative version is tentative too until that one is
        confirmed (docs/client.md, "Tentative commits").

        ``base_epoch`` is the epoch of the ``version - 1`` this commit builds on (the
        ``epoch`` of the :class:`RestoredState` it started from, or the epoch of the previous
        commit). Restores of this version follow it to that exact base, even where another
        writer's refused or superseded commit left a manifest of ``version - 1`` at another
        epoch (docs/client.md, "Lineage"). When not given, the client uses what it last
        restored or committed of the store if that was ``version - 1``; otherwise the commit
        names no base and its chain takes the highest epoch of ``version - 1``.

        Returns once W replicas hold every chunk and the manifest durably. Re-committing the
        same content is a no-op; raises StaleEpoch if a writer with a higher epoch took over,
        VersionConflict for other content at the same epoch, QuorumNotReached if fewer than W
        replicas answered (then nothing was acknowledged).
        """
        _check_request(consistency, delay_bound)
        if allow_tentative and delay_bound is None:
            raise InvalidRequest(
                "allow_tentative=True needs a delay_bound: the time after which the commit "
                "is acknowledged as tentative by the replicas it reached"
            )
        began = asyncio.get_running_loop().time()
        if base_epoch is None:
            known = self._bases.get(store)
            if known is not None and known[0] == version - 1 and known[1] <= epoch:
                base_epoch = known[1]
        on_tentative = await self._settle(
            store, version, epoch if base_epoch is None else base_epoch, delay_bound,
            allow_tentative,
        )  # fmt: skip
        view = await self.view()
        manifest, chunks = await asyncio.to_thread(
            partial(
                build_commit,
                store,
                version,
                puts,
                deletes,
                positions,
                epoch,
                snapshot,
                key_groups=self.key_groups,
                chunk_size=self.chunk_size,
                max_chunk=self.max_chunk,
                base_epoch=base_epoch,
                block_size=view.block_size(self.block_size),
                snapshot_kind=view.snapshot_kind(),
            )
        )

        def result(tentative: bool) -> CommitResult:
            self._bases[store] = (version, epoch)
            if tentative:
                self._tentative.setdefault(store, set()).add((version, epoch))
            return CommitResult(
                store,
                version,
                epoch,
                manifest.kind,
                len(chunks),
                sum(len(c.data) for c in chunks),
                sum(c.raw_size for c in chunks),
                tentative,
            )

        async def op(view: RingView) -> CommitResult:
            acks = write_acks(consistency, view.replicas, view.write_quorum)
            await write_commit(
                self._transport, view, manifest, chunks, concurrency=self.concurrency, acks=acks
            )
            return result(False)

        async def stable() -> CommitResult:
            return await self._routed(op)

        async def hints(deadline: float) -> CommitResult | None:
            view = await self._view_within()
            held = await write_hints(
                self._transport, view, manifest, chunks, deadline, enough=view.write_quorum
            )
            return result(True) if held else None

        # the bound counts from the call: what settling and chunking took is spent
        left = None
        if delay_bound is not None:
            left = max(delay_bound - (asyncio.get_running_loop().time() - began), 1e-3)
        # on a tentative base the commit is tentative too (until that one is confirmed):
        # straight to the hints, with the whole bound
        return await commit_within(
            stable, hints, left, allow_tentative, f"commit of {store} v{version}", on_tentative
        )

    async def _settle(
        self, store: StoreId, version: int, base_epoch: int, bound: float | None, allow: bool
    ) -> bool:
        """Before a commit of a store with tentative commits of this client not known
        decided: what became of them. With ``allow`` the owners are asked in the background
        (a commit within its bound does not wait on owners it may not reach) and the last
        answer is used; without, they are asked now (within a quarter of the bound).
        Raises TentativeRolledBack if any was rolled back; returns whether the base of
        this commit is still tentative (then this commit is tentative too, or, without
        ``allow``, QuorumNotReached)."""
        pending = self._tentative.get(store)
        if not pending:
            return False
        got: dict[tuple[int, int], Outcome] = {}
        if allow:
            poll = self._polls.pop(store, None)
            if poll is not None and not poll.done():
                self._polls[store] = poll
            elif poll is not None and not poll.cancelled() and poll.exception() is None:
                got = poll.result()
            if store not in self._polls:
                self._polls[store] = asyncio.create_task(self._outcomes(store))
        else:
            try:
                got = await asyncio.wait_for(self._outcomes(store), bound / 4 if bound else None)
            except (Unavailable, TimeoutError):
                pass
        for key in list(pending):
            o = got.get((key[1], key[0]))  # outcomes go by (epoch, version)
            if o is None:
                continue
            pending.discard(key)
            if o.outcome == ROLLED_BACK:
                fixes = corrections([x for x in got.values() if x.epoch == key[1]])
                raise TentativeRolledBack(
                    f"tentative commits of {store} at epoch {key[1]} were rolled back after "
                    "the partition healed (a writer with a higher epoch took over): "
                    + "; ".join(
                        f"versions {', '.join(map(str, c.versions))} discarded, replay from "
                        f"version {c.replay_from} (positions {c.positions})"
                        for c in fixes
                    )
                    + "; ring.corrections(store) lists them"
                )
        if not pending:
            self._tentative.pop(store, None)
        if (version - 1, base_epoch) not in pending:
            return False
        if not allow:
            raise QuorumNotReached(
                f"commit of {store} v{version} builds on v{version - 1}, a tentative commit "
                "not confirmed yet (the partition has not healed, or its hand-off is under "
                "way): retry, or commit with allow_tentative=True"
            )
        return True

    async def _outcomes(self, store: StoreId) -> dict[tuple[int, int], Outcome]:
        async def op(view: RingView) -> dict[tuple[int, int], Outcome]:
            answers = await ask_outcomes(self._transport, view.store_replicas(store), store)
            if not answers:
                raise QuorumNotReached(f"no owner of {store} answered for its outcomes")
            return merge(answers)

        return await self._routed(op, read=True, stores=[store])

    async def outcomes(self, store: StoreId) -> list[Outcome]:
        """What became of the store's tentative commits: one :class:`Outcome` (version,
        epoch, ``confirmed`` or ``rolled_back``, the replay point) per commit decided."""
        check_store(store)
        got = await self._outcomes(store)
        return [got[k] for k in sorted(got)]

    async def corrections(self, store: StoreId) -> list[Correction]:
        """The store's tentative commits that were rolled back, grouped by writer epoch:
        the versions discarded, the last stable version below them (``replay_from``) and its
        source positions, to replay the sources from (docs/client.md, "Tentative commits")."""
        return corrections(await self.outcomes(store))

    async def restore(
        self,
        store: StoreId,
        version: int | None = None,
        *,
        plan: str = "auto",
        progress: Callable[[int], None] | None = None,
        key_groups: range | None = None,
        consistency: str = "quorum",
        delay_bound: float | None = None,
    ) -> RestoredState:
        """Rebuild a version (default: the latest) of ``store`` along a recovery plan.

        ``consistency``: how many of the store's replicas the head and chain reads must hear
        from: ``"quorum"`` (R - W + 1: sees every commit acknowledged at quorum), ``"all"``
        (R), ``"one"`` (the first to answer may be behind: an older head, or StoreNotFound
        for a store whose commits it missed). ``delay_bound`` (seconds): a restore of the latest
        version whose reads have not finished after half the bound also reads the best
        version the nodes that answer hold (the head one replica gives, plus tentative
        commits held as hints above it) and returns whichever finishes first; that one has
        ``tentative=True`` (not known stable). A restore of a given version, or of key
        groups, fails with DelayBoundExceeded instead.

        ``plan`` is ``star``, ``line``, ``tree`` or ``auto`` (the cost model picks; the result's
        ``stats`` say which, why, the predicted and the actual time). ``key_groups``
        (``range(a, b)``) restores only the keys of those key groups, fetching only the chunks
        that hold them (rescaling, core/keygroups.py). Raises StoreNotFound /
        VersionNotFound for what is not there, CorruptChunk when a chunk is bad on every
        holder, NodeUnavailable when no holder of a chunk answers.
        """
        check_store(store)
        check_plan(plan)
        _check_request(consistency, delay_bound)
        if delay_bound is None or version is not None or key_groups is not None:
            return await _bounded(
                f"restore of {store}",
                self._restore(store, version, plan, progress, key_groups, consistency),
                delay_bound,
            )

        async def stable() -> RestoredState:
            return await self._restore(store, None, plan, progress, None, consistency)

        async def reachable(deadline: float) -> RestoredState | None:
            view = await self._view_within()
            state, top, stats, hinted = await read_reachable(
                self._transport, view, self._restorer, store, max_raw=self.max_chunk
            )
            if hinted:  # a commit built on it is tentative too, until it is confirmed
                self._tentative.setdefault(store, set()).add((top.version, top.epoch))
            self._bases[store] = (top.version, top.epoch)
            return RestoredState(
                state, top.version, top.epoch, dict(top.positions), "star", stats, tentative=True
            )

        # the latest within a bound: stable if the quorum read finishes in half of it, else
        # the best version the nodes that answer hold, marked tentative (net/tentative.py)
        return await commit_within(stable, reachable, delay_bound, True, f"restore of {store}")

    async def _restore(
        self,
        store: StoreId,
        version: int | None,
        plan: str,
        progress: Callable[[int], None] | None,
        key_groups: range | None,
        consistency: str,
    ) -> RestoredState:
        if version is not None:
            want = version
        else:
            want = (
                await self._routed(
                    lambda view: read_head(
                        self._transport,
                        view,
                        store,
                        read_answers(consistency, view.replicas, view.write_quorum),
                    ),
                    read=True,
                    stores=[store],
                )
            ).version

        async def op(view: RingView) -> RestoredState:
            # quorum (the default) is the chain read's own rule: a chain that resolves is used
            # as it comes, "not found" takes a read quorum (a restore from the last replica
            # standing works); one and all count answers (as node/coordinator.py does)
            answers = (
                None
                if consistency == "quorum"
                else read_answers(consistency, view.replicas, view.write_quorum)
            )
            chain = await read_chain(self._transport, view, store, want, answers)
            top = chain[-1]
            if key_groups is not None:
                chain = chain_for_groups(chain, check_groups(key_groups, top.key_groups))
            p = self._restorer.plan_chain(view, store, chain, plan)
            result = await self._restorer.run(view, store, chain, p, progress=progress)
            state = result.state
            if key_groups is not None:
                state = only_groups(state, key_groups, top.key_groups)
            self._bases[store] = (want, top.epoch)
            return RestoredState(state, want, top.epoch, dict(top.positions), p.kind, result.stats)

        return await self._routed(op, read=True, stores=[store])

    async def explain(self, store: StoreId, version: int | None = None, plan: str = "auto") -> Plan:
        """The plan a restore would follow, without running it (``Plan.explain()`` prints it)."""
        check_store(store)
        check_plan(plan)
        want = await self._version_or_latest(store, version)

        async def op(view: RingView) -> Plan:
            return (await self._restorer.plan(view, store, want, plan))[1]

        return await self._routed(op)

    async def restore_many(
        self,
        stores: Sequence[StoreId | tuple[StoreId, int]],
        *,
        plan: str = "auto",
        progress: Callable[[int], None] | None = None,
        key_groups: range | None = None,
    ) -> list[RestoredState]:
        """Restore many stores together (a lost executor's partitions, a replaced node).

        ``key_groups`` restores only those key groups of every store (as :meth:`restore`).

        Heads and chains are read in one batched request per node; the plans are then made
        one after another with the bytes already given to each source counted as its load, so
        no source carries more than its share. Star plans' chunks come in one stream per
        source rather than a request per chunk; everything runs at once under one fan-in
        limit. Results come back in the order asked.
        """
        check_plan(plan)
        wanted: list[tuple[StoreId, int | None]] = [
            (s, None) if isinstance(s, StoreId) else (check_store(s[0]), s[1]) for s in stores
        ]
        for sid, v in wanted:
            check_store(sid)
            if v is not None:
                check_version(v)

        async def op(view: RingView) -> list[RestoredState]:
            try:  # heads and chains in one batched request per node, not a few per store
                latest = [sid for sid, v in wanted if v is None]
                heads = iter(await read_heads(self._transport, view, latest) if latest else [])
                versions = [v if v is not None else next(heads).version for _, v in wanted]
                pairs = list(zip([sid for sid, _ in wanted], versions, strict=True))
                chains = await read_chains(self._transport, view, pairs)
            except Unavailable:  # e.g. nodes older than the batched reads: one store at a time
                versions = list(
                    await asyncio.gather(*(self._version_or_latest(s, v) for s, v in wanted))
                )
                pairs = list(zip([sid for sid, _ in wanted], versions, strict=True))
                chains = list(
                    await asyncio.gather(
                        *(read_chain(self._transport, view, s, v) for s, v in pairs)
                    )
                )
            load: dict[str, float] = {}
            plans = []
            tops = [chain[-1] for chain in chains]
            if key_groups is not None:
                chains = [
                    chain_for_groups(c, check_groups(key_groups, top.key_groups))
                    for c, top in zip(chains, tops, strict=True)
                ]
            for (sid, _), v, chain in zip(wanted, versions, chains, strict=True):
                p = self._restorer.plan_chain(view, sid, chain, plan, load=load)
                for t in p.tasks:
                    src = p.assignment[t.key]
                    load[src] = load.get(src, 0.0) + t.size
                plans.append((sid, v, chain, p))
            sem = asyncio.Semaphore(self.concurrency)
            results = await self._restorer.run_many(
                view, [(sid, chain, p) for sid, _, chain, p in plans], progress=progress, sem=sem
            )
            out = []
            for (sid, v, _chain, p), r, top in zip(plans, results, tops, strict=True):
                state = r.state
                if key_groups is not None:
                    state = only_groups(state, key_groups, top.key_groups)
                self._bases[sid] = (v, top.epoch)
                out.append(RestoredState(state, v, top.epoch, dict(top.positions), p.kind, r.stats))
            return out

        return await self._routed(op, read=True, stores=[s for s, _ in wanted])

    async def _version_or_latest(self, store: StoreId, version: int | None) -> int:
        return version if version is not None else (await self.latest(store)).version

    async def get(self, store: StoreId, key: bytes, version: int | None = None) -> bytes | None:
        """The value of ``key`` at ``version`` (default: latest), or None if it has none.

        Of blocked chunks (the layout since 0.3.0), fetches the index and the one block the
        key can be in of every chunk covering it down to the newest snapshot, at once; of
        whole ones, walks the chain from the newest version down, fetching only the chunks of
        the key's key group, and stops at the first version that mentions the key.
        """
        check_store(store)
        if not isinstance(key, bytes):
            raise TypeError(f"key must be bytes, got {type(key).__name__}")
        want = await self._version_or_latest(store, version)

        async def op(view: RingView) -> bytes | None:
            return await read_key(
                self._transport, view, store, want, key, self._cache, max_raw=self.max_chunk
            )

        return await self._routed(op, read=True, stores=[store])

    async def open(
        self,
        store: StoreId,
        version: int | None = None,
        *,
        cache_bytes: int = DEFAULT_OPEN_CACHE,
        lookups: bool | None = None,
    ) -> AsyncLazyState:
        """A version (default: the latest) of ``store``, read lazily: nothing but its head
        and chain of manifests is read now (once: the view stays on that version whatever is
        committed later). ``await st.get(key)`` fetches, of blocked chunks, the index and the
        one block the key can be in of each chunk covering it; ``get_many`` fetches the chunks
        of the keys' groups along the chain (verified, folded newest-wins, deletes applied)
        and keeps the folded groups; both in LRUs within ``cache_bytes`` (default 64 MiB);
        iterating streams the version by key-group ranges (client/_open.py).

        ``lookups`` (default: when ``cache_bytes`` is 0): a point read of blocked chunks is
        instead one ``POST .../lookup`` to a node holding the key's snapshot chunk, which
        reads the indexes and blocks from its own storage and cache (node/lookup.py); the
        client keeps nothing of them.

        Raises StoreNotFound / VersionNotFound for what is not there. A read that no holder
        answers reads the version's chain again: when the nodes thinned the snapshot it was
        opened on, it reads the chain the version has now (what is cached stays); when
        retention dropped the version, it raises VersionNotFound (when the chain can be
        read; else the read's own error).
        """
        check_store(store)
        if version is not None:
            check_version(version)
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be a non-negative int, got {cache_bytes!r}")
        if lookups is not None and not isinstance(lookups, bool):
            raise ValueError(f"lookups must be True, False or None, got {lookups!r}")
        want = await self._version_or_latest(store, version)

        async def rechain() -> list[Manifest]:
            return await self._routed(
                lambda view: read_chain(self._transport, view, store, want),
                read=True,
                stores=[store],
            )

        chain = await rechain()

        async def fetch(version: int, ref: ChunkRef, stats: ReadStats) -> bytes:
            return await self._routed(
                lambda view: fetch_chunk(self._transport, view, store, version, ref, stats)
            )

        async def fetch_part_of(
            version: int, ref: ChunkRef, span: tuple[int, int], expected: int, stats: ReadStats
        ) -> bytes:
            return await self._routed(
                lambda view: fetch_part(
                    self._transport, view, store, version, ref, span, expected, stats
                )
            )

        async def lookup(
            path: BlockPath, keys: Sequence[bytes], stats: ReadStats
        ) -> list[bytes | None]:
            groups = chain[-1].key_groups
            return await self._routed(
                lambda view: lookup_keys(self._transport, view, store, groups, path, keys, stats)
            )

        return AsyncLazyState(
            store,
            chain,
            want,
            fetch=fetch,
            fetch_part=fetch_part_of,
            lookup=lookup if (cache_bytes == 0 if lookups is None else lookups) else None,
            route=lambda version, ref: self._first_reader(chunk_key(store, version, ref.name)),
            rechain=rechain,
            concurrency=self.concurrency,
            max_chunk=self.max_chunk,
            cache_bytes=cache_bytes,
        )

    async def latest(self, store: StoreId) -> Head:
        """The store's head: latest version and the epoch that wrote it."""
        check_store(store)
        return await self._routed(
            lambda view: read_head(self._transport, view, store), read=True, stores=[store]
        )

    async def versions(self, store: StoreId) -> list[int]:
        """The versions still retained, oldest first."""
        check_store(store)
        return await self._routed(
            lambda view: read_versions(self._transport, view, store), read=True, stores=[store]
        )
