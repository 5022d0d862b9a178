"""Checks before a node starts, asking its seeds: a ``--join`` refused while a member moves
tokens (:func:`check_join`), whether ``--replace ID`` may take a dead member's place
(:func:`check_replace`), and whether an empty data dir at a member's address is that member
coming back (:func:`check_returning`). How a member sees another (:func:`sighting`, ``POST
/v1/handover/items`` with ``limit`` 0) is also what ``statestore removenode`` asks
(node/removal.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from statestore.core.errors import StateStoreError, UnprovenAnswer
from statestore.core.handover import NodeState, Sighting, replace_plan
from statestore.core.membership import is_self_alias
from statestore.core.view import RingView
from statestore.net.http import HttpTransport
from statestore.net.tls import client_context
from statestore.net.transport import Transport
from statestore.node.auth import Access
from statestore.node.config import NodeConfig
from statestore.node.daemon import stored_identity, stored_ring_state

__all__ = [
    "ASK_TIMEOUT",
    "check_join",
    "check_replace",
    "check_returning",
    "sighting",
    "startup_transport",
]

log = logging.getLogger(__name__)
ASK_TIMEOUT = 5.0  # seconds a seed or member is given to answer


async def sighting(transport: Transport, address: str, target: str) -> Sighting | None:
    """How the member at ``address`` sees ``target`` (None: unknown to it)."""
    resp = await transport.request(
        "POST",
        address,
        "/v1/handover/items",
        json_body={"node": target, "limit": 0},
        timeout=ASK_TIMEOUT,
    )
    m = resp.json().get("member")
    if m is None:
        return None
    return Sighting(
        str(m["status"]),
        str(m["state"]),
        int(m["incarnation"]),
        str(m["zone"]),
        str(m.get("removal", "")),  # statestore removenode wrote it off
        str(m.get("removed_by", "")),
    )


def startup_transport(config: NodeConfig, node_id: str) -> HttpTransport:
    """A transport for asking the seeds before the node starts, signed as ``node_id``."""
    tls = client_context(config.tls_ca or None) if config.tls_cert else None
    access = Access(node_id, config.cluster_secret_file or None, config.auth_file or None)
    return access.transport(ASK_TIMEOUT, tls)  # believes only proven answers (with the secret)


async def _seeds_view(transport: Transport, seeds: Sequence[str], why: str) -> RingView | None:
    """The ring as the first seed that answers sees it (None: no seed answered). Raises
    ValueError when none did and a seed answered without proof of being a ring node (with
    the secret on): not a node of this ring, or one with another secret."""
    unproven: list[str] = []
    for seed in seeds:
        try:
            answer = (await transport.request("GET", seed, "/v1/ring", timeout=5.0)).json()
            return RingView.from_json(answer)
        except UnprovenAnswer as exc:
            unproven.append(f"{seed} ({exc})")
        except (StateStoreError, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: seed %s gave no ring view: %s", why, seed, exc)
    if unproven:
        raise ValueError(
            f"cannot {why}: no seed proved it is a node of this ring: {'; '.join(unproven)}; "
            "check --seeds and that every node has the same --cluster-secret-file"
        )
    return None


async def check_join(config: NodeConfig) -> None:
    """A new node joining (``--join``, or ``--replace``): refused while a member moves tokens.

    ``statestore rebalance`` moves one node's tokens at a time so that the ring before the
    move and the ring after it differ by that change only; a node that joined meanwhile
    would pull what it owns on a ring that is neither, and a move that saw it join would
    push to it. The token mover refuses to start while a member joins (``RingView.busy``);
    this is the other side. Raises ValueError naming the mover. A node that was joining or
    is normal per its data dir is not asked (a join it resumes waits in :func:`join_loop`
    while a member moves tokens); a decommissioned one that joins again is. No seed
    answering is left to the join itself (it waits on gossip)."""
    kept = stored_ring_state(config.data_dir)
    if stored_identity(config.data_dir) is not None and kept != NodeState.LEFT:
        return
    transport = startup_transport(config, config.replace or "joining")
    await transport.start()
    try:
        view = await _seeds_view(transport, config.seeds, "join")
    finally:
        await transport.close()
    movers = [] if view is None else view.moving_tokens()
    if movers:
        raise ValueError(
            f"cannot join the ring now: member {movers[0]} is moving tokens (statestore "
            "rebalance), one move at a time; start this node again when `statestore ring` "
            "shows no token move"
        )


async def _replace_verdict(
    transport: Transport, config: NodeConfig, target: str
) -> tuple[str | None, int, dict[str, Sighting | None]]:
    """Asks the seeds and the members they know how they see ``target`` (``POST
    /v1/handover/items``, ``limit`` 0) and decides with ``core/handover.replace_plan``:
    ``(why not, incarnation, sightings)``."""
    addresses = list(config.seeds)
    view = await _seeds_view(transport, config.seeds, "replace")
    if view is not None:  # every member a seed knows, so no single view decides
        addresses += [m.address for m in view.members if m.id != target and m.status != "down"]
    sightings: dict[str, Sighting | None] = {}
    for address in dict.fromkeys(addresses):
        try:
            sightings[address] = await sighting(transport, address, target)
        except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("replace: %s did not say how it sees %s: %s", address, target, exc)
    why, incarnation = replace_plan(target, config.zone, sightings, len(set(addresses)))
    return why, incarnation, sightings


async def check_replace(config: NodeConfig) -> int | None:
    """``statestore node --replace ID``: the incarnation to take ID's place at, or None when
    the data dir already holds ID (a replacement restarted: it resumes like ``--join``).

    Decides from how the seeds and the members they know see ID (:func:`_replace_verdict`);
    raises ValueError saying why not (ID alive, unknown, owning nothing, another zone,
    nobody answered), or when the data dir holds another node."""
    target = config.replace
    held = stored_identity(config.data_dir)
    if held == target:
        return None
    if held is not None:
        raise ValueError(
            f"--replace {target}: the data dir {config.data_dir} holds node {held}; a "
            "replacement starts with an empty --data-dir"
        )
    transport = startup_transport(config, target)
    await transport.start()
    try:
        why, incarnation, _ = await _replace_verdict(transport, config, target)
    finally:
        await transport.close()
    if why is not None:
        raise ValueError(f"cannot replace node {target}: {why}")
    log.warning("replacing dead node %s at incarnation %d", target, incarnation)
    return incarnation


async def check_returning(
    config: NodeConfig,
    transport: Transport | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> tuple[str, int] | None:
    """A node started on an empty data dir, without ``--join`` or ``--replace``, at an
    address the ring knows as member X's: a wiped or swapped disk coming back under the same
    command line. It takes X's place as ``--replace X`` would (X's id, so X's tokens; it
    streams X's share as ``joining`` before it serves). Started as a new member instead, it
    would own X's ranges at once with nothing in them and leave X's copies unreplaced, and a
    read answered by it and another new owner could miss an acknowledged version (the
    simulator's seed 250014316491786, docs/reliability.md).

    Waits while the ring does not call X down yet (a quick restart: X's old process cannot
    answer for X any more, so the failure detector will), up to ``6 x --down-after`` plus
    30 s, then raises ValueError. Returns ``(id, incarnation)`` to adopt, or None: not a
    returning node (a data dir that holds an id, a port the OS picks, no seed answered, no
    member at this address, or X may not be replaced: removed, joining or left when it
    died, another zone), and the node starts as before. ``transport``: the simulator's
    (default: HTTP, signed as the node to be)."""
    address = config.advertise or (f"{config.host}:{config.port}" if config.port else "")
    if stored_identity(config.data_dir) is not None or config.join or config.replace:
        return None
    if not address or not config.seeds:
        return None
    own = transport is None
    transport = transport or startup_transport(config, "returning")
    if own:
        await transport.start()
    try:
        deadline = 6 * config.down_after + 30.0
        waited = 0.0
        while True:
            view = await _seeds_view(transport, config.seeds, "start")
            if view is None:
                return None
            former = [m for m in view.members if is_self_alias(m.address, address)]
            if not former:
                return None
            # several ids at one address (an older wipe): the one owning ranges first
            target = min(former, key=lambda m: (m.state not in ("normal", "leaving"), m.id)).id
            why, incarnation, sightings = await _replace_verdict(transport, config, target)
            if why is None:
                log.warning(
                    "the data dir %s is empty and the ring knows node %s at %s: this node "
                    "takes its place (as --replace %s) at incarnation %d and streams its "
                    "share before it serves",
                    config.data_dir,
                    target,
                    address,
                    target,
                    incarnation,
                )
                return target, incarnation
            seen = [s for s in sightings.values() if s is not None]
            alive = [s for s in seen if s.status != "down" and not s.removal]
            if not alive:  # removed, owned nothing, another zone: a new member, as before
                log.warning("starting as a new member at %s: %s", address, why)
                return None
            if waited >= deadline:
                raise ValueError(
                    f"the data dir {config.data_dir} is empty and the ring knows node "
                    f"{target} at {address}, not yet down after {waited:.0f} s: {why}"
                )
            log.info("waiting for the ring to call node %s at %s down: %s", target, address, why)
            step = max(config.down_after / 2, 0.5)
            await sleep(step)
            waited += step
    finally:
        if own:
            await transport.close()
