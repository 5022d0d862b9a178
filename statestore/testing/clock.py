"""Simulated time: an asyncio event loop whose clock only moves when nothing is ready to run.

When every task waits on a timer, the loop jumps its clock straight to the earliest one instead
of sleeping, so ``asyncio.sleep``, ``asyncio.timeout`` and every interval, TTL and failure
detector that reads ``loop.time()`` run on simulated seconds: a minute of gossip, repair and
timeouts takes milliseconds, and the order in which callbacks run depends only on the program
and its seed, never on the machine (FoundationDB's deterministic simulation; docs/reliability.md).

Work that would go to a thread (``asyncio.to_thread``, a node's storage writer) runs inline
instead (:class:`InlineExecutor`), since a thread finishing "whenever" would make a run depend
on the scheduler of the host.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["InlineExecutor", "SimLoop", "Stuck", "run_simulated"]

T = TypeVar("T")


class Stuck(RuntimeError):
    """Every task waits and no timer is set: the simulated system can never move again."""


class InlineExecutor(ThreadPoolExecutor):
    """Runs each job at once in the caller's thread (a ThreadPoolExecutor only in type, as
    ``loop.set_default_executor`` requires one)."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        fut: Future[T] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread would
            fut.set_exception(exc)
        return fut


class _JumpingSelector(selectors.DefaultSelector):
    """Polls the real file descriptors (only the loop's self-pipe: the simulation opens no
    sockets) without blocking; when the loop would block, advances the simulated clock."""

    def __init__(self, loop_clock: list[float]) -> None:
        super().__init__()
        self._clock = loop_clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise Stuck("every task waits and no timer is set: the simulation deadlocked")
        self._clock[0] += timeout
        return []


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated time, starting at 0.0."""

    def __init__(self) -> None:
        self._sim_now = [0.0]
        super().__init__(selector=_JumpingSelector(self._sim_now))
        self.set_default_executor(InlineExecutor())

    def time(self) -> float:
        return self._sim_now[0]


def run_simulated(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a fresh :class:`SimLoop`, then cancel what is left
    (owned tasks should be gone already) and close the loop."""
    loop = SimLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
