"""Removing a dead node for good (``statestore removenode``): the shell around
``core/handover.remove_plan`` and the removal marks of ``core/membership.py``.

A member that is ``down`` stays in the ring's table (``statestore ring`` lists it, and
``RingView.busy`` refuses token moves: its copies are one short) until it comes back, is
replaced (``--replace``) or is removed. ``POST /v1/handover/remove {"node": ID}`` (ring admin)
asks a live member, the *remover*, to write ID off:

1. The remover asks every live member how it sees ID (``POST /v1/handover/items``, ``limit``
   0) and refuses, saying why (``remove_plan``), unless every one sees it down, it owned ranges
   and at least R normal live members stay; it refuses while a member joins, leaves or moves
   tokens (one move at a time), and while another live member is already removing ID.
2. It gossips ID's entry marked ``removing`` (written by the remover, the mark wins over every
   entry ID itself ever gossiped: ``core/membership.py``). ID stays down, so it still blocks
   token moves while its share is re-made.
3. Re-replication, in passes: the remover asks every live member (itself included) to *sweep*
   ID's share (``POST /v1/handover/remove/sweep``): the member pushes each item it holds to
   those of the item's owners (the ring without ID, which reads and writes have used since it
   went down) that lack it, in the rounds of a decommission (``node/moves/leave.leave_round``,
   under ``--stream-mbps``), until a round finds nothing missing and every owner answered. Only
   copies are made: nothing is deleted here, and repair drops a copy only once every owner
   confirmed it, as always. A pass is done when every live member's sweep verified; a member
   that did not answer costs another pass.
4. It gossips ID marked ``removed`` (ring state ``left``): views no longer list ID
   (``/v1/ring`` names it under ``removals``), ``RingView.busy`` no longer counts it, and
   ``statestore rebalance``, joins and decommissions go on.

Every node keeps the marks it knows in ``DIR/removed-members.json`` (:func:`removal_loop`),
so a node restarted later, or one that was partitioned meanwhile, still refuses ID; a remover
started again goes on with the removal its mark says it ran (:func:`_resume`). A removed
node started again on its old data dir asks its seeds how they see it first
(:func:`check_removed`) and refuses to start; one that starts anyway (no seed answered)
learns it from gossip and stands aside like a replaced node (node/daemon.py: no loops, 503 on
everything but health and metrics).

``GET /v1/handover/remove``: the removals this node knows, coordinates or sweeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from statestore.core.errors import InvalidRequest, NotFound, StateStoreError
from statestore.core.handover import Handover, NodeState, Phase, RoundResult, Sighting, remove_plan
from statestore.core.membership import REMOVED, REMOVING, Status
from statestore.node.auth import allow, allow_ring
from statestore.node.config import NodeConfig
from statestore.node.daemon import NODE, MoveStatus, Node, stored_identity
from statestore.node.moves import leave_round, pause, settle, sighting, startup_transport
from statestore.node.request import read_body
from statestore.wire.bodies import RemoveRequest, decode_json

__all__ = [
    "REMOVED_FILE",
    "check_removed",
    "load_removed",
    "register",
    "removal_loop",
    "start_removal",
    "start_sweep",
]

log = logging.getLogger(__name__)
_SAVING = threading.Lock()
REMOVED_FILE = "removed-members.json"
SILENT = 30.0  # seconds a member may not answer about its sweep before the pass counts it so
ASK_TIMEOUT = 5.0
RESUME_RETRY = 10.0  # seconds between tries to resume a removal a start left waiting


@dataclass
class _Removals:
    """One node's removals: those it runs (by target), and its sweeps of targets' shares
    (by target: a sequence number, so the remover tells one sweep from the next, and the
    sweep)."""

    runs: dict[str, MoveStatus] = field(default_factory=dict)
    sweeps: dict[str, tuple[int, MoveStatus]] = field(default_factory=dict)
    starting: set[str] = field(default_factory=set)
    seq: int = 0
    resuming: bool = False


_STATE: weakref.WeakKeyDictionary[Node, _Removals] = weakref.WeakKeyDictionary()


def _state(node: Node) -> _Removals:
    state = _STATE.get(node)
    if state is None:
        state = _STATE[node] = _Removals()
    return state


def _running(move: MoveStatus | None) -> bool:
    return move is not None and move.handover.phase in (Phase.STREAMING, Phase.VERIFIED)


# -- the marks in the data dir --------------------------------------------------------------


def load_removed(data_dir: str) -> list[dict[str, Any]]:
    """The removal marks kept in ``data_dir`` (gossip entries; [] when none or unreadable)."""
    path = os.path.join(data_dir, REMOVED_FILE)
    try:
        with open(path) as f:
            entries = json.load(f).get("members", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _save_removed(data_dir: str, entries: list[dict[str, Any]]) -> None:
    path = os.path.join(data_dir, REMOVED_FILE)
    tmp = path + ".tmp"
    with _SAVING:  # one write at a time: two on one temporary file failed
        with open(tmp, "w") as f:
            json.dump({"members": entries}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _marks(node: Node) -> list[dict[str, Any]]:
    assert node.membership is not None
    out = [m.wire() for m in node.membership.removals()]
    if node.membership.removed_self is not None:  # ours, so a restart refuses at once
        mark, by = node.membership.removed_self
        me = node.membership.get(node.id)
        assert me is not None
        out.append(me.wire() | {"removal": mark, "removed_by": by})
    return out


def _persist(node: Node) -> list[dict[str, Any]]:
    """Write the marks this node knows to its data dir; returns what it wrote. On the event
    loop (a file of a few hundred bytes a removed member, written when the marks change):
    writes in worker threads could land out of order, an older set of marks last."""
    marks = _marks(node)
    _save_removed(node.config.data_dir, marks)
    return marks


async def removal_loop(node: Node) -> None:
    """Take back the removal marks kept in the data dir, go on with the removals this node
    ran when it stopped (:func:`_resume`), then keep the file up to date with what gossip
    brings (a node loop)."""
    assert node.membership is not None
    node.membership.remember(
        [e for e in load_removed(node.config.data_dir) if e.get("id") != node.id], node.clock()
    )
    state = _state(node)
    if not state.resuming and any(
        m.removal == REMOVING and m.removed_by == node.id for m in node.membership.removals()
    ):
        state.resuming = True  # once: a restart of this loop does not spawn it again
        node.spawn(lambda: _resume(node), "resume-removals")
    saved = _marks(node)
    try:
        while True:
            if _marks(node) != saved:
                saved = _persist(node)
            await asyncio.sleep(node.config.gossip_interval / 2)
    finally:  # stopped, or standing aside because we were removed: keep what we learnt
        if _marks(node) != saved:
            _save_removed(node.config.data_dir, _marks(node))


async def _resume(node: Node) -> None:
    """A remover that stopped during a removal (its mark ``removing`` by this node, taken
    back from the data dir) runs it to the end again once started, through every check of a
    removal asked for (:func:`start_removal`: every live member says how it sees the node, at
    least R stay, one move at a time), so a node that came up before its peers does not write
    the node off alone. It first waits ``--down-after`` and two gossip intervals, so the
    marks the ring holds now are known (a member that took the removal over while this node
    was down, or finished it, wrote its own mark, which gossip brings); a refusal is tried
    again every ``RESUME_RETRY`` seconds while the mark is still this node's."""
    assert node.membership is not None
    await asyncio.sleep(node.config.down_after + 2 * node.config.gossip_interval)
    while True:
        mine = [
            m.id
            for m in node.membership.removals()
            if m.removal == REMOVING and m.removed_by == node.id
        ]
        if not mine:
            return
        for target in mine:
            if _running(_state(node).runs.get(target)):
                continue
            try:
                if len(_live_peers(node)) < 2:
                    raise InvalidRequest("no other live member is known yet")
                await start_removal(node, target)
                log.warning(
                    "resumed the removal of dead node %s, which this node ran when it stopped",
                    target,
                )
            except StateStoreError as exc:
                log.warning("the removal of %s this node ran waits: %s", target, exc)
        if all(_running(_state(node).runs.get(t)) for t in mine):
            return
        await asyncio.sleep(RESUME_RETRY)


