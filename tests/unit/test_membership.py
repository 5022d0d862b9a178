"""The failure detector and ring epoch, driven by an injected clock."""

from __future__ import annotations

import pytest

from statestore.core.errors import MalformedData
from statestore.core.membership import Membership, Status


def cluster(n: int) -> list[Membership]:
    return [
        Membership(f"n{i}", f"127.0.0.1:{7400 + i}", "", 1, 0.0, suspect_after=2, down_after=5)
        for i in range(n)
    ]


def gossip_all(nodes: list[Membership], now: float, skip: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    for i, a in enumerate(nodes):
        if i in skip:
            continue
        a.tick(now)
        for j, b in enumerate(nodes):
            if j != i and j not in skip:
                b.merge(a.digest(), now)
                a.merge(b.digest(), now)


def test_members_learn_each_other_and_agree_on_epoch() -> None:
    nodes = cluster(4)
    for t in range(3):
        gossip_all(nodes, float(t))
    for m in nodes:
        assert [x.status for x in m.members()] == [Status.UP] * 4
    assert len({m.epoch for m in nodes}) == 1


def test_silent_member_goes_suspect_then_down_and_epoch_moves() -> None:
    nodes = cluster(3)
    gossip_all(nodes, 0.0)
    epoch = nodes[0].epoch
    statuses = []
    for t in (1.0, 2.5, 4.0, 6.0):
        gossip_all(nodes, t, skip={2})
        statuses.append(nodes[0].get("n2").status)  # type: ignore[union-attr]
    assert statuses == [Status.UP, Status.SUSPECT, Status.SUSPECT, Status.DOWN]
    assert nodes[0].epoch > epoch
    assert [m.id for m in nodes[0].live()] == ["n0", "n1"]
    assert nodes[0].epoch == nodes[1].epoch


def test_restarted_member_with_new_incarnation_comes_back() -> None:
    nodes = cluster(2)
    gossip_all(nodes, 0.0)
    for t in (3.0, 6.0):
        gossip_all(nodes, t, skip={1})
    assert nodes[0].get("n1").status is Status.DOWN  # type: ignore[union-attr]
    reborn = Membership("n1", "127.0.0.1:9999", "", 2, 7.0)
    nodes[0].merge(reborn.digest(), 7.0)
    nodes[0].tick(7.5)
    back = nodes[0].get("n1")
    assert back is not None and back.status is Status.UP and back.address == "127.0.0.1:9999"


def test_stale_gossip_does_not_resurrect() -> None:
    a, b = cluster(2)
    b.tick(0.0)
    old = b.digest()
    a.merge(old, 0.0)
    for t in (3.0, 6.0):
        a.tick(t)
        a.merge(old, t)  # the same old heartbeat again
    assert a.get("n1").status is Status.DOWN  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "digest", [{"members": "x"}, {"epoch": "1", "members": []}, {"members": [{"id": 1}]}]
)
def test_malformed_gossip(digest: dict[str, object]) -> None:
    with pytest.raises(MalformedData):
        cluster(1)[0].merge(digest, 0.0)
