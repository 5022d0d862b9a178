"""Ask several nodes at once and stop waiting on the silent ones once enough have answered.

A node that is paused, overloaded or behind a half-open connection answers nothing, and a
call that waits for every answer waits for its per-request timeout. :func:`until_enough`
runs the requests together and, once ``enough(results so far)`` holds, treats the calls
still running by its ``rest``:

- ``"wait"``: wait a grace period more (twice as long as it took to get there, at least
  ``GRACE``) for them, then cancel them and report them as not answering;
- ``"behind"`` (writes): return at once and let them run on *behind* the caller for that
  same grace period, then cancel them: a slower replica still gets its copy as it did when
  it was waited for, but the caller's latency is that of the W-th acknowledgement, not the
  busiest replica's (during a move one replica is always the busiest: docs/benchmarks.md,
  "Elastic ring");
- ``"run"`` (reads): return at once and let them run on to their own end (a request is not
  cut off mid-answer, which would cost its pooled connection).

Quorum rules make returning early safe (core/quorum.py): W write acknowledgements and
R - W + 1 read answers intersect every acknowledged commit without the slower replica; a
replica that a copy did not reach in the grace is repaired later (docs/reliability.md,
"Gray failures").
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Literal, TypeVar

from statestore.core.errors import NodeUnavailable

__all__ = ["GRACE", "MIN_GRACE", "Rest", "finish_left", "gather_all", "until_enough"]

T = TypeVar("T")
Rest = Literal["wait", "behind", "run"]  # what becomes of the calls still running (above)
MIN_GRACE = 0.5
# the minimum grace for the calls of the current task: a read within a delay bound that
# takes what answers (net/tentative.read_reachable) sets a short one
GRACE: contextvars.ContextVar[float] = contextvars.ContextVar("grace", default=MIN_GRACE)
# calls left running by ``rest="behind"`` or ``"run"``: held here until they end (a task
# nothing refers to may be collected mid-flight), each bounded by its grace or its
# transport's request timeout
_LEFT: set[asyncio.Future[Any]] = set()


def _forget(task: asyncio.Future[Any]) -> None:
    _LEFT.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: an answer nobody waits for is not an error to log


async def finish_left(timeout: float = 1.0) -> None:
    """Wait (at most ``timeout``) for this loop's calls left running, then cancel the rest:
    for a client closing its transport and loop."""
    loop = asyncio.get_running_loop()
    mine = [t for t in _LEFT if t.get_loop() is loop]
    if not mine:
        return
    _done, late = await asyncio.wait(mine, timeout=timeout)
    for t in late:
        t.cancel()
    if late:
        await asyncio.gather(*late, return_exceptions=True)


async def until_enough(
    calls: Sequence[Coroutine[Any, Any, T]],
    enough: Callable[[dict[int, T | BaseException]], bool],
    what: str = "request",
    *,
    rest: Rest = "wait",
) -> list[T | BaseException]:
    """Results (or exceptions) of ``calls`` in order. ``enough`` sees the finished ones so
    far, by index; once it is true, calls still running are treated as ``rest`` says (the
    module's docstring) and reported as a NodeUnavailable result."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = [asyncio.ensure_future(c) for c in calls]
    results: dict[int, T | BaseException] = {}
    index = {t: i for i, t in enumerate(tasks)}
    pending = set(tasks)
    grace_until: float | None = None
    leave = False  # whether the calls still running are left to run on
    try:
        while pending:
            timeout = None if grace_until is None else max(0.0, grace_until - loop.time())
            done, pending = await asyncio.wait(
                pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break  # the grace period is over
            for t in done:
                exc = t.exception()
                results[index[t]] = exc if exc is not None else t.result()
            if grace_until is None and enough(results):
                grace = max(GRACE.get(), 2 * (loop.time() - started))
                if rest != "wait":
                    leave = True
                    if rest == "behind":
                        for t in pending:
                            loop.call_later(grace, t.cancel)
                    break
                grace_until = loop.time() + grace
    finally:  # cancelled or failed: nothing is left running
        if leave:
            for t in pending:
                _LEFT.add(t)
                t.add_done_callback(_forget)
        else:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
    late = NodeUnavailable(
        f"{what}: not waited for once enough answered"
        if leave
        else f"{what}: no answer within the grace period after enough answered"
    )
    return [results.get(i, late) for i in range(len(tasks))]


async def gather_all(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Every one's result, in order; the first failure cancels the others and is raised
    (``asyncio.gather`` leaves them running on: requests nobody waits for)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
