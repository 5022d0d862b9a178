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
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from statestore.core.errors import NodeUnavailable

__all__ = ["GRACE", "MIN_GRACE", "until_enough"]

T = TypeVar("T")
MIN_GRACE = 0.5
# the minimum grace for the calls of the current task: a read within a delay bound that
# takes what answers (net/tentative.read_reachable) sets a short one
GRACE: contextvars.ContextVar[float] = contextvars.ContextVar("grace", default=MIN_GRACE)


async def until_enough(
    calls: Sequence[Coroutine[Any, Any, T]],
    enough: Callable[[dict[int, T | BaseException]], bool],
    what: str = "request",
) -> list[T | BaseException]:
    """Results (or exceptions) of ``calls`` in order. ``enough`` sees the finished ones so
    far, by index; once it is true, calls still running get a grace period and then a
    NodeUnavailable result."""
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
                grace_until = loop.time() + max(GRACE.get(), 2 * (loop.time() - started))
    finally:
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    late = NodeUnavailable(f"{what}: no answer within the grace period after enough answered")
    return [results.get(i, late) for i in range(len(tasks))]
