"""Partitions on real node processes (statestore/testing/partition.py; docs/reliability.md).

Skipped, with the reason, where network namespaces or iptables are not available (not root).
``bench/partitions.py --schedules 200`` runs the long version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import AsyncRingClient, StoreId
from statestore.core.errors import Unavailable
from statestore.testing.cli import derive
from statestore.testing.history import CommitOp, History, ReadOp, check
from statestore.testing.netns import unavailable_reason
from statestore.testing.partition import NODE_ARGS, PartitionRing, run_schedule

pytestmark = pytest.mark.slow

_REASON = unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[PartitionRing]:
    r = PartitionRing(str(tmp_path), 3)
    r.start()
    try:
        yield r
    finally:
        r.stop()  # kills the nodes, deletes the namespaces (and their rules) and the bridge


@needs_netns
def test_a_cut_is_real_and_heals(ring: PartitionRing) -> None:
    """The harness itself: a node cut off from the clients and the other nodes cannot be
    reached, the others declare it down; after the heal it is back."""
    sid = StoreId("cut", 0, 0)

    async def go() -> None:
        async with AsyncRingClient(ring.addresses, timeout=1.0) as c:
            await c.commit(sid, 1, {b"a": b"1"}, epoch=1)
            ips = ring.net.ips
            ring.net.apply([(ips[0], ips[1]), (ips[0], ips[2]), (ring.net.client_ip, ips[0])])
            assert "-A INPUT -s" in ring.net.rules(0)
            # the client cannot reach node 0 any more: a request to it alone times out
            with pytest.raises(Unavailable):
                await c._transport.request("GET", ring.addresses[0], "/v1/health", timeout=1.0)
            # the other two go on: W=2 of them acknowledge, a read quorum answers
            await c.commit(sid, 2, {b"b": b"2"}, epoch=1)
            assert dict(await c.restore(sid)) == {b"a": b"1", b"b": b"2"}

    asyncio.run(go())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the two see node 0 down
        views = [ring.local.ring(a) for a in ring.addresses[1:]]
        if all(
            any(m["address"] == ring.addresses[0] and m["status"] == "down" for m in v["members"])
            for v in views
        ):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("node 0 was never declared down behind the cut")
    ring.net.heal()
    assert "-A INPUT" not in ring.net.rules(0)
    ring.local.wait_ring(3)


@needs_netns
def test_random_partition_schedules_keep_every_promise(ring: PartitionRing) -> None:
    """A few seeded nemesis schedules (splits, isolations, bridges, pauses, kill -9) with
    concurrent writers of distinct epochs; the history checker finds nothing."""
    found = []
    for i in range(3):
        outcome = run_schedule(ring, derive(11, i), label=f"ci{i}")
        assert outcome.commits > 0
        found += [f"seed {outcome.seed}: {v}" for v in outcome.violations]
    # writers allowed to commit tentatively (1 s bound): every tentative commit is decided
    outcome = run_schedule(ring, derive(11, 3), label="ci3", tentative=0.6)
    found += [f"seed {outcome.seed} (tentative): {v}" for v in outcome.violations]
    assert not found, "\n".join(found)


def test_the_checker_catches_a_planted_violation() -> None:
    """The history format the harness records: a fenced writer acknowledged after a higher
    epoch's acknowledged commit, and an acknowledged version restored with other bytes, are
    both reported (the checker is testing/history.py, shared with the simulator)."""
    h = History()
    good = {b"k": b"v1"}
    h.add_commit(CommitOp("w2", "q/0/0/s", 1, 2, "d1", good, 1, 2, "ack"))
    h.add_commit(CommitOp("w1", "q/0/0/s", 2, 1, "d2", {b"k": b"z"}, 3, 4, "ack", "", 2))
    h.add_read(ReadOp("restore", "q/0/0/s", 1, 5, 6, (2, 1), {b"k": b"other"}, final=True))
    kinds = {v.kind for v in check(h)}
    assert {"fenced-ack", "wrong-bytes"} <= kinds


@needs_netns
def test_the_checker_catches_a_real_fenced_ack_of_a_one_commit(tmp_path: Path) -> None:
    """A violation produced by the real ring, not fabricated: ``consistency="one"`` gives up
    fencing across a partition (docs/client.md), and the checker says so. Writer 2 (epoch 2)
    commits v2 at quorum while node 0 is cut off; then the clients see only node 0, and the
    fenced writer 1 (epoch 1) commits v2 at ``one`` there: node 0 never heard of epoch 2, so
    it acknowledges. The same commit at ``quorum`` is refused (QuorumNotReached)."""
    slow = [a for a in NODE_ARGS]
    slow[slow.index("--down-after") + 1] = "60"  # nobody is declared down: views stay put
    ring = PartitionRing(str(tmp_path), 3, args=slow)
    ring.start()
    try:
        ips, client = ring.net.ips, ring.net.client_ip
        sid = StoreId("fence", 0, 0)
        h = History()

        async def commit(c: AsyncRingClient, name: str, v: int, e: int, **kw: str) -> None:
            puts = {b"k": f"{name}-{v}".encode()}
            start = h.now()
            try:
                await c.commit(sid, v, puts, epoch=e, base_epoch=1 if v > 1 else None, **kw)
                outcome, error = "ack", ""
            except Exception as exc:  # recorded, as the harness does
                outcome, error = "failed", type(exc).__name__
            h.add_commit(
                CommitOp(name, sid.path, v, e, name, puts, start, h.now(), outcome, error, None)
            )

        async def go() -> None:
            async with (
                AsyncRingClient(ring.addresses, timeout=1.0) as w1,
                AsyncRingClient(ring.addresses, timeout=1.0) as w2,
            ):
                await commit(w1, "w1", 1, 1)
                ring.net.apply([(ips[0], ips[1]), (ips[0], ips[2]), (client, ips[0])])
                await commit(w2, "w2", 2, 2)
                ring.net.apply(
                    [(ips[0], ips[1]), (ips[0], ips[2]), (client, ips[1]), (client, ips[2])]
                )
                await commit(w1, "w1q", 2, 1)  # quorum: refused for want of replicas
                await commit(w1, "w1", 2, 1, consistency="one")

        asyncio.run(go())
        outcomes = [(c.writer, c.outcome) for c in h.commits]
        assert outcomes == [("w1", "ack"), ("w2", "ack"), ("w1q", "failed"), ("w1", "ack")], h.lines
        found = check(h)
        assert [v.kind for v in found] == ["fenced-ack"], found
    finally:
        ring.stop()
