"""Reading a request's body within the node's limits (one place for every handler)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from statestore.core.errors import SlowRequest
from statestore.node.daemon import NODE

__all__ = ["read_body"]


async def read_body(request: web.Request) -> bytes:
    """The request body, within ``--max-body`` and the node's body timeout."""
    limit = request.app[NODE].config.body_timeout
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError as exc:
        raise SlowRequest(
            f"request body did not arrive within {limit:.0f}s: send it at once, or faster"
        ) from exc
