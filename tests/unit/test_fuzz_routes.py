"""Every route the node registers has an endpoint-fuzzer template (statestore-fuzz,
docs/reliability.md, Fuzzing): a route the fuzzer cannot build a request for is a route it
never mutates.

The mapping is derived, not listed: each template's request (``fuzz_api``'s generator, on
the fuzzer's own node: the daemon on the in-memory network, no socket) is matched against
the real application's router, as aiohttp matches a request, and the routes it reaches are
compared with those the router registers (``HEAD`` goes with ``GET``, as in
``node/policy.ROUTES``)."""

from __future__ import annotations

import random
from pathlib import Path

from aiohttp.test_utils import make_mocked_request

from statestore.node.api import build_app
from statestore.node.policy import route_key
from statestore.testing import fuzz_api

DRAWS = 1000  # templates drawn: each of the ~50 route names about 20 times (seeded)


async def test_every_registered_route_has_a_fuzzer_template(tmp_path: Path) -> None:
    harness = fuzz_api._Harness(str(tmp_path), seed=3)
    await harness.start()
    try:
        app = build_app(harness.node)
        registered = {route_key(route) for route in app.router.routes()}
        reached: dict[tuple[str, str], set[str]] = {}
        unmatched: dict[str, set[str]] = {}
        for i in range(DRAWS):
            request = fuzz_api._template(random.Random(f"routes/{i}"), harness)
            mocked = make_mocked_request(request.method, request.target(), app=app)
            key = route_key((await app.router.resolve(mocked)).route)
            if key is None:
                unmatched.setdefault(request.route, set()).add(request.target())
            else:
                reached.setdefault(key, set()).add(request.route)
    finally:
        await harness.stop()
    missing = sorted(k for k in registered - set(reached) if k is not None)
    assert not missing, (
        "routes the node registers with no endpoint-fuzzer template "
        f"(statestore/testing/fuzz_api.py, _template): {missing}"
    )
    # and no template builds a request that no route takes (a path that drifted)
    dead = {name: paths for name, paths in unmatched.items() if name not in _names(reached)}
    assert not dead, f"fuzzer templates that match no registered route: {dead}"


def _names(reached: dict[tuple[str, str], set[str]]) -> set[str]:
    return {name for names in reached.values() for name in names}
