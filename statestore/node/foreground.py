"""Clients' requests in flight on a node, for a hand-over's copies to yield to.

A join's next fetch, a leave's next push, and a source serving a join's fetch (``GET
/v1/chunks/...?copy=1``) wait while this node serves a client's read or write, so that on a
busy node a move slows down instead of the clients. The storage writer puts client writes
first as well (node/writer.py); this is the same rule for the event loop and the CPU a copy
costs. Repair's and hints' copies do not wait: they restore redundancy.

Two bounds keep a move going under any load, a steady one or a client that holds a request
open on purpose: one wait lasts at most :data:`YIELD_LIMIT` seconds, and after a wait that
ran out, copies do not wait again for :data:`YIELD_PERIOD` seconds, so waiting takes at
most about a fifth of a move's time.
"""

from __future__ import annotations

import asyncio

__all__ = ["YIELD_LIMIT", "YIELD_PERIOD", "ForegroundGate"]

YIELD_LIMIT = 0.25  # seconds one wait lasts at most
YIELD_PERIOD = 1.0  # seconds without waits after one that ran out


class ForegroundGate:
    """Counts the client requests in flight on one node (single event loop: no lock)."""

    def __init__(self) -> None:
        self._n = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._free_until = 0.0  # loop time until which copies do not wait
        self.yielded = 0  # copies that waited for clients (GET /v1/handover's ``yielded``)

    @property
    def busy(self) -> int:
        return self._n

    def begin(self) -> None:
        self._n += 1
        self._idle.clear()

    def end(self) -> None:
        self._n -= 1
        if self._n == 0:
            self._idle.set()

    async def wait(self, limit: float = YIELD_LIMIT, period: float = YIELD_PERIOD) -> None:
        """Return once no client request is in flight here, after ``limit`` seconds, or at
        once within ``period`` seconds of a wait that ran out."""
        loop = asyncio.get_running_loop()
        if not self._n or loop.time() < self._free_until:
            return
        self.yielded += 1
        try:
            async with asyncio.timeout(limit):
                await self._idle.wait()
        except TimeoutError:
            self._free_until = loop.time() + period
