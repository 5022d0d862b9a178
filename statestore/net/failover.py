"""Replica failover: the one loop that reads an item from the first holder that gives it.

Holders are tried in order; a holder that is unreachable, slow past the deadline, lacks the
item or returns bytes whose checksum does not match is skipped for the next. Only when every
holder failed does the read fail: CorruptChunk if every copy was rotten (retrying will not
help), NodeUnavailable otherwise.
"""

from __future__ import annotations

import asyncio
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from statestore.core.errors import (
    CorruptChunk,
    NodeUnavailable,
    NotFound,
    RequestTimeout,
    StateStoreError,
    Unavailable,
)

__all__ = ["first_holder"]

T = TypeVar("T")


async def first_holder(
    key: str,
    order: Iterable[str],
    read: Callable[[str], Awaitable[T]],
    *,
    on_failover: Callable[[str, StateStoreError], None] | None = None,
    hedge_after: float | None = None,
) -> tuple[str, T]:
    """``(address, read(address))`` for the first holder in ``order`` whose read succeeds.

    ``read`` raises Unavailable, CorruptChunk or NotFound for a holder to skip; anything else
    propagates. ``on_failover(address, error)`` is told of every skipped holder.
    ``hedge_after`` (seconds): a holder that has not answered by then is not waited on alone:
    the next one is asked too, and the first good answer wins (a paused or overloaded node
    costs that long, not its request timeout).
    """
    errors: list[StateStoreError] = []
    if hedge_after is None:
        for address in order:
            try:
                return address, await read(address)
            except (Unavailable, CorruptChunk, NotFound) as exc:
                errors.append(exc)
                if on_failover is not None:
                    on_failover(address, exc)
    else:
        found = await _hedged(list(order), read, hedge_after, errors, on_failover)
        if found is not None:
            return found
    if errors and all(isinstance(e, CorruptChunk) for e in errors):
        raise CorruptChunk(f"item {key} is corrupt on every holder: {errors[0]}")
    raise NodeUnavailable(
        f"item {key} could not be read from any live holder"
        + (": " + "; ".join(str(e) for e in errors[:3]) if errors else " (none is live)")
        + "; wait for the ring to repair or bring a holder back"
    )


async def _hedged(
    order: list[str],
    read: Callable[[str], Awaitable[T]],
    hedge_after: float,
    errors: list[StateStoreError],
    on_failover: Callable[[str, StateStoreError], None] | None,
) -> tuple[str, T] | None:
    """:func:`first_holder` with hedging: None when every holder failed (``errors``)."""
    running: dict[asyncio.Future[T], str] = {}
    slow: set[str] = set()  # told to on_failover already
    queue = list(order)

    def launch() -> None:
        address = queue.pop(0)
        running[asyncio.ensure_future(read(address))] = address

    try:
        while queue or running:
            if not running:
                launch()
            done, _ = await asyncio.wait(
                running, timeout=hedge_after if queue else None, return_when=FIRST_COMPLETED
            )
            if not done:  # the ones asked are slow: ask the next one too (a failover)
                for address in running.values():
                    if on_failover is not None and address not in slow:
                        on_failover(address, RequestTimeout(f"{address}: no answer in time"))
                    slow.add(address)
                launch()
                continue
            for f in done:
                address = running.pop(f)
                exc = f.exception()
                if exc is None:
                    return address, f.result()
                if not isinstance(exc, Unavailable | CorruptChunk | NotFound):
                    raise exc
                errors.append(exc)
                if on_failover is not None:
                    on_failover(address, exc)
        return None
    finally:
        for f in running:
            f.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
