"""Load-aware balancing (docs/operations.md, Load-aware rebalancing): token counts per member,
the BPM planner, and ``statestore rebalance`` moving tokens through the hand-over on real node
processes.

The pure parts are checked from tables and random rings; the end-to-end test skews a loaded
5-node ring (one node takes four times the tokens of the others through
``POST /v1/handover/tokens``), runs ``statestore rebalance`` under a writer, and checks what a
user would: no commit failed, no sampled item ever below R copies, every acknowledged version
restores exactly, the ring settles at exactly R copies, and the measured imbalance fell.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import urllib.error
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from client import AsyncRingClient, RingClient, StoreId
from statestore.cli.local import http_json
from statestore.core.balance import DecayingRate, NodeLoad, Plan, histogram, imbalance, plan
from statestore.core.errors import MalformedData
from statestore.core.membership import Membership
from statestore.core.placement import Member, Ring, node_tokens
from statestore.core.view import MemberInfo, RingView
from statestore.wire.bodies import GossipDigest, decode_json
from tests.ringkit import (
    ARGS,
    R,
    check_restores,
    config,
    eventually,
    local_ring,
    post,
    stop_load,
    under_load,
    wait_exact,
)

# -- placement with per-member token counts -------------------------------------------------


def test_a_members_own_count_adds_or_removes_only_its_last_tokens() -> None:
    base = Ring([Member("a"), Member("b"), Member("c")], 8)
    same = Ring([Member("a", "", 8), Member("b"), Member("c", "", 0)], 8)
    assert same.tokens == base.tokens  # 0 is the ring's count; the count itself is the same
    grown = Ring([Member("a", "", 12), Member("b"), Member("c")], 8)
    assert set(base.tokens) < set(grown.tokens)
    assert set(grown.tokens) - set(base.tokens) == set(node_tokens("a", 12)[8:])
    shrunk = Ring([Member("a", "", 5), Member("b"), Member("c")], 8)
    assert set(base.tokens) - set(shrunk.tokens) == set(node_tokens("a", 8)[5:])
    assert grown.weight("a") == 12 and grown.weight("b") == 8
    with pytest.raises(ValueError):
        Ring([Member("a", "", -1)], 8)


@pytest.mark.parametrize("n,vnodes,r", [(3, 4, 3), (5, 8, 3), (6, 16, 2), (4, 1, 1), (2, 3, 5)])
def test_coverage_adds_up_to_r_and_matches_items(n: int, vnodes: int, r: int) -> None:
    ring = Ring([Member(f"n{i}", "", vnodes + i) for i in range(n)], vnodes)
    cov = ring.coverage(r)
    assert sum(cov.values()) == pytest.approx(min(r, n))
    rng = random.Random(n * 100 + vnodes)
    keys = [f"k{rng.getrandbits(64):x}" for _ in range(20_000)]
    held = dict.fromkeys(cov, 0)
    for k in keys:
        for node in ring.replicas(k, r):
            held[node] += 1
    for node, share in cov.items():
        assert held[node] / len(keys) == pytest.approx(share, abs=0.02)


# -- the planner --------------------------------------------------------------------------


def _loads(ring: Ring, r: int, scale: float = 1e9) -> list[NodeLoad]:
    return [
        NodeLoad(m.id, ring.weight(m.id), int(scale * share), zone=m.zone)
        for m, share in ((m, ring.coverage(r)[m.id]) for m in ring.members)
    ]


@pytest.mark.parametrize(
    "n,vnodes,r,skew",
    [
        (5, 16, 3, 0),
        (6, 16, 3, 0),
        (4, 16, 2, 0),
        (5, 16, 3, 64),
        (8, 16, 3, 64),
        (7, 32, 2, 0),
        (5, 256, 3, 1024),
    ],
)
def test_the_plan_reaches_the_bound_on_skewed_rings(n: int, vnodes: int, r: int, skew: int) -> None:
    members = [Member(f"node-{i}", "", skew if i == 0 and skew else 0) for i in range(n)]
    ring = Ring(members, vnodes)
    loads = _loads(ring, r)
    p = plan(loads, r, "bytes", 1.15)
    assert p.ratio_after <= max(1.15, p.ratio_before)
    if p.needed:
        assert p.ratio_after <= 1.15, (p.ratio_before, p.ratio_after, p.moves)
        # the prediction is the ring's own coverage at the planned counts
        planned = Ring([Member(i, "", v) for i, v in p.vnodes_after.items()], vnodes)
        cov = planned.coverage(r)
        for node, load in p.load_after.items():
            assert load == pytest.approx(1e9 * cov[node], rel=1e-6)
    # the moves say every change of count, and nothing else changes
    changed = {n for n in p.vnodes_after if p.vnodes_after[n] != p.vnodes_before[n]}
    assert changed <= {n for move in p.moves for n in move[:2]}
    assert {n for n, _ in p.steps()} == changed


def test_bytes_are_predicted_from_where_the_chunks_lie() -> None:
    """A few hundred large chunks do not spread evenly: the histograms the nodes report place
    them, and the loads the plan predicts are the bytes each node then holds."""
    rng = random.Random(9)
    members = [Member(f"node-{i}", "", 64 if i == 0 else 0) for i in range(5)]
    ring = Ring(members, 16)
    items = [
        (f"q/0/{i % 7}/default/{i}/d0-{rng.getrandbits(64):016x}", rng.randrange(1, 4 << 20))
        for i in range(300)
    ]
    held: dict[str, list[tuple[str, int]]] = {m.id: [] for m in members}
    for key, size in items:
        for node in ring.replicas(key, 3):
            held[node].append((key, size))
    loads = [
        NodeLoad(
            m.id, ring.weight(m.id), sum(s for _, s in held[m.id]), histogram=histogram(held[m.id])
        )
        for m in members
    ]
    p = plan(loads, 3, "bytes", 1.15)
    assert p.needed and p.steps()
    planned = Ring([Member(i, "", v) for i, v in p.vnodes_after.items()], 16)
    actual = dict.fromkeys(p.vnodes_after, 0)
    for key, size in items:
        for node in planned.replicas(key, 3):
            actual[node] += size
    for node, predicted in p.load_after.items():  # exact but for items sharing a bucket
        assert predicted == pytest.approx(actual[node], rel=0.05)
    assert imbalance({n: float(v) for n, v in actual.items()}) <= 1.2
    # reports carry the histogram; a malformed one is refused
    report = {
        "id": "a",
        "vnodes": 8,
        "bytes_held": 1,
        "requests_per_s": 0,
        "bytes_served_per_s": 0,
        "histogram": [[1, 10], [4095, 3]],
    }
    assert NodeLoad.from_report(report).histogram == ((1, 10), (4095, 3))
    for bad in ([[4096, 1]], [[1, -1]], [[1]], "x", [[1, 2]] * 5000):
        with pytest.raises(ValueError):
            NodeLoad.from_report(report | {"histogram": bad})


def test_a_balanced_or_idle_ring_is_left_alone() -> None:
    loads = [NodeLoad(f"n{i}", 256, 1000) for i in range(4)]
    p = plan(loads, 3)
    assert not p.needed and p.steps() == [] and p.ratio_after == 1.0
    idle = plan([NodeLoad(f"n{i}", 256, 0) for i in range(3)], 3)
    assert idle.steps() == [] and idle.ratio_before == 1.0


def test_steps_take_tokens_to_the_gaining_nodes_first() -> None:
    p = Plan(
        "bytes",
        1.15,
        {"a": 10, "b": 10, "c": 10, "d": 10},
        {"a": 6, "b": 13, "c": 10, "d": 11},
        {},
        {},
    )
    assert p.steps() == [("b", 13), ("d", 11), ("a", 6)]


def test_the_planner_refuses_what_it_cannot_plan() -> None:
    one = [NodeLoad("a", 8, 10)]
    with pytest.raises(ValueError, match="at least two"):
        plan(one, 3)
    two = [NodeLoad("a", 8, 10), NodeLoad("b", 8, 20)]
    with pytest.raises(ValueError, match="bound"):
        plan(two, 1, bound=0.9)
    with pytest.raises(ValueError, match="metric"):
        plan(two, 1, metric="cpu")
    with pytest.raises(ValueError, match="twice"):
        plan([NodeLoad("a", 8, 10), NodeLoad("a", 8, 20)], 1)


def test_request_rates_are_balanced_too() -> None:
    ring = Ring([Member(f"n{i}") for i in range(5)], 8)
    cov = ring.coverage(2)
    loads = [NodeLoad(i, 8, 0, requests_per_s=100 * c) for i, c in cov.items()]
    p = plan(loads, 2, "requests", 1.1)
    assert imbalance({n.id: n.requests_per_s for n in loads}) == pytest.approx(p.ratio_before)
    assert p.ratio_after <= max(1.1, p.ratio_before)


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"id": "a", "vnodes": 0, "bytes_held": 1, "requests_per_s": 0, "bytes_served_per_s": 0},
        {"id": "a", "vnodes": 5000, "bytes_held": 1, "requests_per_s": 0, "bytes_served_per_s": 0},
        {"id": "a", "vnodes": 8, "bytes_held": -1, "requests_per_s": 0, "bytes_served_per_s": 0},
        {"id": "a", "vnodes": 8, "bytes_held": 1, "requests_per_s": "nan", "bytes_served_per_s": 0},
        {"id": "a", "vnodes": 8, "bytes_held": 1, "requests_per_s": 1e400, "bytes_served_per_s": 0},
        {"id": "a", "vnodes": "x", "bytes_held": 1, "requests_per_s": 0, "bytes_served_per_s": 0},
        [1, 2],
    ],
)
def test_a_malformed_load_report_is_refused(report: object) -> None:
    with pytest.raises(ValueError):
        NodeLoad.from_report(report)


def test_a_decaying_rate_forgets_the_past() -> None:
    rate = DecayingRate(60.0)
    for t in range(60):
        rate.add(10, float(t))
    assert 5 < rate.rate(60.0) < 10  # 10 a second, a minute of it counted with decay
    assert rate.rate(600.0) < 0.01
    rate.add(1, 10.0)  # a clock that steps back counts, it does not blow up
    assert rate.rate(600.0) >= 0


# -- views and gossip ----------------------------------------------------------------------


def _view(next_a: int) -> RingView:
    members = tuple(MemberInfo(i, f"127.0.0.1:{7400 + n}") for n, i in enumerate("abcd"))
    members = (MemberInfo("a", "127.0.0.1:7400", next_vnodes=next_a), *members[1:])
    return RingView(1, members, 3, 2, 8)


def test_a_member_moving_tokens_makes_two_rings() -> None:
    still = _view(0)
    assert not still.moving
    assert not _view(8).moving  # moving to the count it has: nothing moves
    grow = _view(24)
    assert grow.moving and grow.ring.weight("a") == 8 and grow.future.weight("a") == 24
    keys = [f"k{i}" for i in range(400)]
    gained = [k for k in keys if "127.0.0.1:7400" not in grow.replicas_of(k)]
    gained = [k for k in gained if "127.0.0.1:7400" in grow.future_replicas_of(k)]
    assert gained  # it takes ranges...
    for k in gained:  # ...that writes already reach, on top of the current owners
        assert grow.write_replicas_of(k)[:3] == grow.replicas_of(k)
        assert "127.0.0.1:7400" in grow.write_replicas_of(k)
    back = RingView.from_json(json.loads(json.dumps(grow.to_json())))
    assert back == grow


def test_a_ring_with_a_member_down_or_moving_is_busy() -> None:
    members = [MemberInfo(i, f"127.0.0.1:{7400 + n}") for n, i in enumerate("abcd")]
    assert RingView(1, tuple(members), 3, 2, 8).busy() is None
    cases = [
        (replace(members[1], status="down"), "b is down"),
        (replace(members[1], state="joining"), "b is moving (joining)"),
        (replace(members[1], state="leaving"), "b is moving (leaving)"),
        (replace(members[1], next_vnodes=12), "b is moving (tokens)"),
    ]
    for changed, words in cases:
        view = RingView(1, (members[0], changed, *members[2:]), 3, 2, 8)
        assert words in (view.busy() or ""), view.busy()
    gone = replace(members[1], status="down", state="left")  # owned nothing: no reason
    assert RingView(1, (members[0], gone, *members[2:]), 3, 2, 8).busy() is None


@pytest.mark.parametrize("field,value", [("vnodes", -1), ("next_vnodes", 5000), ("vnodes", "8")])
def test_a_view_with_a_bad_token_count_is_malformed(field: str, value: object) -> None:
    obj = _view(0).to_json()
    obj["members"][0][field] = value
    with pytest.raises(MalformedData):
        RingView.from_json(obj)


def test_gossip_carries_token_counts_and_bounds_them() -> None:
    a = Membership("a", "10.0.0.1:7400", "", 1, 0.0)
    b = Membership("b", "10.0.0.2:7400", "", 1, 0.0)
    epoch = a.epoch
    a.set_vnodes(0, 40, 1.0)
    assert a.epoch > epoch  # a move changes the rings: the epoch moves
    b.merge(a.digest(), 1.0)
    seen = b.get("a")
    assert seen is not None and seen.next_vnodes == 40 and seen.vnodes == 0
    a.set_vnodes(40, 0, 2.0)
    b.merge(a.digest(), 2.0)
    seen = b.get("a")
    assert seen is not None and (seen.vnodes, seen.next_vnodes) == (40, 0)
    forged = a.digest()
    forged["members"][0] = forged["members"][0] | {"vnodes": 10**9}
    with pytest.raises(MalformedData):
        decode_json(msgspec.json.encode(forged), GossipDigest, "gossip")
    with pytest.raises(MalformedData):
        b.merge(forged, 3.0)
    with pytest.raises(ValueError):
        a.set_vnodes(5000, 0, 3.0)


def test_a_nodes_token_count_is_kept_in_its_data_dir(tmp_path: Path) -> None:
    from statestore.core.handover import NodeState
    from statestore.node.daemon import RING_STATE_FILE, _load_vnodes, _save_ring_state

    assert _load_vnodes(str(tmp_path)) == 0  # a new node owns the ring's count
    _save_ring_state(str(tmp_path), NodeState.NORMAL, 40)
    assert _load_vnodes(str(tmp_path)) == 40
    for bad in (-1, 5000, "40", None):
        (tmp_path / RING_STATE_FILE).write_text(json.dumps({"state": "normal", "vnodes": bad}))
        assert _load_vnodes(str(tmp_path)) == 0


# -- real processes --------------------------------------------------------------------------


def _statestore(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _wait_switched(address: str, vnodes: int, timeout: float = 90.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    answer: object = None
    while time.monotonic() < deadline:
        answer = http_json(address, "/v1/handover")
        assert isinstance(answer, dict)
        move = answer.get("move") or {}
        if move.get("phase") == "switched" and move.get("vnodes_to") == vnodes:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"no switched move to {vnodes} tokens at {address}: {answer}")


# under a writer that commits without pause, on 2 cores that a Spark test may share: a CI
# run passed the 300 s default here (restoring every version then; 49 s in the run after)
@pytest.mark.timeout(600)
def test_rebalance_evens_out_a_skewed_ring_under_a_writer(tmp_path: Path) -> None:
    with local_ring(tmp_path, 5, [*ARGS, "--vnodes", "16"]) as ring:
        stores = [StoreId("balance", 0, p) for p in range(4)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states, writer, copies = under_load(ring, client, stores, 3, ring.seeds[1:3])
            hot = ring.procs[0]
            # bad bodies are refused and change nothing; the count it has is no move
            for bad in ({"vnodes": 0}, {"vnodes": 5000}, {"vnodes": "8"}, {}):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    post(hot.address, "/v1/handover/tokens", bad)
                assert refused.value.code == 400
            assert post(hot.address, "/v1/handover/tokens", {"vnodes": 16})["move"] is None  # type: ignore[index]
            # skew it: the first node takes four times the tokens of the others
            started = post(hot.address, "/v1/handover/tokens", {"vnodes": 64})
            assert started["move"]["kind"] == "rebalance"  # type: ignore[index]
            _wait_switched(hot.address, 64)
            wait_exact(copies, ring.seeds, R, timeout=60)
            before = json.loads(
                _statestore("rebalance", "--seeds", ring.seeds[0], "--dry-run", "--json").stdout
            )
            assert before["ratio_before"] > 1.1 and before["steps"], before
            # the bound half way down from the measured skew: the writer's commits move the
            # measured ratio between this dry run and the real one (a CI run measured 1.15+ here
            # and 1.149 there, "nothing to move" against a fixed bound of 1.15)
            bound = 1 + (before["ratio_before"] - 1) / 2
            done = _statestore("rebalance", "--seeds", ring.seeds[0], "--bound", f"{bound:.3f}")
            assert done.returncode == 0, done.stderr
            assert "done:" in done.stderr, done.stderr
            time.sleep(1.0)  # commits on the rebalanced ring
            stop_load(writer, copies)
            check_restores(client, writer, states, 6)
            wait_exact(copies, ring.seeds, R, timeout=60)
            view = RingView.from_json(ring.ring())
            assert not view.moving
            counts = {m.id: m.vnodes or 16 for m in view.members}
            # the hot node's share of the tokens fell: a plan may take tokens from it or give
            # the others more (a CI run's plan left it at 64 and raised the others)
            assert counts[hot.id] / sum(counts.values()) < 64 / (64 + 4 * 16), counts
            load = http_json(hot.address, "/v1/load")
            assert load["vnodes"] == counts[hot.id] and load["requests_per_s"] > 0  # type: ignore[index]
            # the old owners drop what they gave up (and the extra copies of commits made during
            # the moves) over their next repair passes: the measured imbalance falls after that
            measured: list[dict[str, object]] = []

            def evened() -> bool:
                out = _statestore("rebalance", "--seeds", ring.seeds[0], "--dry-run", "--json")
                measured.append(json.loads(out.stdout))
                return float(measured[-1]["ratio_before"]) < before["ratio_before"]  # type: ignore[arg-type]

            try:
                # 240 s: in a CI run (2026-11-29, beside Spark tests) 90 s of passes did not
                # drop enough (1.44 measured against 1.41 skewed, the writer's commits included)
                eventually(evened, "the measured imbalance falls below the skewed one", 240, 1.0)
            except AssertionError as exc:
                raise AssertionError((before, measured[-3:])) from exc


async def test_auto_rebalance_moves_tokens_when_the_ring_passes_its_threshold(
    tmp_path: Path,
) -> None:
    """``--auto-rebalance``: four in-process nodes (real HTTP on port 0); one is skewed to
    four times the tokens of the others; the lowest-id member's check plans and runs the
    moves, and the predicted max/mean falls within the bound. A member that is not the
    lowest id does nothing. The threshold is 1.1: with R=3 of 4 nodes no node holds more than
    4/3 of the mean, and the skewed one measured 1.19 in one run of eight (where 1.2 let the
    check stand aside: the test failed one run in three)."""
    from statestore.node.moves.rebalance import auto_rebalance_once, start_tokens
    from statestore.node.server import start_node, stop_node

    first, runner = await start_node(
        config(tmp_path, "n0", replicas=3, write_quorum=2, vnodes=16, auto_rebalance=1.1)
    )
    nodes = [(first, runner)]
    try:
        for i in range(1, 4):
            cfg = config(
                tmp_path,
                f"n{i}",
                replicas=3,
                write_quorum=2,
                vnodes=16,
                auto_rebalance=1.1,
                seeds=[first.address],
            )
            nodes.append(await start_node(cfg))
        live = [n for n, _ in nodes]
        await eventually(lambda: all(len(n.view().live_addresses()) == 4 for n in live), "ring")
        hot = live[2]
        move = start_tokens(hot, 64)
        assert move is not None
        await eventually(lambda: move.handover.phase == "switched", "the skew", 60)
        await eventually(lambda: all(not n.view().moving for n in live), "everyone sees the switch")
        rng = random.Random(5)
        async with AsyncRingClient([first.address], chunk_size=2048) as client:
            # 48 stores: the bytes a node holds follow its tokens closely enough for the plan
            # to reach the bound (with 12, a CI run's plan predicted 1.29 at best)
            for p in range(48):
                rows = {f"k{i}".encode(): rng.randbytes(200) for i in range(75)}
                await client.commit(StoreId("auto", 0, p), 1, rows, [], {}, epoch=1)
        lowest = min(live, key=lambda n: n.id)
        others = [n for n in live if n is not lowest]
        assert not await auto_rebalance_once(others[0])  # not the one that decides
        before = {n.id: n.vnodes or 16 for n in live}
        # a check stands aside while a member looks suspect or busy (a loaded CI machine can
        # delay gossip for a moment): the next checks decide, as the loop's would
        for _ in range(600):  # 120 s: a loaded machine delays gossip longer (a CI run beside
            # the Spark tests, 2026-11-30, did not see a check go through in 40 s)
            if await auto_rebalance_once(lowest):
                break
            await asyncio.sleep(0.2)
        else:
            view = lowest.view()
            raise AssertionError(
                "the lowest normal member never moved tokens: "
                f"busy={view.busy()!r} moving={view.moving!r} "
                f"members={[(m.id, m.status, m.state, m.vnodes) for m in view.members]}"
            )
        await eventually(lambda: all(not n.view().moving for n in live), "moves done", 60)
        after = {n.id: n.vnodes or 16 for n in live}
        assert after != before and after[hot.id] < 64
        ring = Ring([Member(i, "", v) for i, v in after.items()], 16)
        assert imbalance(ring.coverage(3)) <= 1.2
    finally:
        for node, run in reversed(nodes):
            await stop_node(node, run)


async def test_a_join_is_refused_during_a_token_move_and_a_restart_resumes_the_move(
    tmp_path: Path,
) -> None:
    """One move at a time, from both sides: a new node's ``--join`` is refused (naming the
    mover) while a member moves tokens, and leaves nothing in its data dir. The mover,
    stopped mid-move, kept its target: restarted, it moves again and switches, and the
    join then goes through. Four in-process nodes (real HTTP, LMDB), R=3."""
    from statestore.core.handover import NodeState
    from statestore.node.daemon import RING_STATE_FILE
    from statestore.node.moves.rebalance import start_tokens
    from statestore.node.server import start_node, stop_node

    def cfg(name: str, **kw: object) -> Any:
        return config(tmp_path, name, replicas=3, write_quorum=2, vnodes=16, storage="", **kw)

    first, runner = await start_node(cfg("n0", stream_mbps=0.02))
    nodes = {first.id: (first, runner)}
    try:
        for i in range(1, 4):
            n, r = await start_node(cfg(f"n{i}", stream_mbps=0.02, seeds=[first.address]))
            nodes[n.id] = (n, r)
        live = [n for n, _ in nodes.values()]
        await eventually(lambda: all(len(n.view().live_addresses()) == 4 for n in live), "ring")
        rng = random.Random(8)
        written = {}
        async with AsyncRingClient([first.address], chunk_size=4096) as client:
            for p in range(8):
                rows = {f"k{i}".encode(): rng.randbytes(200) for i in range(300)}
                await client.commit(StoreId("resume", 0, p), 1, rows, [], {}, epoch=1)
                written[p] = rows
        hot = live[1]
        move = start_tokens(hot, 48)  # 20 kB/s: the pulls take far longer than this test
        assert move is not None
        await eventually(lambda: move.round_total > 0, "the move's first round")
        assert hot.view().moving_tokens() == [hot.id]

        with pytest.raises(ValueError, match=f"member {hot.id} is moving tokens"):
            await start_node(cfg("new", join=True, seeds=[hot.address]))
        assert not (tmp_path / "new" / "node.json").exists()  # no identity taken

        port = int(hot.address.rsplit(":", 1)[1])
        await stop_node(*nodes.pop(hot.id))
        kept = json.loads((tmp_path / "n1" / RING_STATE_FILE).read_text())
        assert kept["next_vnodes"] == 48 and kept["vnodes"] == 0, kept
        hot, hot_runner = await start_node(cfg("n1", port=port, seeds=[first.address]))
        nodes[hot.id] = (hot, hot_runner)
        live = [n for n, _ in nodes.values()]
        await eventually(
            lambda: hot.move is not None and hot.move.handover.phase == "switched", "resume", 60
        )
        assert hot.move is not None and hot.move.vnodes_to == 48 and hot.vnodes == 48
        kept = json.loads((tmp_path / "n1" / RING_STATE_FILE).read_text())
        assert kept["next_vnodes"] == 0 and kept["vnodes"] == 48, kept  # nothing to resume
        await eventually(lambda: all(not n.view().moving for n in live), "the switch")

        joined, jr = await start_node(cfg("new", join=True, seeds=[first.address]))
        nodes[joined.id] = (joined, jr)
        await eventually(
            lambda: joined.membership is not None and joined.membership.state is NodeState.NORMAL,
            "the join",
            60,
        )
        async with AsyncRingClient([joined.address]) as client:
            for p, rows in written.items():
                got = await client.restore(StoreId("resume", 0, p))
                assert dict(got) == rows
    finally:
        for node, run in reversed(list(nodes.values())):
            await stop_node(node, run)


async def test_a_move_asked_for_supersedes_or_cancels_one_a_restart_interrupted(
    tmp_path: Path,
) -> None:
    """A node whose data dir says a token move was under way (``next_vnodes``): asking it
    for the count it owns cancels that move; a move to another count supersedes it, and
    the resume does not undo it afterwards. One in-process node (R=1)."""
    from statestore.node.daemon import RING_STATE_FILE
    from statestore.node.moves.rebalance import resume_loop, start_tokens
    from statestore.node.server import start_node, stop_node

    node, runner = await start_node(
        config(tmp_path, "n", replicas=1, write_quorum=1, vnodes=16, storage="")
    )

    def kept() -> dict[str, int]:
        return json.loads((tmp_path / "n" / RING_STATE_FILE).read_text())  # type: ignore[no-any-return]

    try:
        node.set_vnodes(0, 48)  # what a stop mid-move leaves behind
        node.set_vnodes(0, 0)
        node.resume_vnodes = 48
        assert start_tokens(node, 16) is None  # the count it owns: the resume is cancelled
        assert node.resume_vnodes == 0 and kept()["next_vnodes"] == 0
        node.resume_vnodes = 48
        resume = asyncio.create_task(resume_loop(node))
        move = start_tokens(node, 24)
        assert move is not None and node.resume_vnodes == 0
        await eventually(lambda: move.handover.phase == "switched", "the move to 24", 30)
        await asyncio.wait_for(resume, 10)
        assert node.vnodes == 24 and node.move is move
        assert kept() == {"state": "normal", "vnodes": 24, "next_vnodes": 0}
    finally:
        await stop_node(node, runner)


async def test_two_token_moves_asked_at_once_never_run_together(tmp_path: Path) -> None:
    """Two members asked to move tokens at the same moment (an operator and the automatic
    mode, say) both pass the check on their own views; once each one's move is known
    everywhere, one that learns of the other gives way (hostile review 64: both ran to
    their switch, two nodes' changes between the rings). Three in-process nodes."""
    from statestore.node.server import start_node, stop_node
    from tests.ringkit import call

    kw: dict[str, Any] = {"replicas": 2, "write_quorum": 2, "vnodes": 16}
    kw["repair_interval"] = 3600
    started = [await start_node(config(tmp_path, "n0", **kw))]
    try:
        for i in (1, 2):
            seeds = [started[0][0].address]
            started.append(await start_node(config(tmp_path, f"n{i}", seeds=seeds, **kw)))
        a, b, c = (n for n, _ in started)
        await eventually(
            lambda: all(len(n.view().live_addresses()) == 3 for n in (a, b, c)), "3 members"
        )
        asked = await asyncio.gather(
            call(a, "POST", "/v1/handover/tokens", json={"vnodes": 32}),
            call(b, "POST", "/v1/handover/tokens", json={"vnodes": 8}),
        )
        assert [status for status, _ in asked] == [202, 202]  # both began: the race
        moves = [n.move for n in (a, b)]
        assert all(m is not None for m in moves)

        def ended() -> bool:
            return all(m.handover.phase in ("switched", "failed") for m in moves if m)

        await eventually(ended, "both moves ended", 60)
        phases = [m.handover.phase for m in moves if m]
        assert phases.count("switched") <= 1, phases
        for m in moves:
            if m is not None and m.handover.phase == "failed":
                assert "gave way (one move at a time)" in m.handover.reason
        # the one that gave way owns what it owned, and moves no more
        for n, before in ((a, 16), (b, 16)):
            if n.move is not None and n.move.handover.phase == "failed":
                assert (n.vnodes or 16) == before
                me = n.membership.get(n.id) if n.membership is not None else None
                assert me is not None and not me.next_vnodes
    finally:
        for n, runner in reversed(started):
            await stop_node(n, runner)
