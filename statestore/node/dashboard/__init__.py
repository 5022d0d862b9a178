"""The dashboard: ``GET /dashboard``, a static page (HTML, JS, CSS shipped in this package, no
build step) that draws the ring and refreshes itself from the JSON endpoints: ``/v1/ring``,
``/v1/health``, ``/v1/activity?scope=ring`` and ``/v1/inventory?scope=ring``.

A token, when the ring has client tokens, goes in the page's fragment
(``/dashboard#token=...``): the script sends it as a bearer token and it never reaches a log.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

__all__ = ["ASSETS", "register"]

# file name -> content type: the only files served (no path ever reaches the filesystem)
ASSETS = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}


def _asset(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_asset("index.html"), content_type=ASSETS["index.html"])


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.Response(
        body=_asset(name),
        content_type=ASSETS[name],
        headers={"Cache-Control": "no-cache"},
    )


def register(app: web.Application) -> None:
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/{name}", asset)
