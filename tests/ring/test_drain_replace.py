"""A node drained on SIGTERM (``--drain-on-stop``) and a dead node replaced (``--replace ID``),
with real node processes: the checks a user would make, as in tests/ring/test_elastic.py."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import RingClient, StoreId
from statestore.cli.local import NodeProcess, http_json
from statestore.cli.main import main
from statestore.core.handover import NodeState
from statestore.core.view import RingView
from statestore.node import server
from statestore.node.backends import MemoryBackend
from statestore.node.config import NodeConfig
from statestore.node.daemon import Node, stored_identity
from statestore.node.moves import check_replace, check_returning
from tests.ringkit import (
    ARGS,
    Copies,
    R,
    Writer,
    check_restores,
    eventually,
    held_states,
    load,
    local_ring,
    post,
    sample,
    short_copies,
    stop_load,
    under_load,
    wait_exact,
    wait_state,
)


def wait_exit(node: NodeProcess, timeout: float) -> int:
    assert node.proc is not None
    try:
        code = node.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        node.proc.kill()
        node.proc.wait()
        raise AssertionError(f"node {node.id} did not exit within {timeout} s") from None
    node.proc = None
    return code


def log_of(node: NodeProcess) -> str:
    with open(node.log_path, "rb") as f:
        return f.read().decode(errors="replace")


def wait_log(node: NodeProcess, text: str, timeout: float = 30.0) -> None:
    eventually(lambda: text in log_of(node), f"{text!r} logged by {node.id}", timeout, every=0.1)


def test_sigterm_drains_a_node_before_it_exits(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, ARGS) as ring:
        drained = ring.add_node(["--drain-on-stop", "--stream-mbps", "1"])
        ring.wait_ring(4)
        stores = [StoreId("drain", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            others = [p.address for p in ring.procs[:3]]
            states, writer, copies = under_load(ring, client, stores, 4, others)
            assert drained.proc is not None
            drained.proc.send_signal(signal.SIGTERM)
            assert wait_exit(drained, 120) == 0, log_of(drained)[-2000:]
            with open(Path(drained.data_dir) / "node.out") as f:
                out = f.read()
            assert "drained: it left the ring" in out, out
            time.sleep(1.0)  # commits on the ring without it
            stop_load(writer, copies)  # never below R copies, while it drained and after
            # what it held is on R of the remaining nodes the moment it is gone
            counts = copies.count(others)
            assert counts is not None
            assert not {i: n for i, n in counts.items() if n < R}
            ring.wait_ring(3)
            view = ring.ring(others[0])
            assert {m["id"]: m["state"] for m in view["members"]}[drained.id] == "left"
            check_restores(client, writer, states, 6)
            # every version the writer committed settles at R copies too
            top = min(writer.next.values()) - 1
            deadline = time.monotonic() + 30
            while short := short_copies(ring, client, stores, top):
                if time.monotonic() >= deadline:
                    raise AssertionError(
                        f"{list(short.items())[:5]}\n{held_states(others, stores)}"
                    )
                time.sleep(0.5)
            # it refuses to start again as a member: it left
            again = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "statestore",
                    "node",
                    "--data-dir",
                    drained.data_dir,
                    "--listen",
                    "127.0.0.1:0",
                    "--seeds",
                    others[0],
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert again.returncode == 2 and "decommissioned" in again.stderr


def test_drain_refused_or_abandoned_exits_non_zero(tmp_path: Path) -> None:
    with local_ring(tmp_path, 2, ARGS) as ring:
        small = ring.add_node(["--drain-on-stop", "--drain-timeout", "2"])
        ring.wait_ring(3)
        # R=3 on 3 nodes: leaving would keep 2 normal nodes
        assert small.proc is not None
        small.proc.send_signal(signal.SIGTERM)
        assert wait_exit(small, 60) == 1
        log = log_of(small)
        assert "cannot leave" in log and "fewer than R=3" in log, log[-2000:]
        assert "stops without a finished drain" in log
        ring.restart(2)  # it never left: it starts again as a member
        ring.wait_ring(3)
        slow = ring.add_node(["--drain-on-stop", "--stream-mbps", "0.005"])
        ring.wait_ring(4)
        stores = [StoreId("abandon", 0, p) for p in range(2)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            load(client, stores, 4, seed=5)
        assert slow.proc is not None
        slow.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 40
        while True:  # mid-drain: it has pushed something and is not done
            move = http_json(slow.address, "/v1/handover")["move"]  # type: ignore[index]
            if move and move["kind"] == "leave" and move["round_done"] > 0:
                break
            assert time.monotonic() < deadline, move
            time.sleep(0.1)
        assert move["phase"] == "streaming"
        slow.proc.send_signal(signal.SIGTERM)  # the second signal stops it at once
        assert wait_exit(slow, 40) == 1
        assert "drain was abandoned" in log_of(slow)


def test_replace_a_dead_node_takes_its_tokens_and_its_share(tmp_path: Path) -> None:
    with local_ring(tmp_path, 4, ARGS) as ring:
        stores = [StoreId("replace", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states = load(client, stores, 6, seed=6)
            keys, manifests = sample(client, stores, 6)
            before = RingView.from_json(ring.ring())
            dead = ring.procs[3]
            dead_id, dead_address = dead.id, dead.address
            share = [k for k in keys if dead_address in before.replicas_of(k)]
            ring.kill(3)
            ring.wait_ring(3)
            cmd = [sys.executable, "-m", "statestore", "node", "--listen", "127.0.0.1:0"]
            cmd += [*ARGS, "--seeds", ring.seeds[0]]
            for i, (target, says) in enumerate(
                [
                    (ring.procs[0].id, f"node {ring.procs[0].id} is up"),
                    ("no-such-node", "no member of the ring knows a node no-such-node"),
                ]
            ):
                data_dir = tmp_path / f"refused-{i}"
                refused = subprocess.run(
                    [*cmd, "--data-dir", str(data_dir), "--replace", target],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert refused.returncode == 2 and says in refused.stderr, refused.stderr
                assert not (data_dir / "node.json").exists()  # it took no identity
            writer = Writer(ring.seeds, states, 7)
            writer.start()
            new = ring.add_node(["--replace", dead_id, "--stream-mbps", "0.1"])
            assert new.id == dead_id and new.address != dead_address
            # while it streams it is a pending owner: the ring reads its share elsewhere
            deadline = time.monotonic() + 30
            while True:
                seen = RingView.from_json(ring.ring(ring.seeds[0]))
                if {m.id: m.state for m in seen.members}.get(dead_id) == "joining":
                    break
                assert time.monotonic() < deadline, seen.members
                time.sleep(0.1)
            assert http_json(new.address, "/v1/handover")["state"] == "joining"  # type: ignore[index]
            assert not [k for k in share if new.address in seen.replicas_of(k)]
            assert all(new.address in seen.future_replicas_of(k) for k in share)
            done = wait_state(new, "normal", timeout=90)
            move = done["move"]
            assert isinstance(move, dict) and move["phase"] == "switched" and move["copied"] > 0
            # the same id, so the same tokens: it owns exactly what the dead node owned
            after = RingView.from_json(ring.ring(new.address))
            assert [k for k in keys if new.address in after.replicas_of(k)] == share
            owned = [m for m in manifests if new.address in after.replicas_of(m[0])]
            held = post(new.address, "/v1/sync/have", {"chunks": share, "manifests": owned})
            assert share and all(held["chunks"]) and all(held["manifests"])  # type: ignore[index]
            time.sleep(1.0)  # commits on the ring with it
            writer.stop()
            assert not writer.failures, writer.failures[:5]
            ring.wait_ring(4)
            check_restores(client, writer, states, 6)
            # the copies repair made while it was dead are dropped: exactly R again
            wait_exact(Copies(ring, keys, manifests), ring.seeds, R)
            # the dead node's old data dir started again by mistake: it learns it was
            # replaced and stands aside (no fight over the id), the ring keeps the new one
            seeds = ring.seeds
            dead.start(seeds[:1])
            deadline = time.monotonic() + 30
            while True:
                health = http_json(dead.address, "/v1/health")
                reasons = " ".join(health["reasons"])  # type: ignore[index]
                if f"replaced by the node at {new.address}" in reasons:
                    break
                assert time.monotonic() < deadline, health
                time.sleep(0.2)
            for address in seeds:
                view = ring.ring(address)
                assert {m["id"]: m["address"] for m in view["members"]}[dead_id] == new.address
            assert http_json(new.address, "/v1/health")["status"] == "ok"  # type: ignore[index]


def test_a_wiped_node_started_again_takes_its_old_place(tmp_path: Path) -> None:
    """A node's disk is wiped and the node started again with the same command line (no
    --join, no --replace), before the ring calls it down: it waits until it is down, takes
    its old id and tokens, streams its share as ``joining`` and serves every version. (It
    used to enter as a new member owning the old one's ranges with nothing in them:
    docs/reliability.md, seed 250014316491786.)"""
    with local_ring(tmp_path, 4, ARGS) as ring:
        stores = [StoreId("wiped", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states = load(client, stores, 6, seed=9)
            keys, manifests = sample(client, stores, 6)
            before = RingView.from_json(ring.ring())
            wiped = ring.procs[3]
            old_id, address = wiped.id, wiped.address
            share = [k for k in keys if address in before.replicas_of(k)]
            ring.kill(3)
            shutil.rmtree(wiped.data_dir)
            ring.restart(3)  # at once: it is not down yet
            assert (wiped.id, wiped.address) == (old_id, address)
            assert "takes its place" in log_of(wiped)
            wait_state(wiped, "normal", timeout=90)
            ring.wait_ring(4)
            after = RingView.from_json(ring.ring(address))
            assert sorted(m.id for m in after.members) == sorted(m.id for m in before.members)
            owned = [m for m in manifests if address in after.replicas_of(m[0])]
            held = post(address, "/v1/sync/have", {"chunks": share, "manifests": owned})
            assert share and all(held["chunks"]) and all(held["manifests"])  # type: ignore[index]
            for sid, state in states.items():
                assert dict(client.restore(sid, 6)) == state


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--drain-timeout", "0"], "'0' is not a positive number"),
        (["--drain-timeout", "soon"], "'soon' is not a positive number"),
        (["--replace", "../etc", "--seeds", "127.0.0.1:1"], "is no node id"),
        (["--replace", "x" * 65, "--seeds", "127.0.0.1:1"], "is no node id"),
        (["--replace", "3f2a9c0d1e2b4f6a"], "--replace needs --seeds"),
        (["--switch-interval-ms", "0"], "'0' is not a positive number"),
        (["--switch-interval-ms", "500"], "between 0.05 and 100 ms"),
    ],
)
def test_drain_and_replace_flags_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    data_dir = tmp_path / "n"
    try:
        code = main(["node", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), *flags])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err
    assert not data_dir.exists()  # refused before it took an identity


def test_a_node_process_takes_its_thread_switch_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_node`` sets the interpreter's switch interval before it serves (node/server.py
    ``tune_interpreter``); the interval in force before is restored after."""
    seen: list[float] = []

    def serve_nothing(main: Any) -> int:
        main.close()
        seen.append(sys.getswitchinterval())
        return 0

    before = sys.getswitchinterval()
    monkeypatch.setattr(server.asyncio, "run", serve_nothing)
    monkeypatch.setattr(server, "_raise_open_file_limit", lambda: None)
    try:
        assert server.run_node(NodeConfig(switch_interval_ms=0.5)) == 0
        assert server.run_node(NodeConfig()) == 0
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.0005), pytest.approx(0.001)]


