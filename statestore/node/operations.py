"""The operator's side of a node, added to the API by one call in ``build_app``: metrics
(``/metrics``), what is in flight (``/v1/activity``), what the node holds
(``/v1/inventory``), point reads (``.../key``), dropping queries (``/v1/queries/...``) and
the dashboard (``/dashboard``), joins and decommissions (``/v1/handover``), and the range
digests repair compares (``/v1/sync/digest``, node to node), and the manifest copies of
hand-overs (``/v1/sync/manifests``, node to node). docs/operations.md describes
them.
"""

from __future__ import annotations

from aiohttp import web

from statestore.node import (
    activity,
    channel,
    dashboard,
    digests,
    hints,
    inventory,
    lookup,
    metrics,
    moves,
    quotas,
    removal,
    tombstones,
)

__all__ = ["install"]


def install(app: web.Application) -> None:
    """Register the operator endpoints and middlewares on ``app`` (which holds its node)."""
    activity.register(app)
    metrics.register(app)  # its middleware goes first: it sees every answer as sent
    inventory.register(app)
    lookup.register(app)
    channel.register(app)  # /v1/lookups: lookups over a kept connection
    tombstones.register(app)
    dashboard.register(app)
    moves.register(app)  # /v1/handover, /v1/load, /v1/sync/manifests (node/moves/routes.py)
    quotas.register(app)
    hints.register(app)
    digests.register(app)
    removal.register(app)  # statestore removenode (/v1/handover/remove)
