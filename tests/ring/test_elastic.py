"""The elastic ring end to end: real node processes join and leave under a writer.

Each test loads a ring, runs a writer thread that commits without pause and a counter thread
that asks every node (``/v1/sync/have``) how many copies of sampled items exist, moves a node
in or out, and then checks what a user would: no commit failed, every acknowledged version
restores exactly, and no sampled item was ever seen with fewer than R copies.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from client import RingClient, StoreId
from statestore.cli.local import http_json
from statestore.core.view import RingView
from tests.ringkit import (
    ARGS,
    Copies,
    R,
    Writer,
    check_restores,
    load,
    local_ring,
    nodes,
    post,
    sample,
    stop_load,
    under_load,
    wait_exact,
    wait_state,
)


def test_a_node_joins_a_loaded_ring_under_a_writer(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, ARGS) as ring:
        stores = [StoreId("join", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states, writer, copies = under_load(ring, client, stores, 1, ring.seeds)
            keys, manifests = copies.keys, copies.manifests
            spawned = time.time()
            newcomer = ring.add_node(["--join", "--stream-mbps", "2"])
            seen = http_json(newcomer.address, "/v1/handover")
            assert seen["state"] in ("joining", "normal")  # type: ignore[index]
            view = json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "statestore",
                        "ring",
                        "--seeds",
                        ring.seeds[0],
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=True,
                ).stdout
            )
            states_seen = {m["id"]: m["state"] for m in view["members"]}
            assert states_seen.get(newcomer.id) in ("joining", "normal", None)
            done = wait_state(newcomer, "normal", timeout=90)
            move = done["move"]
            assert isinstance(move, dict) and move["phase"] == "switched" and move["copied"] > 0
            # when it began, in Unix seconds: after the process was started, before now
            assert spawned <= move["started_at"] <= time.time()
            # the timeline: every member confirmed it joins before the first round listed
            steps = [step for step, _ in move["spans"]]
            assert steps[:3] == ["spread joining", "round 1 list", "round 1 copy"], steps
            # at the switch it already holds every sampled item it now owns (repair had no
            # time to bring them: the hand-over did)
            after = RingView.from_json(ring.ring(newcomer.address))
            mine = [k for k in keys if newcomer.address in after.replicas_of(k)]
            owned = [m for m in manifests if newcomer.address in after.replicas_of(m[0])]
            held = post(newcomer.address, "/v1/sync/have", {"chunks": mine, "manifests": owned})
            assert mine and all(held["chunks"]) and all(held["manifests"])  # type: ignore[index]
            time.sleep(1.5)  # commits after the switch, on the new ring
            stop_load(writer, copies)
            ring.wait_ring(4)
            check_restores(client, writer, states, 6)
            # after the switch the old owners drop what the newcomer now owns
            wait_exact(copies, ring.seeds, R)


def test_decommission_one_of_four_under_a_writer(tmp_path: Path) -> None:
    with local_ring(tmp_path, 4, ARGS) as ring:
        stores = [StoreId("leave", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states, writer, copies = under_load(ring, client, stores, 2, ring.seeds[:2])
            leaving = ring.procs[3]
            cmd = [sys.executable, "-m", "statestore", "decommission", "--seeds", ring.seeds[0]]
            done = subprocess.run(
                [*cmd, "--node", leaving.id, "--timeout", "90"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert "left the ring" in done.stderr
            # every member confirmed ``leaving`` before the first round and ``left`` before
            # the sweep (pushed to each, not waited out on gossip)
            steps = [
                step for step, _ in http_json(leaving.address, "/v1/handover")["move"]["spans"]
            ]  # type: ignore[index]
            assert steps[0] == "spread leaving" and "spread left" in steps, steps
            assert steps[-2:] == ["sweep list", "sweep copy"], steps
            time.sleep(1.0)
            stop_load(writer, copies)
            # the node has left: its own copies no longer count
            remaining = [p.address for p in ring.procs[:3]]
            counts = copies.count(remaining)
            assert counts is not None
            short = {i: n for i, n in counts.items() if n < R}
            assert not short, list(short.items())[:5]
            leaving.stop()
            ring.wait_ring(3)
            view = ring.ring(ring.seeds[0])
            assert {m["id"]: m["state"] for m in view["members"]}[leaving.id] == "left"
            check_restores(client, writer, states, 6)
            again = subprocess.run(
                [*cmd, "--node", leaving.id], capture_output=True, text=True, timeout=60
            )
            assert again.returncode == 0 and "already left" in again.stderr
            nobody = subprocess.run(
                [*cmd, "--node", "no-such-node"], capture_output=True, text=True, timeout=60
            )
            assert nobody.returncode == 1 and "no member no-such-node" in nobody.stderr


def test_joining_node_killed_mid_join_leaves_the_ring_healthy(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, ARGS) as ring:
        stores = [StoreId("killjoin", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states = load(client, stores, 6, seed=3)
            keys, manifests = sample(client, stores, 6)
            writer = Writer(ring.seeds, states, 7)
            writer.start()
            # a tight budget keeps it streaming long enough to be killed mid-join
            newcomer = ring.add_node(["--join", "--stream-mbps", "0.02"])
            deadline = time.monotonic() + 30
            while True:
                move = http_json(newcomer.address, "/v1/handover")["move"]  # type: ignore[index]
                if move and move["round_done"] > 0:
                    break
                assert time.monotonic() < deadline, move
                time.sleep(0.1)
            assert http_json(newcomer.address, "/v1/handover")["state"] == "joining"  # type: ignore[index]
            ring.kill(3)
            ring.wait_ring(3)
            time.sleep(1.0)
            writer.stop()
            assert not writer.failures, writer.failures[:5]
            copies = Copies(ring, keys, manifests)
            counts = copies.count(ring.seeds)
            assert counts is not None and min(counts.values()) >= R
            for address in ring.seeds:
                health = http_json(address, "/v1/health")
                assert health["status"] == "ok", health  # type: ignore[index]
            check_restores(client, writer, states, 6)


def test_restores_during_a_leave_read_from_the_other_replicas(tmp_path: Path) -> None:
    """A leaving node streams everything it holds to its next owners; while it does, a
    restore reads each chunk from the store's other replicas (core/view.RingView.leaving)."""
    with local_ring(tmp_path, 3, ARGS) as ring:
        stores = [StoreId("avoid", 0, p) for p in range(4)]
        # the 4th node joins an empty ring at once; its tight budget keeps its leave going
        slow = ring.add_node(["--join", "--stream-mbps", "0.01"])
        wait_state(slow, "normal")
        ring.wait_ring(4)
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states = load(client, stores, 3, seed=4)
            before = {s: client.restore(s, plan="star").stats.bytes_by_node for s in stores}
        assert any(slow.address in b for b in before.values())  # it served some, before
        post(slow.address, "/v1/handover/leave", {})
        wait_state(slow, "leaving")
        with RingClient(ring.seeds[:1], chunk_size=4096) as client:  # a fresh view
            for sid, state in states.items():
                restored = client.restore(sid, plan="star")
                assert dict(restored) == state
                assert restored.stats.bytes_by_node, restored.stats
                assert slow.address not in restored.stats.bytes_by_node, restored.stats
        assert http_json(slow.address, "/v1/handover")["state"] == "leaving"  # type: ignore[index]


async def test_spread_is_confirmed_by_every_member_or_runs_out(tmp_path: Path) -> None:
    """A state change is pushed to every member and confirmed by each (``spread``): True on
    a healthy ring, recorded in the move's timeline; a state no member confirms runs out
    after four gossip intervals (False, ``(unconfirmed)``), and the rounds take over. Three
    in-process nodes (real HTTP)."""
    from statestore.core.handover import Handover, NodeState
    from statestore.node.daemon import MoveStatus
    from statestore.node.moves import sees_state, spread

    async with nodes(tmp_path, 3, replicas=3) as live:
        node = live[2]
        node.move = MoveStatus(Handover("leave"), node.clock())
        assert await spread(node, sees_state(NodeState.NORMAL), "spread normal")
        assert not await spread(node, lambda answer: False, "spread never")
        steps = [step for step, _ in node.move.spans]
        assert steps == ["spread normal", "spread never (unconfirmed)"]
        # once it returns True, every member routes by the new state
        node.set_state(NodeState.LEAVING)
        assert await spread(node, sees_state(NodeState.LEAVING), "spread leaving")
        assert all(n.membership.get(node.id).state is NodeState.LEAVING for n in live[:2])  # type: ignore[union-attr]