# -- a removed node started again -------------------------------------------------------------


async def check_removed(config: NodeConfig) -> None:
    """Refuse to start a node the ring removed (``statestore removenode``): its data dir
    says so, or a seed does. Raises ValueError saying what to do. A new data dir, or seeds
    that do not answer, are not refused here (gossip tells such a node, and it stands
    aside)."""
    node_id = stored_identity(config.data_dir)
    if node_id is None:
        return
    for e in load_removed(config.data_dir):
        if e.get("id") == node_id:
            raise ValueError(_refusal(node_id, str(e.get("removed_by", "?")), config.data_dir))
    if not config.seeds:
        return
    transport = startup_transport(config, node_id)  # signed as the node, as a join asks
    await transport.start()
    try:
        for seed in config.seeds:
            try:
                seen = await sighting(transport, seed, node_id)
            except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
                log.info("seed %s did not say how it sees %s: %s", seed, node_id, exc)
                continue
            if seen is not None and seen.removal:
                raise ValueError(_refusal(node_id, seen.removed_by, config.data_dir))
    finally:
        await transport.close()


def _refusal(node_id: str, by: str, data_dir: str) -> str:
    return (
        f"node {node_id} was removed from the ring by node {by} (statestore removenode): it "
        f"may not come back with its old identity and data; wipe {data_dir} and start the "
        "machine as a new node with --join"
    )


