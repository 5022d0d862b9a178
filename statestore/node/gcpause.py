"""The garbage collector's pauses in a node process, and the freeze that shortens them.

CPython's cyclic collector stops every thread of the process while it runs. A full
(generation 2) pass walks every container object the collector tracks; in a started node
the modules, classes, functions and the app alone are ~43,000 of them, 10-15 ms of walking
on this project's machine, repeated every few seconds while a move, a repair pass or a
digest scan allocates. :func:`freeze` (``--gc-freeze``) moves what is alive once the node
has started into the collector's permanent generation (``gc.freeze``): later passes walk
only what came after, a tenth of the time in them measured side by side
(docs/benchmarks.md). It is on unless ``--no-gc-freeze``. What is frozen is never collected,
which is right for objects that live as long as the process. :class:`Pauses` times every pass (a
``gc.callbacks`` hook) for ``GET /metrics`` (docs/operations.md, Garbage collector).

Process-wide, as the collector is: the daemon times the pauses, and freezes unless
``--no-gc-freeze`` (node/server.py); a program that embeds a node (``start_node``) keeps
its own collector settings and reports no pauses.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PAUSES", "Pauses", "freeze"]

GENERATIONS = 3


@dataclass
class Pauses:
    """Count, total and longest pause per generation since :meth:`install`."""

    installed: bool = False
    count: list[int] = field(default_factory=lambda: [0] * GENERATIONS)
    seconds: list[float] = field(default_factory=lambda: [0.0] * GENERATIONS)
    longest: list[float] = field(default_factory=lambda: [0.0] * GENERATIONS)
    _started: float = 0.0

    def install(self) -> None:
        """Start timing the collector's passes (once per process)."""
        if not self.installed:
            gc.callbacks.append(self._on_pass)
            self.installed = True

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        g = int(info["generation"])
        if 0 <= g < GENERATIONS:
            self.count[g] += 1
            self.seconds[g] += took
            self.longest[g] = max(self.longest[g], took)


PAUSES = Pauses()  # the process's: one collector per interpreter


def freeze() -> int:
    """Collect once, then move every object alive into the permanent generation; returns
    how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
