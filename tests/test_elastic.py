"""The elastic ring end to end: real node processes join and leave under a writer.

Each test loads a ring, runs a writer thread that commits without pause and a counter thread
that asks every node (``/v1/sync/have``) how many copies of sampled items exist, moves a node
in or out, and then checks what a user would: no commit failed, every acknowledged version
restores exactly, and no sampled item was ever seen with fewer than R copies.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

from client import RingClient, StoreId
from statestore.cli.local import LocalRing, NodeProcess, http_json
from statestore.core.view import RingView
from tests.conftest import FAST
from tests.test_ring import chunk_keys, manifest_keys, post

R = 3
ARGS = [*FAST, "--retain", "1000"]
Ref = dict[bytes, bytes]


def load(client: RingClient, stores: list[StoreId], versions: int, seed: int) -> dict[StoreId, Ref]:
    """Commit ``versions`` versions of every store; returns each store's state."""
    rng = random.Random(seed)
    states: dict[StoreId, Ref] = {s: {} for s in stores}
    for v in range(1, versions + 1):
        for sid in stores:
            puts = {f"k{rng.randrange(2000):05d}".encode(): rng.randbytes(120) for _ in range(150)}
            client.commit(sid, v, puts, [], {"offset": v}, epoch=1)
            states[sid].update(puts)
    return states


class Writer(threading.Thread):
    """Commits new versions of its stores until stopped; remembers every acknowledged state
    and every failure."""

    def __init__(self, seeds: list[str], states: dict[StoreId, Ref], first: int) -> None:
        super().__init__(daemon=True)
        self.seeds = seeds
        self.state = {s: dict(r) for s, r in states.items()}
        self.next = dict.fromkeys(states, first)
        self.acked: dict[tuple[StoreId, int], Ref] = {}
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        with RingClient(self.seeds, chunk_size=4096) as client:
            while not self.halt.is_set():
                for sid in self.state:
                    v = self.next[sid]
                    puts = {
                        f"w{rng.randrange(4000):05d}".encode(): rng.randbytes(80) for _ in range(60)
                    }
                    dels = [k for k in rng.sample(sorted(self.state[sid]), 5) if k not in puts]
                    try:
                        client.commit(sid, v, puts, dels, {"offset": v}, epoch=1)
                    except Exception as exc:  # every failure is a finding
                        self.failures.append(f"{sid} v{v}: {type(exc).__name__}: {exc}")
                        continue
                    self.state[sid].update(puts)
                    for k in dels:
                        self.state[sid].pop(k, None)
                    self.acked[(sid, v)] = dict(self.state[sid])
                    self.next[sid] = v + 1

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


class Copies(threading.Thread):
    """Counts, again and again, the copies of the sampled items on every node that answers;
    keeps the lowest count seen of each (a round in which a node did not answer is skipped)."""

    def __init__(self, ring: LocalRing, keys: list[str], manifests: list[list[str]]) -> None:
        super().__init__(daemon=True)
        self.ring = ring
        self.keys = keys
        self.manifests = manifests
        self.low: dict[str, int] = {}
        self.rounds = 0
        self.halt = threading.Event()

    def count(self, addresses: list[str]) -> dict[str, int] | None:
        counts = dict.fromkeys(self.keys + ["/".join(m) for m in self.manifests], 0)
        for address in addresses:
            try:
                answer = post(
                    address, "/v1/sync/have", {"chunks": self.keys, "manifests": self.manifests}
                )
            except (OSError, urllib.error.URLError, ValueError):
                return None
            assert isinstance(answer, dict)
            for k, has in zip(self.keys, answer["chunks"], strict=True):
                counts[k] += bool(has)
            for m, has in zip(self.manifests, answer["manifests"], strict=True):
                counts["/".join(m)] += bool(has)
        return counts

    def run(self) -> None:
        while not self.halt.is_set():
            counts = self.count([p.address for p in self.ring.procs if p.alive])
            if counts is not None:
                self.rounds += 1
                for item, n in counts.items():
                    self.low[item] = min(self.low.get(item, n), n)
            time.sleep(0.2)

    def stop(self) -> None:
        self.halt.set()
        self.join(30)

    def below(self, r: int) -> list[tuple[str, int]]:
        return sorted((i, n) for i, n in self.low.items() if n < r)


def sample(
    client: RingClient, stores: list[StoreId], versions: int
) -> tuple[list[str], list[list[str]]]:
    keys: list[str] = []
    manifests: list[list[str]] = []
    for sid in stores:
        keys += chunk_keys(client, sid, list(range(1, versions + 1)))
        manifests += manifest_keys(client, sid, list(range(1, versions + 1)))
    return keys, manifests


