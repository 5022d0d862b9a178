"""``removenode`` while another member is down (node/removal.start_removal): real nodes (the
daemon's ``Node``) on the in-memory network and simulated time (statestore/testing). Five
nodes, R=3, two of them crashed: removing one is refused, naming the other (a commit the two
alone acknowledged is on no live node: only the other keeps it), unless forced; the build
before started the removal."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from statestore.core.errors import InvalidRequest
from statestore.net.memory import MemoryNetwork
from statestore.node.removal import _save_removed, load_removed, start_removal
from statestore.testing.clock import run_simulated
from statestore.testing.cluster import SIM_CONFIG, Cluster


def test_a_dead_node_is_removed_while_another_is_down_only_when_forced(tmp_path: Path) -> None:
    async def main() -> tuple[str, str, str, str]:
        cluster = Cluster(MemoryNetwork(random.Random(3)), 5, random.Random(4), str(tmp_path))
        await cluster.start_all()
        await asyncio.sleep(SIM_CONFIG.down_after)
        try:
            nodes = [cluster.node(a) for a in cluster.addresses]
            assert all(nodes)
            target, other = nodes[3].id, nodes[4].id  # type: ignore[union-attr]
            await cluster.crash(cluster.addresses[3])
            await cluster.crash(cluster.addresses[4])
            live = [n for n in nodes[:3] if n is not None]
            await asyncio.sleep(2 * SIM_CONFIG.down_after)
            for n in live:  # every live member sees both down
                assert {m.id for m in n.view().members if m.status == "down"} == {target, other}
            remover = live[0]
            with pytest.raises(InvalidRequest) as refused:
                await start_removal(remover, target)
            move = await start_removal(remover, target, force=True)
            return str(refused.value), other, target, move.handover.kind
        finally:
            await cluster.stop_all()

    why, other, target, kind = run_simulated(main)
    assert f"member(s) {other} are down too" in why and f"removing {target}" in why, why
    assert "--force" in why, why
    assert kind == "remove"


def test_remove_plan_names_the_other_down_members_unless_forced() -> None:
    from statestore.core.handover import Sighting, remove_plan

    seen = {"a": Sighting("down", "normal", 1)}
    why = remove_plan("d", seen, 3, 3, 3, others_down=["f", "e"])
    assert why is not None and "member(s) e, f are down too" in why, why
    assert remove_plan("d", seen, 3, 3, 3, others_down=["e"], force=True) is None
    assert remove_plan("d", seen, 3, 3, 3) is None
    # fewer survivors than R is refused forced or not
    forced = remove_plan("d", seen, 3, 2, 3, others_down=["e"], force=True)
    assert forced is not None and "fewer than the R=3" in forced


def test_a_removal_whose_remover_died_is_taken_over_without_force(tmp_path: Path) -> None:
    """The remover dies while its removal runs: the next member asked takes it over. The
    dead remover is down then, but it is no reason to refuse: the target was written off
    (marked removing) when the removal began. A draft of the check refused every takeover
    without --force (a review of it)."""

    async def main() -> tuple[str, str]:
        cluster = Cluster(MemoryNetwork(random.Random(3)), 5, random.Random(4), str(tmp_path))
        await cluster.start_all()
        await asyncio.sleep(SIM_CONFIG.down_after)
        try:
            nodes = [cluster.node(a) for a in cluster.addresses]
            remover, successor, dead = nodes[0], nodes[1], nodes[3]
            assert remover is not None and successor is not None and dead is not None
            target = dead.id
            await cluster.crash(cluster.addresses[3])
            await asyncio.sleep(2 * SIM_CONFIG.down_after)
            await start_removal(remover, target)
            assert successor.membership is not None
            for _ in range(100):  # the remover dies once the mark reached the successor
                mark = successor.membership.get(target)
                if mark is not None and mark.removal == "removing":
                    break
                await asyncio.sleep(0.05)
            assert mark is not None and mark.removal == "removing", mark
            await cluster.crash(cluster.addresses[0])
            await asyncio.sleep(2 * SIM_CONFIG.down_after)
            move = await start_removal(successor, target)
            return move.handover.kind, remover.id
        finally:
            await cluster.stop_all()

    kind, _ = run_simulated(main)
    assert kind == "remove"


def test_the_marks_file_written_from_two_threads_at_once_is_whole(tmp_path: Path) -> None:
    """A removal's write of the marks file and the removal loop's met (both wrote one
    temporary file: one of them failed with FileNotFoundError, and a loop that failed so
    was started again)."""

    def write(i: int) -> None:
        _save_removed(str(tmp_path), [{"id": f"n{i}", "removal": "removing"}])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(400)))
    (mark,) = load_removed(str(tmp_path))
    assert mark["id"].startswith("n")
    assert [p.name for p in tmp_path.iterdir()] == ["removed-members.json"]
