"""Moves: joins, leaves, replacements and token moves on a node, the shell around
``core/handover.py`` and ``core/balance.py``.

Every move goes in rounds (:mod:`~statestore.node.moves.rounds`: list what is to move, copy
it under the ``--stream-mbps`` budget, check; between rounds, wait for the ring to route by
the new state). The modules:

- ``rounds.py``: what every move shares: :func:`copy_round`, :func:`pause`, :func:`settle`,
  :func:`spread`;
- ``join.py``: a joining node (or a replacement) pulls what it will own;
- ``leave.py``: a leaving node pushes what it holds (``statestore decommission``, the drain of
  ``--drain-on-stop``);
- ``rebalance.py``: a node's token count changed through a join's or a leave's rounds
  (``statestore rebalance``, ``--auto-rebalance``);
- ``startup.py``: the checks before a node starts (``--join``, ``--replace``, a wiped disk
  back at a member's address);
- ``copies.py``: a round's manifests in batches; ``pace.py``: those manifests at its chunks'
  pace;
- ``routes.py``: the routes of moves, nodes' and operators', added by :func:`register`.

A source or target that dies mid-round costs another round, not the move; a joining node
that dies is declared down and drops out of both rings (writes go to the old owners alone).
"""

from __future__ import annotations

from statestore.node.moves.copies import Unsupported, fetch_manifests, push_manifests
from statestore.node.moves.join import join_loop, join_round, sees_joining
from statestore.node.moves.leave import drain, leave_round, start_leave
from statestore.node.moves.rebalance import auto_rebalance_loop, resume_loop, start_tokens
from statestore.node.moves.rounds import copy_round, pause, sees_state, settle, spread
from statestore.node.moves.routes import register
from statestore.node.moves.startup import (
    check_join,
    check_replace,
    check_returning,
    sighting,
    startup_transport,
)

__all__ = [
    "Unsupported",
    "auto_rebalance_loop",
    "check_join",
    "check_replace",
    "check_returning",
    "copy_round",
    "drain",
    "fetch_manifests",
    "join_loop",
    "join_round",
    "leave_round",
    "pause",
    "push_manifests",
    "register",
    "resume_loop",
    "sees_joining",
    "sees_state",
    "settle",
    "sighting",
    "spread",
    "start_leave",
    "start_tokens",
    "startup_transport",
]
