"""The answer bound (net/http.py) on a stream's error answer too: ``open_stream`` read a
non-200 answer whole, so whoever answers at a hop's address (the restorer's /v1/relay and
/v1/chunks streams, a relay's children) pushed any amount into the node's or client's memory
with a 500 (a second review of the bound). Now an error is read up to 64 KiB."""

from __future__ import annotations

import tracemalloc

import pytest
from aiohttp import web

from statestore.core.errors import StateStoreError
from statestore.net.http import HttpTransport

MB = 1 << 20
SIZE = 96 * MB


async def _huge_error(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=500)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    piece = b"x" * MB
    for _ in range(SIZE // MB):
        await resp.write(piece)
    await resp.write_eof()
    return resp


async def test_a_streams_error_answer_is_read_up_to_a_bound() -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _huge_error)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    address = f"127.0.0.1:{port}"
    t = HttpTransport(timeout=60)
    try:
        # request(): refused past its bound
        with pytest.raises(StateStoreError):
            await t.request("GET", address, "/x", max_bytes=16 * MB)
        tracemalloc.start()
        with pytest.raises(StateStoreError):
            await t.open_stream(address, "/v1/relay/q/0/1/s", b"{}")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 16 * MB, f"open_stream held {peak / MB:.0f} MiB of a 500's body"
    finally:
        await t.close()
        await runner.cleanup()
