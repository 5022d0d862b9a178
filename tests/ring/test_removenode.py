"""A dead node removed for good (``statestore removenode``): the removal marks in gossip
(core/membership.py), the decision (core/handover.remove_plan), and real node processes: a
loaded 4-node ring under a writer loses a node to ``kill -9``, the node is removed, the ring
holds R copies of everything again, ``rebalance`` works again, and the removed node's data
dir started again is refused (or, when no seed answers, learns it and serves nothing)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from client import AsyncRingClient, RingClient, StoreId
from statestore.cli.local import http_json
from statestore.cli.main import main
from statestore.core.handover import NodeState, Sighting, remove_plan, replace_plan
from statestore.core.membership import REMOVED, REMOVING, Membership, Status
from statestore.core.view import MemberInfo, RingView
from statestore.node.removal import _persist, load_removed
from tests.ringkit import (
    ARGS,
    Copies,
    R,
    Restartable,
    Writer,
    check_restores,
    cli,
    eventually,
    held_states,
    load,
    local_ring,
    sample,
    sees,
    short_copies,
    wait_exact,
)

# -- gossip: the marks ------------------------------------------------------------------------


def _entry(ident: str, inc: int, hb: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": ident,
        "address": f"127.0.0.1:{7000 + int(ident[1:])}",
        "incarnation": inc,
        "heartbeat": hb,
    } | extra


def _ring(n: int = 4) -> list[Membership]:
    ms = [Membership(f"n{i}", f"127.0.0.1:{7000 + i}", "", 1, 0.0) for i in range(n)]
    for a in ms:
        for b in ms:
            a.merge(b.digest(), 0.0)
    return ms


def test_a_removal_mark_wins_every_merge_and_spreads() -> None:
    n0, n1, n2, _ = _ring()
    for m in (n0, n1, n2):
        m.tick(10.0)  # n3 silent: down everywhere
        assert n0.get("n3") is not None and m.get("n3").status is Status.DOWN  # type: ignore[union-attr]
    epoch = n0.epoch
    assert n0.mark_removal("n3", REMOVING, "n0", 10.0)  # the epoch moves: views change
    assert n0.epoch == epoch + 1
    n1.merge(n0.digest(), 10.0)
    seen = n1.get("n3")
    assert seen is not None and seen.removal == REMOVING and seen.status is Status.DOWN
    assert not n1.refused
    n0.mark_removal("n3", REMOVED, "n0", 11.0)
    n2.merge(n0.digest(), 11.0)  # n2 missed the "removing": the end reaches it all the same
    n1.merge(n2.digest(), 11.0)
    for m in (n0, n1, n2):
        e = m.get("n3")
        assert e is not None and (e.removal, e.state, e.status) == (
            REMOVED,
            NodeState.LEFT,
            Status.DOWN,
        )
        assert "n3" not in [x.id for x in m.live()]
    # the dead node's own gossip, even a newer life of it, never brings it back
    for entry in (_entry("n3", 1, 10**6), _entry("n3", 50, 1)):
        n1.merge({"epoch": n1.epoch, "members": [entry]}, 20.0)
        e = n1.get("n3")
        assert e is not None and e.removal == REMOVED and e.status is Status.DOWN
        assert not n1.refused  # silently: the peer's gossip answer carries the mark back
    n1.tick(30.0)
    assert n1.get("n3").status is Status.DOWN  # type: ignore[union-attr]
    # a "removing" never undoes a "removed"
    n2.merge({"epoch": n2.epoch, "members": [_entry("n3", 9, 9, removal=REMOVING)]}, 30.0)
    assert n2.get("n3").removal == REMOVED  # type: ignore[union-attr]


def test_a_removed_node_learns_it_and_a_restart_remembers() -> None:
    n0, _, _, n3 = _ring()
    n0.tick(10.0)
    n0.mark_removal("n3", REMOVED, "n0", 10.0)
    n3.merge(n0.digest(), 10.0)  # the removed node hears of it: it does not refute it
    assert n3.removed_self == (REMOVED, "n0")
    assert n3.get("n3").removal == ""  # type: ignore[union-attr]
    # a survivor restarted takes its marks back from its data dir
    fresh = Membership("n1", "127.0.0.1:7001", "", 2, 0.0)
    fresh.remember([m.wire() for m in n0.removals()] + [{"junk": 1}], 0.0)
    assert [m.id for m in fresh.removals()] == ["n3"]
    fresh.merge({"epoch": 1, "members": [_entry("n3", 2, 5)]}, 1.0)
    assert fresh.get("n3").removal == REMOVED and fresh.live() == [fresh.get("n1")]  # type: ignore[union-attr]
    # an unmarked member gossips exactly as before (older nodes read it unchanged)
    assert "removal" not in n0.get("n1").wire()  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="does not remove itself"):
        n0.mark_removal("n0", REMOVED, "n0", 1.0)


def test_a_removed_member_no_longer_blocks_token_moves() -> None:
    members = (
        MemberInfo("a", "h:1"),
        MemberInfo("b", "h:2"),
        MemberInfo("c", "h:3"),
        MemberInfo("d", "h:4", status="down"),
    )
    why = RingView(5, members).busy()
    assert why is not None and "statestore removenode" in why
    assert RingView(6, members[:3]).busy() is None  # the view of a node that removed d


@pytest.mark.parametrize(
    ("sightings", "survivors", "says"),
    [
        ({}, 3, "none of the 3 member(s) asked answered"),
        ({"a": None}, 3, "no member of the ring knows a node d"),
        ({"a": Sighting("down", "normal", 1), "b": Sighting("up", "normal", 1)}, 3, "is up as b"),
        ({"a": Sighting("suspect", "normal", 1)}, 3, "decommissioned instead"),
        ({"a": Sighting("down", "left", 1)}, 3, "left the ring already"),
        ({"a": Sighting("down", "normal", 1, "", "removed", "a")}, 3, "removed from the ring"),
        ({"a": Sighting("down", "normal", 1)}, 2, "fewer than the R=3"),
        ({"a": Sighting("down", "normal", 1), "b": None}, 3, None),
        ({"a": Sighting("down", "joining", 1)}, 3, None),
        ({"a": Sighting("down", "normal", 1, "", "removing", "b")}, 3, None),
    ],
)
def test_remove_plan(
    sightings: dict[str, Sighting | None], survivors: int, says: str | None
) -> None:
    why = remove_plan("d", sightings, 3, survivors, 3)
    if says is None:
        assert why is None
    else:
        assert why is not None and says in why, why


def test_a_removed_id_cannot_be_taken_by_a_replacement() -> None:
    why, _ = replace_plan("d", "", {"a": Sighting("down", "left", 1, "", "removed", "a")}, 1)
    assert why is not None and "--join instead" in why


# -- real processes ---------------------------------------------------------------------------


def _cli(args: list[str], timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    return cli(args, timeout)


def _member_ids(view: dict[str, Any]) -> dict[str, str]:
    return {m["id"]: m["status"] for m in view["members"]}


# under a writer that commits without pause, on 2 cores that a Spark test may share: its
# own work (copies counted, versions checked) took 210 s of the 300 s default in one run
@pytest.mark.timeout(600)
def test_removenode_removes_a_dead_node_for_good_under_a_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with local_ring(tmp_path, 4, ARGS) as ring:
        stores = [StoreId("remove", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states = load(client, stores, 6, seed=9)
            keys, manifests = sample(client, stores, 6)
            survivors = ring.procs[:3]
            others = [p.address for p in survivors]
            dead = ring.procs[3]
            dead_id, dead_address, dead_dir = dead.id, dead.address, dead.data_dir
            seeds = others[0]
            # refused: a live node (decommission it instead), an unknown id
            for target, says in (
                (dead_id, "decommissioned instead"),
                ("no-such-node", "no member no-such-node"),
            ):
                refused = _cli(["removenode", "--seeds", seeds, "--node", target])
                assert refused.returncode == 1 and says in refused.stderr, refused.stderr
                assert "Traceback" not in refused.stderr
            writer = Writer(others, states, 7)
            writer.start()
            time.sleep(1.0)
            ring.kill(3)  # kill -9
            deadline = time.monotonic() + 30
            while not all(_member_ids(ring.ring(a))[dead_id] == "down" for a in others):
                assert time.monotonic() < deadline, "the dead node was never declared down"
                time.sleep(0.2)
            # what a down member blocks today: token moves
            assert main(["rebalance", "--seeds", seeds, "--dry-run"]) == 1
            assert f"member {dead_id} is down" in capsys.readouterr().err
            cmd = ["removenode", "--seeds", seeds, "--node", dead_id]
            removal = subprocess.Popen(
                [sys.executable, "-m", "statestore", *cmd],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            # while it runs, a second removenode of the same node follows it, as after a
            # --timeout (when the first is seen running: a fast one may finish between two
            # looks)
            deadline = time.monotonic() + 60
            streaming = False
            while removal.poll() is None:
                answer = http_json(seeds, "/v1/handover/remove")
                assert isinstance(answer, dict)
                run = (answer["removals"].get(dead_id) or {}).get("run") or {}
                if run.get("phase") == "streaming":
                    streaming = True
                    break
                assert time.monotonic() < deadline, answer
                time.sleep(0.02)
            if streaming:
                again = main(["removenode", "--seeds", seeds, "--node", dead_id])
                err = capsys.readouterr().err
                # (or, when it finished between the look and the ask, removed already)
                followed = again == 0 and f"node {dead_id} removed from the ring for good" in err
                assert followed or (again == 1 and "removed from the ring already" in err), err
            _, err = removal.communicate(timeout=180)
            assert removal.returncode == 0, err
            assert f"node {dead_id} removed from the ring for good" in err, err
            time.sleep(1.0)  # commits on the ring without it
            writer.stop()
            assert not writer.failures, writer.failures[:5]
            # gone from every survivor's ring: not listed (so not down), named as removed
            for address in others:
                view = ring.ring(address)
                assert dead_id not in _member_ids(view), view["members"]
                assert view["removals"][dead_id]["mark"] == "removed"
            for p in survivors:
                assert [e["id"] for e in load_removed(p.data_dir)] == [dead_id]
            assert main(["ring", "--seeds", seeds]) == 0
            out = capsys.readouterr().out
            assert f"removed: {dead_id}" in out and "down" not in out, out
            # R live copies of every item: the loaded versions and everything the writer wrote
            wait_exact(Copies(ring, keys, manifests), others, R)
            top = min(writer.next.values()) - 1
            deadline = time.monotonic() + 30
            while short := short_copies(ring, client, stores, top):
                if time.monotonic() >= deadline:
                    raise AssertionError(
                        f"{list(short.items())[:5]}\n{held_states(others, stores)}"
                    )
                time.sleep(0.5)
            check_restores(client, writer, states, 6)
            # the ring moves again
            assert main(["rebalance", "--seeds", seeds, "--dry-run"]) == 0
            # and the removal is not run twice
            assert main(["removenode", "--seeds", seeds, "--node", dead_id]) == 1
            assert "removed from the ring already" in capsys.readouterr().err
            # its old data dir started again: the seeds tell it, and it refuses to start
            node_cmd = ["node", "--data-dir", dead_dir, "--listen", "127.0.0.1:0"]
            again = _cli([*node_cmd, "--seeds", seeds, *ARGS], timeout=60)
            assert again.returncode == 2, again.stderr
            assert f"node {dead_id} was removed from the ring" in again.stderr, again.stderr
            assert "--join" in again.stderr and "Traceback" not in again.stderr
            # ... and started where no seed answers, at its old address: gossip from the
            # survivors tells it, and it serves nothing
            dead.start(["127.0.0.1:9"])
            assert dead.address == dead_address
            deadline = time.monotonic() + 30
            while True:
                health = http_json(dead_address, "/v1/health")
                assert isinstance(health, dict)
                if "removed from the ring" in " ".join(health["reasons"]):
                    break
                assert time.monotonic() < deadline, health
                time.sleep(0.2)
            assert health["status"] == "degraded"
            with pytest.raises(urllib.error.HTTPError) as refused_read:
                http_json(dead_address, "/v1/ring")
            assert refused_read.value.code == 503
            for address in others:
                assert dead_id not in _member_ids(ring.ring(address))
            restored = client.restore(stores[0], 6)
            assert dict(restored) == states[stores[0]]
            dead.stop()
            # having learnt it, it refuses at once next time, even with no seed answering
            assert [e["id"] for e in load_removed(dead_dir)] == [dead_id]
            alone = _cli(
                ["node", "--data-dir", dead_dir, "--listen", "127.0.0.1:0", "--no-dht"], timeout=60
            )
            assert alone.returncode == 2 and "was removed from the ring" in alone.stderr


def _mark(node: Any, target: str) -> str | None:
    m = node.membership.get(target)
    return None if m is None else m.removal


async def test_a_remover_started_again_goes_on_with_its_removal(tmp_path: Path) -> None:
    """A remover that stops after it wrote the mark ``removing`` (step 2) runs the removal
    to the end once started again (it left the dead node ``removing`` for good, blocking
    token moves, until removenode was run again), with a removal's checks: started before
    its peers, it waits for them."""
    ring = Restartable(tmp_path, "abcd")
    try:
        await ring.start_all()
        store = StoreId("resume", 0, 1)
        async with AsyncRingClient([ring.address("a")], timeout=30) as c:
            await c.commit(store, 1, {b"k": b"v"}, [], {}, epoch=1)
        dead = ring["d"].id
        await ring.stop("d")
        await eventually(lambda: all(sees(n, 3) for n in ring.live()), "d down")
        a = ring["a"]
        assert a.membership is not None
        # what the remover's run does first (node/removal._remove), then the remover stops
        a.membership.mark_removal(dead, REMOVING, a.id, a.clock())
        _persist(a)
        await eventually(
            lambda: all(_mark(n, dead) == REMOVING for n in ring.live()), "the mark spread"
        )
        await ring.stop("a")
        assert [_mark(ring[k], dead) for k in "bc"] == [REMOVING, REMOVING]
        # the whole ring stops; the remover comes up first, its peers not yet: it does not
        # write the node off alone (nobody would have swept its share)
        await ring.stop("b")
        await ring.stop("c")
        a = await ring.start("a")
        await asyncio.sleep(a.config.down_after + 2 * a.config.gossip_interval + 2.0)
        assert _mark(a, dead) == REMOVING
        await ring.start("b", ring.address("a"))
        await ring.start("c", ring.address("a"))
        await eventually(
            lambda: all(_mark(n, dead) == REMOVED for n in ring.live()), "removed", limit=60
        )
        for n in ring.live():
            assert dead not in {m.id for m in n.view().members}
        async with AsyncRingClient([ring.address("b")], timeout=30) as c:
            assert dict(await c.restore(store, 1)) == {b"k": b"v"}
    finally:
        await ring.close()