# -- the remover -------------------------------------------------------------------------------


def _live_peers(node: Node) -> list[tuple[str, str]]:
    """``(id, address)`` of every live member that has not left, this node included."""
    return [
        (m.id, m.address)
        for m in node.view().members
        if m.status != "down" and m.state != NodeState.LEFT
    ]


def _own_sighting(node: Node, target: str) -> Sighting | None:
    assert node.membership is not None
    m = node.membership.get(target)
    if m is None:
        return None
    return Sighting(m.status.value, m.state.value, m.incarnation, m.zone, m.removal, m.removed_by)


def _precheck(node: Node, target: str) -> None:
    """The refusals this node decides alone, before it asks the others."""
    assert node.membership is not None
    if target == node.id:
        raise InvalidRequest(
            f"node {target} is the node asked to run the removal: it is alive, so it is "
            "decommissioned instead (statestore decommission)"
        )
    m = node.membership.get(target)
    if m is None:
        ids = ", ".join(x.id for x in node.view().members)
        raise NotFound(
            f"no member {target} in the ring (members: {ids}): give the id `statestore ring` "
            "shows for the dead node"
        )
    if m.removal == REMOVED:
        raise InvalidRequest(f"node {target} was removed from the ring already (by {m.removed_by})")
    state = _state(node)
    if target in state.starting:
        raise InvalidRequest(
            f"a removal of node {target} is being started on this node ({node.id}): run "
            "removenode again in a moment to follow it"
        )
    if m.removal == REMOVING and m.removed_by != node.id:
        remover = node.membership.get(m.removed_by)
        if remover is not None and remover.status is not Status.DOWN:
            raise InvalidRequest(
                f"a removal of node {target} is already under way on node {m.removed_by} "
                f"({remover.address}): follow it with `statestore ring`"
            )
        # its remover is down: this node takes the removal over
    for x in node.view().members:
        if x.status != "down" and (
            x.state in (NodeState.JOINING, NodeState.LEAVING) or x.next_vnodes
        ):
            what = "tokens" if x.next_vnodes else x.state
            raise InvalidRequest(
                f"member {x.id} is moving ({what}): one move at a time; run removenode once "
                "`statestore ring` shows no move"
            )


async def start_removal(node: Node, target: str, force: bool = False) -> MoveStatus:
    """Begin removing dead member ``target`` for good (module docstring), or return the
    removal of it this node runs already (asking again follows it, as a decommission does);
    raises NotFound for an unknown id and InvalidRequest saying why it may not be removed
    now. ``force``: though other members are down (``remove_plan``)."""
    assert node.membership is not None
    state = _state(node)
    under_way = state.runs.get(target)
    if under_way is not None and _running(under_way):
        return under_way  # asked again (after a --timeout, say): the run, to follow
    _precheck(node, target)
    state.starting.add(target)
    try:
        peers = [a for i, a in _live_peers(node) if i != node.id]
        sightings: dict[str, Sighting | None] = {node.address: _own_sighting(node, target)}

        async def ask(address: str) -> None:
            try:
                sightings[address] = await sighting(node.transport, address, target)
            except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("removenode: %s did not say how it sees %s: %s", address, target, exc)

        await asyncio.gather(*(ask(a) for a in peers))
        view = node.view()
        survivors = [
            m
            for m in view.members
            if m.id != target and m.status == "up" and m.state == NodeState.NORMAL
        ]
        # the other members down (not left, not being removed themselves); none when
        # ``target`` is marked removing already: it was written off when the removal began
        # (this node takes over a removal whose remover died, and that remover is down)
        marked = {x.id for x in node.membership.removals()}
        down = [
            m.id
            for m in view.members
            if m.id != target
            and m.status == "down"
            and m.state != NodeState.LEFT
            and m.id not in marked
        ]
        if target in marked:
            down = []
        why = remove_plan(
            target, sightings, len(peers) + 1, len(survivors), view.replicas, down, force
        )
        if why is not None:
            raise InvalidRequest(f"cannot remove node {target}: {why}")
        if len([s for s in sightings.values() if s is not None]) < len(peers) + 1:
            silent = len(peers) + 1 - len(sightings)
            raise InvalidRequest(
                f"cannot remove node {target}: {silent} live member(s) did not say how they "
                "see it; try again when `statestore ring` shows every other member up"
            )
    finally:
        state.starting.discard(target)
    move = MoveStatus(Handover("remove"), node.clock())
    state.runs[target] = move
    log.warning("removing dead node %s from the ring for good", target)
    node.spawn(lambda: _remove(node, target, move), f"remove-{target}")
    return move


