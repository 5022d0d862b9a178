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


def test_each_member_gossips_the_chunk_format_it_reads() -> None:
    """A member of this build says it reads blocked chunks with whole snapshots named ``w``
    (chunk_format 3); one of 0.2 says nothing, read as 1. Every node learns what every other
    reads, through third parties too: writers use blocked chunks only when all of them do
    (RingView.blocks), ``w`` names likewise (RingView.whole_names)."""
    new, relay = cluster(2)
    old = Membership("n9", "127.0.0.1:7409", "", 1, 0.0, chunk_format=1)
    assert "chunk_format" not in old.digest()["members"][0]  # what 0.2 gossips, exactly
    assert new.digest()["members"][0]["chunk_format"] == 3
    for t in range(3):
        for a, b in ((new, relay), (relay, old)):  # new hears of old only through relay
            a.merge(b.digest(), float(t))
            b.merge(a.digest(), float(t))
    formats = {m.id: m.chunk_format for m in new.members()}
    assert formats == {"n0": 3, "n1": 3, "n9": 1}
    refused = Membership("n5", "127.0.0.1:7405", "", 1, 0.0)
    for bad in (0, 256, "2", 2.0, None):
        entry = {**new.digest()["members"][0], "id": "nx", "chunk_format": bad}
        with pytest.raises(MalformedData, match=r"chunk format|wrong type"):
            refused.check({"epoch": 0, "members": [entry]})
        with pytest.raises(MalformedData):
            refused.merge({"epoch": 0, "members": [entry]}, 0.0)
        assert [m.id for m in refused.members()] == ["n5"]


def test_a_view_allows_blocked_chunks_only_when_it_says_so() -> None:
    from statestore.core.view import MemberInfo, RingView

    view = RingView(1, (MemberInfo("n0", "127.0.0.1:7400"),), 1, 1)
    assert view.to_json()["blocks"] is False and view.block_size() == 0
    for said, blocks in ((True, True), (False, False), ("true", False), (1, False), (None, False)):
        got = RingView.from_json({**view.to_json(), "blocks": said})
        assert got.blocks is blocks and got.block_size(4096) == (4096 if blocks else 0)
    del_blocks = {k: v for k, v in view.to_json().items() if k != "blocks"}  # a 0.2 node's view
    assert RingView.from_json(del_blocks).block_size() == 0


def test_a_view_names_whole_snapshots_w_only_when_it_says_so() -> None:
    """Writers name a whole snapshot's chunks ``w`` only where every member reads chunk
    format 3 (``whole_names`` in the view); a view without the field (a build before) or
    with anything but true says ``s``."""
    from statestore.core.view import MemberInfo, RingView

    view = RingView(1, (MemberInfo("n0", "127.0.0.1:7400"),), 1, 1)
    assert view.to_json()["whole_names"] is False and view.snapshot_kind() == "s"
    for said, kind in ((True, "w"), (False, "s"), ("true", "s"), (1, "s"), (None, "s")):
        assert RingView.from_json({**view.to_json(), "whole_names": said}).snapshot_kind() == kind
    before = {k: v for k, v in view.to_json().items() if k != "whole_names"}
    assert RingView.from_json(before).snapshot_kind() == "s"