def check_restores(
    client: RingClient, writer: Writer, states: dict[StoreId, Ref], versions: int
) -> None:
    assert writer.acked, "the writer committed nothing"
    for (sid, v), state in sorted(writer.acked.items(), key=lambda kv: (kv[0][0].path, kv[0][1])):
        restored = client.restore(sid, v)
        assert dict(restored) == state, f"{sid} v{v} differs"
        assert restored.positions == {"offset": v}
    for sid, state in states.items():
        assert dict(client.restore(sid, versions)) == state


def under_load(
    ring: LocalRing, client: RingClient, stores: list[StoreId], seed: int, seeds: list[str]
) -> tuple[dict[StoreId, Ref], Writer, Copies]:
    """Load six versions of each store, then start the writer (through ``seeds``) and the
    copy counter (over every chunk and manifest of the loaded versions)."""
    states = load(client, stores, 6, seed=seed)
    keys, manifests = sample(client, stores, 6)
    writer = Writer(seeds, states, 7)
    copies = Copies(ring, keys, manifests)
    writer.start()
    copies.start()
    time.sleep(1.0)
    return states, writer, copies


def stop_load(writer: Writer, copies: Copies) -> None:
    """Stop both; no commit failed, no sampled item was seen below R copies."""
    writer.stop()
    copies.stop()
    assert not writer.failures, writer.failures[:5]
    assert copies.rounds > 3
    assert not copies.below(R), copies.below(R)[:5]


def wait_state(node: NodeProcess, state: str, timeout: float = 60.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    answer: object = None
    while time.monotonic() < deadline:
        answer = http_json(node.address, "/v1/handover")
        assert isinstance(answer, dict)
        if answer["state"] == state:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"node {node.id} did not become {state}: {answer}")


def wait_exact(copies: Copies, addresses: list[str], r: int, timeout: float = 40.0) -> None:
    """Old owners drop what they handed over: every sampled item settles at exactly ``r``."""
    deadline = time.monotonic() + timeout
    counts = None
    while time.monotonic() < deadline:
        counts = copies.count(addresses)
        if counts is not None and set(counts.values()) == {r}:
            return
        time.sleep(0.5)
    extra = {i: n for i, n in (counts or {}).items() if n != r}
    raise AssertionError(f"{len(extra)} items not at {r} copies: {list(extra.items())[:5]}")


def test_a_node_joins_a_loaded_ring_under_a_writer(tmp_path: Path) -> None:
    ring = LocalRing(str(tmp_path), 3, args=ARGS).start()
    stores = [StoreId("join", 0, p) for p in range(3)]
    try:
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
    finally:
        ring.stop()


def test_decommission_one_of_four_under_a_writer(tmp_path: Path) -> None:
    ring = LocalRing(str(tmp_path), 4, args=ARGS).start()
    stores = [StoreId("leave", 0, p) for p in range(3)]
    try:
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
    finally:
        ring.stop()


def test_joining_node_killed_mid_join_leaves_the_ring_healthy(tmp_path: Path) -> None:
    ring = LocalRing(str(tmp_path), 3, args=ARGS).start()
    stores = [StoreId("killjoin", 0, p) for p in range(3)]
    try:
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
    finally:
        ring.stop()


def test_restores_during_a_leave_read_from_the_other_replicas(tmp_path: Path) -> None:
    """A leaving node streams everything it holds to its next owners; while it does, a
    restore reads each chunk from the store's other replicas (core/view.RingView.leaving)."""
    ring = LocalRing(str(tmp_path), 3, args=ARGS).start()
    stores = [StoreId("avoid", 0, p) for p in range(4)]
    try:
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
    finally:
        ring.stop()


async def test_spread_is_confirmed_by_every_member_or_runs_out(tmp_path: Path) -> None:
    """A state change is pushed to every member and confirmed by each (``spread``): True on
    a healthy ring, recorded in the move's timeline; a state no member confirms runs out
    after four gossip intervals (False, ``(unconfirmed)``), and the rounds take over. Three
    in-process nodes (real HTTP)."""
    from statestore.core.handover import Handover, NodeState
    from statestore.node.daemon import MoveStatus
    from statestore.node.handover import sees_state, spread
    from statestore.node.server import start_node, stop_node
    from tests.test_security import config, eventually

    first, runner = await start_node(config(tmp_path, "n0", replicas=3))
    nodes = [(first, runner)]
    try:
        for i in (1, 2):
            nodes.append(
                await start_node(config(tmp_path, f"n{i}", replicas=3, seeds=[first.address]))
            )
        live = [n for n, _ in nodes]
        await eventually(lambda: all(len(n.view().live_addresses()) == 3 for n in live), "ring")
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
    finally:
        for n, r in reversed(nodes):
            await stop_node(n, r)
