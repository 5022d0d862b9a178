"""The node's memory budget: request bodies held at once, in bytes (``--memory-budget``).

Every other limit is per request (``--max-body``, ``--max-commit``); a node that takes many
requests at once needs one for their sum, or two 256 MiB coordinator commits take it past
1.7 GiB. Once a request is authenticated (from its headers: a caller without credentials
takes nothing; a ring node's signed body is read and checked by the auth middleware first)
and before its body is read, :func:`budget_middleware` takes its declared ``Content-Length``
from the budget (a body without one takes ``--max-body``), and gives it back when the
answer is sent. A coordinator commit holds more than its body while it is chunked
(the rows decoded, the chunks built): it takes :data:`COMMIT_FACTOR` times its body, as the
body arrives. A request that does not fit waits for room up to the node's body timeout, then
gets 429 with a Retry-After; one larger than the whole budget gets 413 at once. A lookup
(node/lookup.py) takes the parts of chunks it reads and the values it answers as it goes. A
restore a node builds for a caller (``GET .../state``) reserves what its fold will hold
before it reads a chunk (:meth:`Lease.reserve`: one larger than the budget runs alone); a
tree hop's fold (node/relay.py) takes its rows as they come and fails at once when there is
no room (its parent fetches its chunks). Both answers must be read at a pace
(node/request.PacedAnswer), or they are cut and give their share back. Other requests
without a body take nothing: what they hold is bounded by what they read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from statestore.core.errors import PayloadTooLarge, RateLimited

__all__ = [
    "COMMIT_FACTOR",
    "LEASE",
    "FoldLease",
    "Lease",
    "MemoryBudget",
    "budget_middleware",
    "is_commit",
]

# a coordinator commit's peak over its body: the body, the decoded rows, the chunks built
COMMIT_FACTOR = 3
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MemoryBudget:
    """Bytes that requests in flight may hold in all (one event loop)."""

    def __init__(self, limit: int, wait: float, max_body: int) -> None:
        self.limit = limit
        self.wait = wait  # seconds a request waits for room before it is refused
        self.max_body = max_body  # what a body without a Content-Length may hold
        self.used = 0
        self.refused = 0  # requests refused for want of room (metrics)
        self._room = asyncio.Condition()
        self._waiting = 0  # takers between asking for room and getting it

    async def take(self, nbytes: int, what: str, held: int = 0, patient: bool = True) -> None:
        """Take ``nbytes`` for a request that holds ``held`` already, waiting up to
        :attr:`wait` seconds for room (not at all unless ``patient``). Raises
        PayloadTooLarge when the two exceed the whole budget (no room could ever come),
        RateLimited when no room came. A negative amount is a caller's bug or a peer's lie
        taken on trust (it would give room that nobody gave back): ValueError."""
        if nbytes < 0:
            raise ValueError(f"{what}: a negative amount of memory ({nbytes}) is not taken")
        if held + nbytes > self.limit:
            raise PayloadTooLarge(
                f"{what} needs {held + nbytes} bytes of memory, over this node's "
                f"--memory-budget ({self.limit}): send smaller bodies (restore smaller "
                "parts), or raise the budget"
            )
        if self.used + nbytes <= self.limit:
            # room now: taken without the condition and its timer (one event loop, no await
            # in between), which cost a point read 7% of the node's CPU
            self.used += nbytes
            return
        if not patient:
            self.refused += 1
            raise RateLimited(
                f"this node holds {self.used} bytes of requests, its --memory-budget is "
                f"{self.limit}: {what} does not wait for room (its caller has another way)",
                retry_after=1.0,
            )
        self._waiting += 1
        try:
            async with self._room:
                try:
                    async with asyncio.timeout(self.wait):
                        await self._room.wait_for(lambda: self.used + nbytes <= self.limit)
                except TimeoutError:
                    self.refused += 1
                    raise RateLimited(
                        f"this node holds {self.used} bytes of requests, its --memory-budget "
                        f"is {self.limit}: retry {what} in a moment",
                        retry_after=1.0,
                    ) from None
                self.used += nbytes
        finally:
            self._waiting -= 1

    async def give(self, nbytes: int) -> None:
        if nbytes:
            self.used -= nbytes
            if self._waiting:  # a taker that has not reached its wait yet checks first
                async with self._room:
                    self._room.notify_all()


class Lease:
    """What one request took from the budget, given back at once when it ends."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.closed = False

    async def take(self, nbytes: int, what: str, patient: bool = True) -> None:
        if self.closed:  # its request ended: a task it left behind takes nothing for ever
            raise RateLimited(f"{what}: its request has ended", retry_after=1.0)
        await self.budget.take(nbytes, what, held=self.held, patient=patient)
        if self.closed:  # it ended while this one waited for room: given back at once
            await self.budget.give(nbytes)
            raise RateLimited(f"{what}: its request has ended", retry_after=1.0)
        self.held += nbytes

    async def reserve(self, nbytes: int, what: str) -> None:
        """Take ``nbytes``, or what the whole budget leaves this request when that is less:
        where :meth:`take` refuses a request larger than the budget, one that reserves runs
        alone instead (it waits until the others' holdings leave it the budget, and takes it
        all until it ends). For what a request builds rather than receives: a restore's fold.
        (A tree hop's fold takes with ``patient=False`` instead: its parent holds its own
        memory while it waits for the hop, so a hop that waited could wait on its own
        parent; refused, it fails and the parent fetches its chunks.)"""
        await self.take(max(0, min(nbytes, self.budget.limit - self.held)), what)

    async def give(self, nbytes: int) -> None:
        """Give back ``nbytes`` of what it took (at most what it holds): a claim taken
        before the memory it stood for was known, trued up."""
        nbytes = max(0, min(nbytes, self.held))
        self.held -= nbytes
        await self.budget.give(nbytes)

    async def take_room(self, nbytes: int, what: str, most: int | None = None) -> None:
        """Take ``nbytes``, or what room the budget has now when that is less (and at most
        ``most`` held by this request in all): never a wait, never a refusal. For memory
        that is held already, or for background work that must neither wait on the
        requests it serves nor take all their room."""
        most = self.budget.limit if most is None else most
        room = max(0, min(nbytes, most - self.held, self.budget.limit - self.budget.used))
        if room and not self.closed:
            await self.take(room, what, patient=False)

    async def close(self) -> None:
        self.closed = True
        held, self.held = self.held, 0
        await self.budget.give(held)


