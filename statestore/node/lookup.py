"""Point reads for callers without the ring client: ``GET /v1/stores/{store}/key?key=HEX
[&version=N]`` (curl, the JVM, the dashboard's users).

The node runs the client's point read (``net/reads.read_key``: the chain walked newest first,
only the key's key group fetched) with a chunk cache of its own, and answers the value's bytes
(``404 not_found`` when the key has none at that version). Timed by the metrics as
``statestore_point_read_seconds``.
"""

from __future__ import annotations

from aiohttp import web

from statestore.core.cache import ChunkCache
from statestore.core.errors import InvalidRequest, NotFound
from statestore.core.ids import StoreId, check_version
from statestore.net.reads import read_head, read_key
from statestore.node.daemon import NODE
from statestore.wire.headers import EPOCH_HEADER

__all__ = ["CACHE", "MAX_KEY_BYTES", "point_read", "register"]

MAX_KEY_BYTES = 64 * 1024
CACHE = web.AppKey("point_read_cache", ChunkCache)


def _key(text: str | None) -> bytes:
    if text is None or len(text) > 2 * MAX_KEY_BYTES:
        raise InvalidRequest(
            f"point read: give the key as ?key=<hex bytes>, at most {MAX_KEY_BYTES} bytes"
        )
    try:
        return bytes.fromhex(text)
    except ValueError as exc:
        raise InvalidRequest(f"point read: key {text[:40]!r} is not hex ({exc})") from exc


async def point_read(request: web.Request) -> web.Response:
    node = request.app[NODE]
    mi = request.match_info
    store = StoreId.parse(f"{mi['query']}/{mi['operator']}/{mi['partition']}/{mi['name']}")
    key = _key(request.query.get("key"))
    view = node.view()
    text = request.query.get("version")
    if text is None:
        version = (await read_head(node.transport, view, store)).version
    elif text.isascii() and text.isdigit() and len(text) <= 19:
        version = check_version(int(text))
    else:
        raise InvalidRequest(f"version {text[:40]!r} must be a positive integer")
    value = await read_key(
        node.transport, view, store, version, key, request.app[CACHE], max_raw=node.config.max_chunk
    )
    if value is None:
        raise NotFound(f"{store} has no value for that key at version {version}")
    return web.Response(
        body=value,
        content_type="application/octet-stream",
        headers={"X-Statestore-Version": str(version), EPOCH_HEADER: str(node.epoch)},
    )


def register(app: web.Application) -> None:
    app[CACHE] = ChunkCache(32 * 1024 * 1024)
    app.router.add_get("/v1/stores/{query}/{operator}/{partition}/{name}/key", point_read)
