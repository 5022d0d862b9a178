"""Replica failover: the one loop that reads an item from the first holder that gives it.

Holders are tried in order; a holder that is unreachable, slow past the deadline, lacks the
item or returns bytes whose checksum does not match is skipped for the next. Only when every
holder failed does the read fail: CorruptChunk if every copy was rotten (retrying will not
help), NodeUnavailable otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from statestore.core.errors import (
    CorruptChunk,
    NodeUnavailable,
    NotFound,
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
) -> tuple[str, T]:
    """``(address, read(address))`` for the first holder in ``order`` whose read succeeds.

    ``read`` raises Unavailable, CorruptChunk or NotFound for a holder to skip; anything else
    propagates. ``on_failover(address, error)`` is told of every skipped holder.
    """
    errors: list[StateStoreError] = []
    for address in order:
        try:
            return address, await read(address)
        except (Unavailable, CorruptChunk, NotFound) as exc:
            errors.append(exc)
            if on_failover is not None:
                on_failover(address, exc)
    if errors and all(isinstance(e, CorruptChunk) for e in errors):
        raise CorruptChunk(f"item {key} is corrupt on every holder: {errors[0]}")
    raise NodeUnavailable(
        f"item {key} could not be read from any live holder"
        + (": " + "; ".join(str(e) for e in errors[:3]) if errors else " (none is live)")
        + "; wait for the ring to repair or bring a holder back"
    )