async def test_how_a_member_is_seen_and_replace_refusals_in_process(
    solo: Node, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as http:

        async def items(body: object) -> tuple[int, dict[str, object]]:
            url = f"http://{solo.address}/v1/handover/items"
            async with http.post(url, json=body) as resp:
                return resp.status, await resp.json()

        status, seen = await items({"node": solo.id, "limit": 0})
        assert status == 200 and seen["member"] == {
            "status": "up",
            "state": "normal",
            "incarnation": solo.incarnation,
            "zone": "",
        }
        status, seen = await items({"node": "nobody", "limit": 0})
        assert status == 200 and seen["member"] is None and seen["state"] is None
        for bad in ({"node": "../x", "limit": 0}, {"limit": 0}, {"node": "a", "limit": -1}, []):
            status, seen = await items(bad)
            assert status == 400, (bad, seen)

    def config(data_dir: str, target: str) -> NodeConfig:
        return NodeConfig(
            port=0,
            data_dir=data_dir,
            seeds=[solo.address],
            dht=False,
            storage="memory://",
            replace=target,
        )

    for target, says in ((solo.id, "is up as"), ("nobody", "no member of the ring knows")):
        fresh = config(str(tmp_path / "r"), target)
        with pytest.raises(ValueError, match=says):
            await check_replace(fresh)
        assert stored_identity(fresh.data_dir) is None
    with pytest.raises(ValueError, match=f"holds node {solo.id}"):
        await check_replace(config(solo.config.data_dir, "nobody"))
    # a replacement restarted (its data dir holds the id): it resumes, nothing is asked
    assert await check_replace(config(solo.config.data_dir, solo.id)) is None


async def test_an_empty_data_dir_at_a_live_members_address_waits_then_refuses(
    solo: Node, tmp_path: Path
) -> None:
    """node/moves/startup.check_returning: an empty data dir advertising the address of a member
    that stays up is refused once the wait is over (nothing taken); at an address the ring
    does not know, or with a data dir that holds an id, it is an ordinary start."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    def config(data_dir: str, advertise: str) -> NodeConfig:
        return NodeConfig(
            data_dir=data_dir,
            advertise=advertise,
            seeds=[solo.address],
            dht=False,
            storage="memory://",
            down_after=1.0,
        )

    fresh = config(str(tmp_path / "fresh"), solo.address)
    with pytest.raises(ValueError, match=f"knows node {solo.id} at {solo.address}, not yet down"):
        await check_returning(fresh, sleep=sleep)
    assert waits and sum(waits) >= 6 * fresh.down_after + 30
    assert stored_identity(fresh.data_dir) is None
    assert await check_returning(config(str(tmp_path / "other"), "127.0.0.1:1")) is None
    assert await check_returning(config(solo.config.data_dir, solo.address)) is None


async def test_a_replaced_node_serves_nothing_but_health_and_stops_its_loops(solo: Node) -> None:
    assert solo.membership is not None
    # gossip carrying our id at another address, at a higher incarnation: a --replace took it
    solo.membership.merge(
        {
            "epoch": solo.membership.epoch,
            "members": [
                {
                    "id": solo.id,
                    "address": "127.0.0.1:9",
                    "incarnation": solo.incarnation + 1,
                    "heartbeat": 10**6,
                }
            ],
        },
        solo.clock(),
    )
    solo._check_superseded()
    assert solo.membership.superseded is not None
    async with aiohttp.ClientSession() as http:
        base = f"http://{solo.address}"
        key = "q1/0/0/default/1/d0-0011223344556677"
        async with http.put(f"{base}/v1/chunks/{key}", data=b"x") as resp:
            assert resp.status == 503, await resp.text()
            assert "replaced" in (await resp.json())["error"]["message"]
        for path in ("/v1/ring", "/v1/stores", "/v1/stores/q1/0/0/default/head"):
            async with http.get(base + path) as resp:
                assert resp.status == 503, path
        async with http.get(f"{base}/v1/health") as resp:
            health = await resp.json()
            assert resp.status == 200 and health["status"] == "degraded"
    assert solo.store.chunk_keys() == []  # the refused write left nothing
    await asyncio.sleep(0)  # let the cancellations land
    assert all(t.done() for t in solo._tasks), [t for t in solo._tasks if not t.done()]


def test_a_join_cut_short_resumes_as_a_join_whatever_the_flags(tmp_path: Path) -> None:
    def start(join: bool) -> Node:
        config = NodeConfig(port=0, data_dir=str(tmp_path / "n"), dht=False, join=join)
        return Node(config, backend=MemoryBackend())

    node = start(join=True)  # a join starts ... and the process dies before it finished
    assert node.initial_state is NodeState.JOINING
    node.release()
    node = start(join=False)  # restarted without --join: still a join, not an owner
    assert node.initial_state is NodeState.JOINING
    node.release()
