"""The client side of a fault schedule: writers, their commits, restores, head reads and
take-overs, each recorded in a :class:`~statestore.testing.history.History` for the checker.

One set of operations for both places schedules run: the simulated network
(testing/schedule.py) and real node processes behind real network cuts (testing/partition.py). A
schedule provides ``client(name)``, ``history``, ``writers``, ``rng`` and the retry
settings; everything else is here.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from client import AsyncRingClient
from statestore.core.errors import StaleEpoch, StateStoreError, VersionConflict
from statestore.core.ids import StoreId
from statestore.testing.history import CommitOp, History, ReadOp, digest

__all__ = ["KEYS", "ClientOps", "Writer"]

KEYS = [b"k%02d" % i for i in range(24)]


@dataclass
class Writer:
    name: str
    store: StoreId
    epoch: int
    client: AsyncRingClient
    version: int = 0
    state: dict[bytes, bytes] = field(default_factory=dict)
    base_epoch: int | None = None  # the epoch of ``version`` as restored or committed
    busy: bool = False
    fenced: bool = False
    # a commit allowed to be tentative that failed (DelayBoundExceeded: its hints may land
    # later and be confirmed): the next commit retries this same delta, as docs/client.md
    # asks of a writer whose commit's outcome is unknown
    retry: tuple[dict[bytes, bytes], list[bytes]] | None = None


class ClientOps:
    """Client operations of a schedule (mixed into the schedule classes)."""

    COMMIT_ATTEMPTS = 3  # a failed commit is retried with the same content
    RETRY_PAUSE = 1.0  # seconds between those attempts
    TENTATIVE_BOUND = 1.0  # the delay bound of a commit allowed to be tentative

    history: History
    writers: dict[StoreId, list[Writer]]
    rng: random.Random
    serial: int

    async def client(self, name: str) -> AsyncRingClient:
        raise NotImplementedError

    async def new_writer(self, store: StoreId) -> Writer:
        self.serial += 1
        epoch = max((w.epoch for w in self.writers[store]), default=0) + 1
        w = Writer(f"w{self.serial}", store, epoch, await self.client(f"w{self.serial}"))
        self.writers[store].append(w)
        return w

    async def commit(
        self,
        w: Writer,
        puts: dict[bytes, bytes],
        deletes: list[bytes],
        tentative: bool = False,
    ) -> None:
        """One commit of ``w``, retried while it fails; ``tentative``: allowed to be
        acknowledged tentative within :attr:`TENTATIVE_BOUND` (core/tentative.py)."""
        version = w.version + 1
        state = {k: v for k, v in w.state.items() if k not in deletes} | puts
        delta = digest(puts, deletes)
        try:
            for _ in range(self.COMMIT_ATTEMPTS):
                start = self.history.now()
                outcome, error = "ack", ""
                base = w.base_epoch if version > 1 else None
                try:
                    r = await w.client.commit(
                        w.store, version, puts, deletes, {"w": w.name}, epoch=w.epoch,
                        base_epoch=base,
                        delay_bound=self.TENTATIVE_BOUND if tentative else None,
                        allow_tentative=tentative,
                    )  # fmt: skip
                    if r.tentative:
                        outcome = "tentative"
                except (StaleEpoch, VersionConflict) as exc:
                    outcome, error = "refused", type(exc).__name__
                except StateStoreError as exc:
                    outcome, error = "failed", type(exc).__name__
                op = CommitOp(
                    w.name, w.store.path, version, w.epoch, delta, state, start,
                    self.history.now(), outcome, error, base,
                )  # fmt: skip
                self.history.add_commit(op)
                if outcome in ("ack", "tentative"):
                    w.version, w.state, w.base_epoch = version, state, w.epoch
                    w.retry = None
                    return
                if outcome == "refused":
                    w.fenced = True
                    return
                await asyncio.sleep(self.RETRY_PAUSE)
            if tentative:
                w.retry = (puts, deletes)
        finally:
            w.busy = False

    async def restore(
        self, c: AsyncRingClient, store: StoreId, version: int | None, *, final: bool = False
    ) -> ReadOp:
        start = self.history.now()
        try:
            st = await c.restore(store, version, plan="star" if final else "auto")
            op = ReadOp(
                "restore", store.path, version, start, self.history.now(),
                (st.epoch, st.version), dict(st), final=final,
            )  # fmt: skip
        except StateStoreError as exc:
            op = ReadOp(
                "restore", store.path, version, start, self.history.now(),
                error=type(exc).__name__, final=final,
            )  # fmt: skip
        self.history.add_read(op)
        return op

    async def head(self, c: AsyncRingClient, store: StoreId) -> None:
        start = self.history.now()
        try:
            h = await c.latest(store)
            op = ReadOp("head", store.path, None, start, self.history.now(), (h.epoch, h.version))
        except StateStoreError as exc:
            op = ReadOp(
                "head", store.path, None, start, self.history.now(), error=type(exc).__name__
            )
        self.history.add_read(op)

    async def takeover(self, store: StoreId) -> None:
        w = await self.new_writer(store)
        w.busy = True
        try:
            op = await self.restore(w.client, store, None)
            if op.error and op.error != "StoreNotFound":
                w.fenced = True  # could not take over; a later step tries again
                return
            if op.head is not None and op.state is not None:
                w.version, w.state, w.base_epoch = op.head[1], dict(op.state), op.head[0]
        finally:
            w.busy = False

    async def verdicts(self, c: AsyncRingClient, timeout: float) -> None:
        """At the end of a run: wait (up to ``timeout`` seconds) until the ring has a verdict
        on every tentative commit, and record them in the history."""
        want = {
            (op.store, op.version, op.epoch) for op in self.history.commits
            if op.outcome == "tentative"
        }  # fmt: skip
        got: dict[tuple[str, int, int], tuple[str, int]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while want - got.keys() and loop.time() < deadline:
            for path in sorted({s for s, _, _ in want - got.keys()}):
                try:
                    for o in await c.outcomes(StoreId.parse(path)):
                        got[(o.store, o.version, o.epoch)] = (o.outcome, o.replay_from)
                except StateStoreError:
                    pass
            await asyncio.sleep(0.5)
        self.history.add_verdicts({k: v for k, v in got.items() if k in want})

    def delta(self, w: Writer) -> tuple[dict[bytes, bytes], list[bytes]]:
        """A random delta on ``w``'s state: puts over :data:`KEYS`, deletes of held keys; or
        the delta of its failed tentative commit, again (:attr:`Writer.retry`)."""
        if w.retry is not None:
            return w.retry
        rng = self.rng
        puts = {
            rng.choice(KEYS): rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(1, 6))
        }
        held = sorted(k for k in w.state if k not in puts)
        deletes = rng.sample(held, min(len(held), rng.randint(0, 2)))
        return puts, deletes
