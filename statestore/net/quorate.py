"""Ask several nodes at once and stop waiting on the silent ones once enough have answered.

A node that is paused, overloaded or behind a half-open connection answers nothing, and a
call that waits for every answer waits for its per-request timeout. :func:`until_enough`
runs the requests together; once ``enough(results so far)`` holds it waits only a grace
period more (twice as long as it took to get there, at least ``GRACE``) for the others,
so replicas that are merely slower still get their copy (a healthy ring's replicas all
answer within it), then cancels the rest and reports them as not answering. Quorum rules
make that safe (core/quorum.py): W write acknowledgements and
R - W + 1 read answers intersect every acknowledged commit without the silent replica; the
replicas not waited for are repaired later (docs/reliability.md, "Gray failures").

A read needs no grace: ``rest=False`` returns as soon as ``enough`` holds and leaves the
calls still running to finish on their own (their answers are dropped; a request is not
cut off mid-answer, which would cost its pooled connection). Waiting for the slowest of
three replicas is what made a read's tail the tail of the busiest node (docs/benchmarks.md,
"Elastic ring").
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from statestore.core.errors import NodeUnavailable

__all__ = ["GRACE", "MIN_GRACE", "finish_left", "until_enough"]

T = TypeVar("T")
MIN_GRACE = 0.5
# the minimum grace for the calls of the current task: a read within a delay bound that
# takes what answers (net/tentative.read_reachable) sets a short one
GRACE: contextvars.ContextVar[float] = contextvars.ContextVar("grace", default=MIN_GRACE)
# calls left running by ``rest=False``: held here until they end (a task nothing refers to
# may be collected mid-flight), each bounded by its transport's request timeout
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
    rest: bool = True,
) -> list[T | BaseException]:
    """Results (or exceptions) of ``calls`` in order. ``enough`` sees the finished ones so
    far, by index; once it is true, calls still running get a grace period and then a
    NodeUnavailable result (``rest=False``: that result at once, and they run on)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = [asyncio.ensure_future(c) for c in calls]
    results: dict[int, T | BaseException] = {}
    index = {t: i for i, t in enumerate(tasks)}
    pending = set(tasks)
    grace_until: float | None = None
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
                if not rest:
                    break
                grace_until = loop.time() + max(GRACE.get(), 2 * (loop.time() - started))
    except BaseException:
        rest = True  # cancelled or failed: nothing is left running
        raise
    finally:
        if rest or not pending:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        else:
            for t in pending:
                _LEFT.add(t)
                t.add_done_callback(_forget)
    late = NodeUnavailable(
        f"{what}: no answer within the grace period after enough answered"
        if rest
        else f"{what}: not waited for once enough answered"
    )
    return [results.get(i, late) for i in range(len(tasks))]
