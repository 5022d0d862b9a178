"""A hand-over round's manifests spread over its chunks' copy.

A round copies chunks (up to a MiB or so each, paced by the ``--stream-mbps`` budget) and
manifests (a few hundred bytes each: the budget hardly slows them). Left to themselves, the
manifests of a 1 GiB move (thousands, one request each on both nodes) all went in the
move's first seconds, and the CPU they cost on every node involved was what clients'
requests waited behind (docs/benchmarks.md). Here manifest ``i`` of ``m`` starts once
``i * c // m`` of the round's ``c`` chunks have started, so the manifests go at the chunks'
pace and finish with them: the round takes no longer, its cost is spread over it.
"""

from __future__ import annotations

import asyncio

__all__ = ["Pace"]


class Pace:
    """Holds a round's manifests back to its chunks' progress (one event loop: no lock)."""

    def __init__(self, chunks: int, manifests: int) -> None:
        self.chunks = chunks
        self.manifests = manifests
        self.started = 0  # chunks started so far
        self._waiting: dict[int, asyncio.Event] = {}  # chunks started -> manifests waiting

    def need(self, i: int) -> int:
        """How many chunks must have started before manifest ``i`` (0-based) may start."""
        return i * self.chunks // self.manifests if self.manifests else 0

    def chunk_started(self) -> None:
        self.started += 1
        event = self._waiting.pop(self.started, None)
        if event is not None:
            event.set()

    async def manifest(self, i: int) -> None:
        """Return once manifest ``i`` may start."""
        need = self.need(i)
        if self.started >= need:
            return
        await self._waiting.setdefault(need, asyncio.Event()).wait()
