"""Client requests in flight on a node, for background copies to yield to.

A hand-over's or repair's copy (a chunk fetched or pushed with ``?copy=1``, a round's next
item) waits while this node serves a client's read or write, at most :data:`YIELD_LIMIT`
seconds, so that on a busy node a move slows down instead of the clients. The storage writer
puts client writes first as well (node/writer.py); this is the same rule for the event loop
and the CPU a copy costs. The wait is bounded so that a move under a steady load still
advances: it then runs in the gaps between requests, and at the budget when there are none.
"""

from __future__ import annotations

import asyncio

__all__ = ["YIELD_LIMIT", "ForegroundGate"]

YIELD_LIMIT = 0.25  # seconds one copy waits for the node's client requests at most


class ForegroundGate:
    """Counts the client requests in flight on one node (single event loop: no lock)."""

    def __init__(self) -> None:
        self._n = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.yielded = 0  # copies that waited for clients (GET /v1/handover's ``yielded``)

    @property
    def busy(self) -> int:
        return self._n

    def begin(self) -> None:
        self._n += 1
        self._idle.clear()

    def end(self) -> None:
        self._n -= 1
        if self._n <= 0:
            self._n = 0
            self._idle.set()

    async def wait(self, limit: float = YIELD_LIMIT) -> None:
        """Return once no client request is in flight here, or after ``limit`` seconds."""
        if not self._n:
            return
        self.yielded += 1
        try:
            async with asyncio.timeout(limit):
                await self._idle.wait()
        except TimeoutError:
            pass