class FoldLease:
    """A fold a node builds (net/restorer.Hold), held to its lease. A request's restore
    reserves its claims (:meth:`Lease.reserve`: it waits for room, runs alone if larger than
    the budget) and takes the rows beyond them at once or is refused (RateLimited: its rows
    are dropped; what it holds outside the budget is then at most the chunks it has
    decoding, however many restores a reader starts). Background work (``most``: compaction)
    takes both as far as there is room, up to ``most``: it is one store at a time, and must
    neither wait on the requests it serves nor fail for them."""

    def __init__(self, lease: Lease, most: int | None = None) -> None:
        self.lease = lease
        self.most = most

    async def claim(self, nbytes: int, what: str) -> None:
        if self.most is None:
            await self.lease.reserve(nbytes, what)
        else:
            await self.lease.take_room(nbytes, what, self.most)

    async def beyond(self, nbytes: int, what: str) -> None:
        if self.most is None:
            await self.lease.take(nbytes, what, patient=False)
        else:
            await self.lease.take_room(nbytes, what, self.most)


LEASE = web.RequestKey("lease", Lease)


def is_commit(request: web.Request) -> bool:
    return request.method == "POST" and request.path.endswith("/commit")


def budget_middleware(budget_of: Callable[[web.Request], MemoryBudget]) -> Middleware:
    """A middleware that takes a request's body from its node's budget before anything
    reads it (a commit takes its own, piece by piece: :data:`COMMIT_FACTOR` times)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        budget = budget_of(request)
        lease = request[LEASE] = Lease(budget)
        try:
            if request.body_exists and not is_commit(request):
                size = request.content_length
                if size is None:  # chunked: up to --max-body
                    size = budget.max_body
                elif size > budget.max_body:
                    # a body no read can take (aiohttp refuses it past --max-body): refused
                    # now, not held in the budget for the body timeout
                    raise PayloadTooLarge(
                        f"{request.method} {request.path:.80}: a body of {size} bytes is over "
                        f"this node's --max-body ({budget.max_body})"
                    )
                await lease.take(size, f"{request.method} {request.path:.80}")
            return await handler(request)
        finally:
            await lease.close()

    return middleware
