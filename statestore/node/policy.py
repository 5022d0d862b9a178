"""Who may call what: the credential every route of the node needs, in one table.

:data:`ROUTES` names every route the node serves (method and path template, as the router
registers it; ``HEAD`` goes with ``GET``) and what it needs (docs/security.md, Trust model).
The auth middleware (node/api.py) and :meth:`Access.authenticate` (node/auth.py) read it and
nothing else; tests/ring/test_hostile_access.py walks the real router and fails on a route that
is not here. The kinds:

- ``open``: no credential (health and its probes, the dashboard's static files, which
  hold no data).
- ``any``: any authenticated caller (a valid token when the node has a tokens file).
- ``right``: a token with the right (``read``, ``write``, ``admin``) on the query the request
  names: the path's ``{query}`` (``on="path"``), the query of the path's chunk key
  (``"key"``), or each query in the body (``"body"``: the middleware checks the right, the
  handler each query once it has decoded the body); ``on=""`` is the right on any query.
- ``ring``: changing the ring (decommission, token moves): ``admin`` on every query (``"*"``).
- ``node``: ring nodes only. With a cluster secret, a valid node signature and nothing else
  (no token, whatever its rights); without one there are no tokens either (node/config.py
  refuses ``--auth-file`` without ``--cluster-secret-file``), so the route is open, as is
  everything on such a ring.

A route may be node-only in part: ``node_if`` lists query parameters that make a request
node-only when ``=1`` (``?copy=1``: a copy between nodes, never refused by a quota and not
fenced; ``?compaction=1``: a compactor's snapshot, never refused by a quota), and
``node_without_tokens`` makes it node-only on a node with no tokens file (a retention floor:
the compactor's, or an ``admin`` token's for its query when there are tokens).

A node (a valid signature) passes every check; so does an open caller (no tokens file)
outside the node-only routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from aiohttp import web

__all__ = ["ROUTES", "Policy", "node_only", "policy_of", "routes_table"]

Kind = Literal["open", "any", "right", "ring", "node"]
Where = Literal["", "path", "key", "body"]


@dataclass(frozen=True)
class Policy:
    kind: Kind
    right: str = ""  # for kind "right"
    on: Where = ""  # where the query the right is checked on is
    node_if: tuple[str, ...] = ()  # query parameters that, at "1", make it node-only
    node_without_tokens: bool = False  # node-only on a node without a tokens file

    def describe(self) -> str:
        """The credential in words (the docs' table)."""
        if self.kind == "open":
            return "open"
        if self.kind == "any":
            return "any token"
        if self.kind == "ring":
            return 'ring admin (admin on "*")'
        if self.kind == "node":
            return "node only"
        where = {"path": "path's query", "key": "chunk key's query", "body": "each query in body"}
        text = f"{self.right} on " + where.get(self.on, "any query")
        if self.node_if:
            text += "; node only with " + ", ".join(f"?{p}=1" for p in self.node_if)
        if self.node_without_tokens:
            text += "; node only without a tokens file"
        return text


OPEN = Policy("open")
ANY = Policy("any")
RING = Policy("ring")
NODE = Policy("node")
COPY = ("copy",)
COPY_OR_COMPACTION = ("copy", "compaction")
STORE = "/v1/stores/{query}/{operator}/{partition}/{name}"
MANIFEST = "/v1/manifests/{query}/{operator}/{partition}/{name}/{version}/{kind}"
HINT = "/v1/hints/{query}/{operator}/{partition}/{name}"


def _r(right: str, on: Where = "", node_if: tuple[str, ...] = ()) -> Policy:
    return Policy("right", right, on, node_if)


ROUTES: dict[tuple[str, str], Policy] = {
    # node and ring
    ("GET", "/v1/health"): OPEN,
    ("GET", "/v1/health/live"): OPEN,  # probes (docs/operations.md, Probes)
    ("GET", "/v1/health/ready"): OPEN,
    ("GET", "/dashboard"): OPEN,
    ("GET", "/dashboard/{name}"): OPEN,
    ("GET", "/v1/ring"): ANY,
    ("GET", "/metrics"): ANY,
    ("GET", "/v1/stores"): ANY,  # filtered to the token's queries
    ("GET", "/v1/activity"): _r("read"),
    ("GET", "/v1/load"): _r("read"),
    ("GET", "/v1/handover"): _r("read"),
    ("GET", "/v1/tombstones"): _r("admin"),
    ("GET", "/v1/inventory"): _r("admin"),  # filtered to the token's queries
    ("POST", "/v1/handover/leave"): RING,
    ("POST", "/v1/handover/tokens"): RING,
    ("POST", "/v1/handover/remove"): RING,  # statestore removenode
    ("GET", "/v1/handover/remove"): _r("read"),
    # between nodes
    ("POST", "/v1/gossip"): NODE,
    ("POST", "/v1/sync/have"): NODE,
    ("POST", "/v1/sync/digest"): NODE,
    ("POST", "/v1/sync/manifests"): NODE,
    ("POST", "/v1/sync/manifests/read"): NODE,
    ("POST", "/v1/handover/items"): NODE,
    ("POST", "/v1/handover/remove/sweep"): NODE,
    ("POST", "/v1/queries/{query}/purge"): NODE,
    ("POST", STORE + "/outcomes"): NODE,
    # chunks and manifests
    ("PUT", "/v1/chunks/{key}"): _r("write", "key", COPY_OR_COMPACTION),
    ("GET", "/v1/chunks/{key}"): _r("read", "key", COPY),
    ("POST", "/v1/chunks"): _r("read", "body"),
    ("PUT", MANIFEST): _r("write", "path", COPY_OR_COMPACTION),
    ("GET", MANIFEST): _r("read", "path", COPY),
    # stores
    ("POST", "/v1/heads"): _r("read", "body"),
    ("POST", "/v1/chains"): _r("read", "body"),
    ("POST", "/v1/relay"): _r("read", "body"),
    ("GET", STORE + "/head"): _r("read", "path"),
    ("GET", STORE + "/versions"): _r("read", "path"),
    ("GET", STORE + "/chain"): _r("read", "path"),
    ("GET", STORE + "/state"): _r("read", "path"),
    ("GET", STORE + "/key"): _r("read", "path"),
    ("POST", STORE + "/lookup"): _r("read", "path"),
    ("GET", "/v1/lookups"): _r("read", "body"),  # each message's query (node/channel.py)
    ("GET", STORE + "/outcomes"): _r("read", "path"),
    ("POST", STORE + "/commit"): _r("write", "path"),
    ("POST", STORE + "/gc"): Policy("right", "admin", "path", node_without_tokens=True),
    ("GET", "/v1/inventory/{query}/{operator}/{partition}/{name}"): _r("read", "path"),
    # tentative commits' hints
    ("PUT", HINT + "/{version}/{kind}"): _r("write", "path", COPY_OR_COMPACTION),
    ("GET", HINT + "/{version}/{kind}"): _r("read", "path"),
    ("GET", HINT): _r("read", "path"),
    # queries
    ("GET", "/v1/queries/{query}"): _r("read", "path"),
    ("GET", "/v1/queries/{query}/room"): _r("write", "path"),
    ("POST", "/v1/queries/{query}/room"): _r("write", "path"),
    ("POST", "/v1/queries/{query}/drop"): _r("admin", "path"),
}


def route_key(route: web.AbstractRoute) -> tuple[str, str] | None:
    """A registered route's key in :data:`ROUTES` (None: not a route of ours, e.g. the
    router's answer to an unknown path)."""
    resource = route.resource
    if resource is None:
        return None
    method = "GET" if route.method == "HEAD" else route.method
    return method, resource.canonical


def policy_of(request: web.Request) -> Policy | None:
    """What the route ``request`` matched needs; None when it matched no route (404, 405:
    any credential is asked for first, as for a route of kind ``any``). A registered route
    missing from the table is a bug: it is served to ring nodes only."""
    key = route_key(request.match_info.route)
    if key is None:
        return None
    return ROUTES.get(key, NODE)


def node_only(request: web.Request, tokens: bool) -> bool:
    """Whether only a ring node may send ``request`` (a node with a tokens file: ``tokens``)."""
    p = policy_of(request)
    if p is None:
        return False
    if p.kind == "node" or (p.node_without_tokens and not tokens):
        return True
    return any(request.query.get(name) == "1" for name in p.node_if)


def routes_table() -> str:
    """:data:`ROUTES` as the markdown table docs/security.md holds (a test compares them)."""
    rows = ["| method | route | credential |", "|---|---|---|"]
    rows += [f"| {m} | `{path}` | {p.describe()} |" for (m, path), p in ROUTES.items()]
    return "\n".join(rows) + "\n"