async def _confirm(
    node: Node, target: str, marks: tuple[str, ...], step: str, move: MoveStatus
) -> None:
    """Push our table to every live member and wait until each sees ``target`` with one of
    ``marks``, at most :func:`settle` (gossip goes on after)."""
    started = node.clock()
    deadline = started + settle(node)

    async def one(address: str) -> bool:
        await node.gossip_with(address)
        seen = await sighting(node.transport, address, target)
        return seen is not None and seen.removal in marks

    done = False
    while not done and node.clock() < deadline:
        peers = [a for i, a in _live_peers(node) if i != node.id]
        answers = await asyncio.gather(*(one(a) for a in peers), return_exceptions=True)
        done = all(a is True for a in answers)
        if not done:
            await asyncio.sleep(max(0.05, node.config.gossip_interval / 4))
    move.span(step if done else f"{step} (unconfirmed)", started, node.clock())


async def _sweep_on(node: Node, address: str, target: str) -> dict[str, Any] | None:
    """Have the member at ``address`` sweep ``target``'s share and wait for it; its sweep's
    last state (``phase`` switched: verified clean), or None when it did not answer."""
    if address == node.address:
        try:
            _, move = start_sweep(node, target)
        except StateStoreError as exc:
            log.warning("removenode: this node cannot sweep %s: %s", target, exc)
            return None
        while True:
            if not _running(move):
                return move.to_json(node.clock())
            await asyncio.sleep(0.1)
    try:
        resp = await node.transport.request(
            "POST",
            address,
            "/v1/handover/remove/sweep",
            json_body={"node": target},
            timeout=ASK_TIMEOUT,
            ok=(200, 202),
        )
        seq = int(resp.json()["seq"])
    except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
        log.info("removenode: %s did not start its sweep of %s: %s", address, target, exc)
        return None
    silent_since: float | None = None
    while True:
        await asyncio.sleep(0.2)
        try:
            answer = (
                await node.transport.request(
                    "GET", address, "/v1/handover/remove", timeout=ASK_TIMEOUT
                )
            ).json()
            sweep = answer["removals"][target]["sweep"]
            silent_since = None
        except (StateStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
            silent_since = silent_since or node.clock()
            if node.clock() - silent_since > SILENT:
                log.info("removenode: %s stopped answering about its sweep: %s", address, exc)
                return None
            continue
        if not isinstance(sweep, dict) or sweep.get("seq") != seq:
            return None  # restarted: its sweep is gone
        if sweep.get("phase") not in (Phase.STREAMING, Phase.VERIFIED):
            return sweep


async def _remove(node: Node, target: str, move: MoveStatus) -> None:
    """Run the removal of ``target`` to the end (module docstring, steps 2-4)."""
    assert node.membership is not None
    cur = node.membership.get(target)
    if move.handover.phase is Phase.SWITCHED or cur is None:
        return
    if cur.removal != REMOVED:
        node.membership.mark_removal(target, REMOVING, node.id, node.clock())
        _persist(node)
        await _confirm(node, target, (REMOVING, REMOVED), "spread removing", move)
    while move.handover.phase is Phase.STREAMING:
        started = node.clock()
        peers = [a for _, a in _live_peers(node)]
        move.round_total, move.round_done = len(peers), 0

        async def one(address: str) -> dict[str, Any] | None:
            sweep = await _sweep_on(node, address, target)
            move.round_done += 1
            return sweep

        sweeps = await asyncio.gather(*(one(a) for a in peers))
        done = [s for s in sweeps if s is not None and s.get("phase") == Phase.SWITCHED]
        listed = sum(int((s.get("last_round") or {}).get("listed", 0)) for s in done)
        copied = sum(int(s.get("copied", 0)) for s in done)
        moved = sum(int(s.get("bytes", 0)) for s in done)
        move.bytes += moved
        result = RoundResult(listed, 0, 0, len(peers) - len(done), 0, moved)
        handover = move.handover.after_round(result)
        move.handover = replace(handover, copied=move.handover.copied + copied)
        move.span(f"pass {move.handover.rounds}", started, node.clock())
        log.info(
            "removenode %s pass %d: %s, %d copies", target, move.handover.rounds, result, copied
        )
        await pause(node, move, result)
    node.membership.mark_removal(target, REMOVED, node.id, node.clock())
    _persist(node)
    log.warning("node %s removed from the ring for good", target)
    await _confirm(node, target, (REMOVED,), "spread removed", move)
    move.handover = move.handover.switch()


# -- a member's sweep of a removed node's share ------------------------------------------------


def start_sweep(node: Node, target: str) -> tuple[int, MoveStatus]:
    """Begin (or keep going with) this node's sweep of dead member ``target``'s share: push
    each item it holds to the owners that lack it, in a decommission's rounds, until a clean
    round. Raises NotFound or InvalidRequest when ``target`` is unknown here or not down."""
    assert node.membership is not None
    m = node.membership.get(target)
    if m is None:
        raise NotFound(f"node {node.id} knows no member {target}")
    if m.status is not Status.DOWN:
        raise InvalidRequest(
            f"node {node.id} sees {target} {m.status.value}: only a dead member's share is swept"
        )
    state = _state(node)
    current = state.sweeps.get(target)
    if current is not None and _running(current[1]):
        return current
    state.seq += 1
    move = MoveStatus(Handover("remove"), node.clock())
    state.sweeps[target] = (state.seq, move)
    node.spawn(lambda: _sweep(node, move), f"sweep-{target}")
    return state.seq, move


async def _sweep(node: Node, move: MoveStatus) -> None:
    while move.handover.phase is Phase.STREAMING:
        # the ring's owners now (nobody moves: the removal refused to start otherwise, and
        # token moves are refused while the dead member is not removed): a leave's round
        # without the leave, every item pushed to those of its owners that lack it
        result = await leave_round(node, move, lambda _answer: True)
        move.handover = move.handover.after_round(result)
        log.info("removal sweep round %d: %s", move.handover.rounds, result)
        await pause(node, move, result)
    if move.handover.phase is Phase.VERIFIED:
        move.handover = move.handover.switch()


# -- routes ---------------------------------------------------------------------------------


def removals_json(node: Node) -> dict[str, Any]:
    """``GET /v1/handover/remove``: per target this node knows of, its mark, the removal it
    runs (``run``) and its own sweep (``sweep``, with ``seq``)."""
    assert node.membership is not None
    state = _state(node)
    now = node.clock()
    targets = {m.id for m in node.membership.removals()} | set(state.runs) | set(state.sweeps)
    out: dict[str, Any] = {}
    for t in sorted(targets):
        m = node.membership.get(t)
        run = state.runs.get(t)
        sweep = state.sweeps.get(t)
        out[t] = {
            "mark": "" if m is None else m.removal,
            "by": "" if m is None else m.removed_by,
            "run": None if run is None else run.to_json(now),
            "sweep": None if sweep is None else {"seq": sweep[0]} | sweep[1].to_json(now),
        }
    return {"id": node.id, "removals": out}


async def remove_handler(request: web.Request) -> web.Response:
    """``POST /v1/handover/remove``: remove a dead member for good (202; progress at ``GET
    /v1/handover/remove``)."""
    node = request.app[NODE]
    allow_ring(request)
    body = decode_json(
        await read_body(request), RemoveRequest, "remove", '{"node": ID, "force": false}'
    )
    move = await start_removal(node, body.node, body.force)
    return web.json_response(
        {"id": node.id, "node": body.node, "run": move.to_json(node.clock())}, status=202
    )


async def sweep_handler(request: web.Request) -> web.Response:
    """``POST /v1/handover/remove/sweep`` (between nodes): sweep a dead member's share."""
    node = request.app[NODE]
    allow_ring(request)
    body = decode_json(await read_body(request), RemoveRequest, "sweep", '{"node": ID}')
    seq, move = start_sweep(node, body.node)
    return web.json_response({"seq": seq} | move.to_json(node.clock()), status=202)


async def removals_handler(request: web.Request) -> web.Response:
    """``GET /v1/handover/remove``."""
    node = request.app[NODE]
    allow(request, "read")
    return web.json_response(removals_json(node))


def register(app: web.Application) -> None:
    app.router.add_post("/v1/handover/remove", remove_handler)
    app.router.add_post("/v1/handover/remove/sweep", sweep_handler)
    app.router.add_get("/v1/handover/remove", removals_handler)
