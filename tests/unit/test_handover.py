"""Member states in membership and ring views (pure): read, future and write replicas.

The hand-over machine, the pull and push plans and the write rule are tested from data files
(tests/testdata/handover/, read by test_decisions.py); this file checks the states where they
live: gossip entries and ring views, with properties against a brute-force oracle (build the
ring of exactly the members that should own, and ask it).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statestore.core.errors import MalformedData
from statestore.core.handover import NodeState, Sighting, replace_plan
from statestore.core.membership import Membership
from statestore.core.placement import Member, Ring
from statestore.core.view import MemberInfo, RingView


def _member(n: int) -> Membership:
    return Membership(f"n{n}", f"10.0.0.{n}:7400", "", 1, 0.0)


def test_a_state_change_spreads_by_gossip_and_moves_the_epoch() -> None:
    a, b = _member(1), _member(2)
    b.merge(a.digest(), 0.0)
    a.merge(b.digest(), 0.0)
    epoch = b.epoch
    assert b.get("n1").state is NodeState.NORMAL  # type: ignore[union-attr]
    assert a.set_state(NodeState.LEAVING, 0.1)
    assert a.state is NodeState.LEAVING
    assert b.merge(a.digest(), 0.2)  # the live set counts states
    assert b.get("n1").state is NodeState.LEAVING  # type: ignore[union-attr]
    assert b.epoch > epoch
    assert [m.id for m in b.placement_members()] == ["n1", "n2"]  # leaving still owns
    a.set_state(NodeState.LEFT, 0.3)
    b.merge(a.digest(), 0.4)
    assert [m.id for m in b.placement_members()] == ["n2"]


def test_an_entry_without_a_state_is_normal_and_an_unknown_state_is_refused() -> None:
    a = _member(1)
    entry = {"id": "n2", "address": "10.0.0.2:7400", "incarnation": 1, "heartbeat": 3}
    a.merge({"epoch": 1, "members": [entry]}, 0.0)
    assert a.get("n2").state is NodeState.NORMAL  # type: ignore[union-attr]
    with pytest.raises(MalformedData, match="unknown ring state"):
        a.merge({"epoch": 1, "members": [{**entry, "heartbeat": 4, "state": "gone"}]}, 0.0)


def _view(states: dict[str, str], down: frozenset[str] = frozenset(), vnodes: int = 16) -> RingView:
    members = tuple(
        MemberInfo(n, f"{n}:1", "down" if n in down else "up", "", s) for n, s in states.items()
    )
    return RingView(3, members, 3, 2, vnodes)


def test_a_joining_node_takes_writes_not_reads() -> None:
    view = _view({"a": "normal", "b": "normal", "c": "normal", "d": "joining"})
    assert view.moving
    assert "d:1" in view.live_addresses()
    keys = [f"k{i}" for i in range(200)]
    pending = [k for k in keys if "d:1" in view.future_replicas_of(k)]
    assert pending  # d will own part of the ring
    for k in keys:
        assert "d:1" not in view.replicas_of(k)
        assert view.write_replicas_of(k)[:3] == view.replicas_of(k)
        assert ("d:1" in view.write_replicas_of(k)) == (k in pending)


@pytest.mark.parametrize("last", [True, False])
def test_reads_ask_a_leaving_replica_after_the_others(
    last: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leaving member still owns what it held, but it streams it all to its next owners:
    reads ask the other replicas first, then it, then the rest of the ring as before (with
    ``LEAVING_LAST`` off, bench/elastic.py's baseline, the plain ring order)."""
    monkeypatch.setattr("statestore.core.view.LEAVING_LAST", last)
    view = _view({"a": "normal", "b": "normal", "c": "normal", "d": "leaving"})
    plain = _view({"a": "normal", "b": "normal", "c": "normal", "d": "normal"})
    assert view.leaving() == (frozenset({"d:1"}) if last else frozenset())
    held_by_d = 0
    for k in (f"k{i}" for i in range(300)):
        order, owners = view.read_order(k), view.replicas_of(k)
        assert owners == plain.replicas_of(k)  # it owns what it owned until it has left
        assert sorted(order[:3]) == sorted(owners) and sorted(order) == sorted(plain.read_order(k))
        if "d:1" in owners:
            held_by_d += 1
            assert (order[2] == "d:1") if last else (order == plain.read_order(k))
        else:
            assert order == plain.read_order(k)
    assert held_by_d > 150  # d holds three quarters of the keys


def test_only_left_since_names_a_finished_decommission_and_nothing_else() -> None:
    base = _view({"a": "normal", "b": "normal", "c": "normal", "d": "normal"})
    before = base.placement()
    assert _view({"a": "normal", "b": "normal", "c": "normal", "d": "left"}).only_left_since(before)
    for states, down in [
        ({"a": "normal", "b": "normal", "c": "normal", "d": "normal"}, frozenset()),  # same
        ({"a": "normal", "b": "normal", "c": "normal", "d": "leaving"}, frozenset()),  # same
        ({"a": "normal", "b": "normal", "c": "normal", "d": "leaving"}, frozenset({"d"})),
        ({"a": "normal", "b": "normal", "c": "normal", "d": "normal"}, frozenset({"d"})),
        ({"a": "normal", "b": "normal", "c": "normal", "d": "normal", "e": "normal"}, frozenset()),
        ({"a": "normal", "b": "normal", "c": "left", "d": "normal"}, frozenset({"d"})),
    ]:
        assert not _view(states, down).only_left_since(before), (states, down)
    assert not base.only_left_since(None)  # no pass yet
    moved = RingView(
        3,
        tuple(
            replace(m, address="x:9") if m.id == "a" else m
            for m in _view({"a": "normal", "b": "normal", "c": "normal", "d": "left"}).members
        ),
        3,
        2,
        16,
    )
    assert not moved.only_left_since(before)  # a member that left, and one that moved


def test_left_members_own_nothing_and_views_keep_states_on_the_wire() -> None:
    view = _view({"a": "normal", "b": "normal", "c": "normal", "d": "left"})
    assert not view.moving and "d:1" not in view.live_addresses()
    assert all("d:1" not in view.previous_replicas(f"k{i}") for i in range(50))
    again = RingView.from_json(view.to_json())
    assert [m.state for m in again.members] == ["normal", "normal", "normal", "left"]
    old = view.to_json()
    for m in old["members"]:
        del m["state"]  # a view from a node that predates states
    assert {m.state for m in RingView.from_json(old).members} == {"normal"}
    bad = view.to_json()
    bad["members"][0]["state"] = "gone"
    with pytest.raises(MalformedData, match="state"):
        RingView.from_json(bad)


NAMES = ["n1", "n2", "n3", "n4", "n5", "n6"]


@settings(max_examples=150, deadline=None)
@given(
    states=st.dictionaries(
        st.sampled_from(NAMES),
        st.sampled_from(["normal", "normal", "joining", "leaving", "left"]),
        min_size=1,
    ),
    down=st.sets(st.sampled_from(NAMES), max_size=2),
    keys=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=10),
)
def test_read_future_and_write_replicas_against_an_oracle(
    states: dict[str, str], down: set[str], keys: list[str]
) -> None:
    """Oracle: the ring of the live normal and leaving members answers reads; the ring of the
    live normal and joining members answers the future; a write goes to the union, current
    owners first."""
    view = _view(states, frozenset(down))
    live = {n: s for n, s in states.items() if n not in down}
    now = Ring((Member(n) for n, s in live.items() if s in ("normal", "leaving")), 16)
    later = Ring((Member(n) for n, s in live.items() if s in ("normal", "joining")), 16)
    for k in keys:
        current = [f"{n}:1" for n in now.replicas(k, 3)]
        future = [f"{n}:1" for n in later.replicas(k, 3)]
        assert view.replicas_of(k) == current
        assert view.future_replicas_of(k) == future
        assert view.write_replicas_of(k) == current + [a for a in future if a not in current]
    moving = any(s in ("joining", "leaving") for s in live.values())
    assert view.moving == (moving and set(now.members) != set(later.members))


def _seen(status: str = "down", state: str = "normal", inc: int = 3, zone: str = "") -> Sighting:
    return Sighting(status, state, inc, zone)


@pytest.mark.parametrize(
    ("sightings", "zone", "why", "incarnation"),
    [
        ({"a": _seen(inc=3), "b": _seen(inc=5)}, "", None, 6),
        ({"a": _seen(state="leaving"), "b": None}, "", None, 4),  # b never met it
        ({"a": _seen(zone="z1")}, "z1", None, 4),
        ({}, "", "none of the 2 member(s) asked answered", 0),
        ({"a": None, "b": None}, "", "no member of the ring knows a node n9", 0),
        ({"a": _seen(), "b": _seen(status="suspect")}, "", "n9 is suspect as b sees it", 0),
        ({"a": _seen(status="up")}, "", "n9 is up as a sees it", 0),
        ({"a": _seen(state="left")}, "", "was left when it died: it owned nothing", 0),
        ({"a": _seen(state="joining")}, "", "was joining when it died", 0),
        ({"a": _seen(zone="z1")}, "z2", "was in zone 'z1', this node is in 'z2'", 0),
    ],
)
def test_replace_plan_takes_only_a_dead_owner_at_a_higher_incarnation(
    sightings: dict[str, Sighting | None], zone: str, why: str | None, incarnation: int
) -> None:
    got, inc = replace_plan("n9", zone, sightings, 2)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got
    assert inc == incarnation


def test_a_replacement_at_a_higher_incarnation_takes_the_dead_entry_everywhere() -> None:
    a = _member(1)
    dead = {"id": "n9", "address": "10.0.0.9:7400", "incarnation": 4, "heartbeat": 900}
    a.merge({"epoch": 1, "members": [dead]}, 0.0)
    a.tick(10.0)  # declared down
    assert a.get("n9").status.value == "down"  # type: ignore[union-attr]
    _, inc = replace_plan("n9", "", {"a": _seen(inc=4)}, 1)
    new = {**dead, "address": "10.0.0.10:7400", "incarnation": inc, "heartbeat": 0}
    a.merge({"epoch": 1, "members": [{**new, "state": "joining"}]}, 10.1)
    seen = a.get("n9")
    assert seen is not None and seen.address == "10.0.0.10:7400"
    assert seen.status.value == "up" and seen.state is NodeState.JOINING
    # the dead node's old entry, gossiped again by a slow peer, no longer wins
    a.merge({"epoch": 1, "members": [{**dead, "heartbeat": 950}]}, 10.2)
    assert a.get("n9").address == "10.0.0.10:7400"  # type: ignore[union-attr]


def test_a_replaced_node_does_not_refute_its_replacement() -> None:
    old = Membership("n9", "10.0.0.9:7400", "", 4, 0.0)
    peer = _member(1)
    peer.merge(old.digest(), 0.0)
    # the replacement, at another address and a higher incarnation, takes n9 on the peer
    new = Membership("n9", "10.0.0.10:7400", "", 5, 0.0, state=NodeState.JOINING)
    peer.merge(new.digest(), 0.1)
    assert peer.get("n9").address == "10.0.0.10:7400"  # type: ignore[union-attr]
    # the old process hears of it: it does not take a newer incarnation to win the id back
    old.merge(peer.digest(), 0.2)
    assert old.superseded == ("10.0.0.10:7400", 5)
    assert old.get("n9").incarnation == 4  # type: ignore[union-attr]
    peer.merge(old.digest(), 0.3)
    assert peer.get("n9").address == "10.0.0.10:7400"  # type: ignore[union-attr]
    # a newer life of ours at our own address is refuted as before (a restart's leftovers)
    same = Membership("n8", "10.0.0.8:7400", "", 2, 0.0)
    same.merge({"epoch": 1, "members": [{**same.digest()["members"][0], "incarnation": 3}]}, 0.1)
    assert same.superseded is None and same.get("n8").incarnation == 4  # type: ignore[union-attr]


def _base() -> list[MemberInfo]:
    return [MemberInfo(n, f"{n}:1") for n in ("a", "b", "c")]


def _with(i: int, **change: object) -> RingView:
    members = _base()
    if i < len(members):
        members[i] = replace(members[i], **change)  # type: ignore[arg-type]
    else:
        members.append(MemberInfo("d", "d:1", **change))  # type: ignore[arg-type]
    return RingView(7, tuple(members), 3, 2, 16)


@pytest.mark.parametrize(
    ("view", "same"),
    [
        (_with(3, state="joining"), True),  # a join starts: its copies move by hand-over
        (_with(2, state="leaving"), True),  # so does a leave
        (_with(2, status="suspect"), True),
        (_with(2, next_vnodes=32), True),  # a rebalance starts
        (_with(3, state="normal"), False),  # a join finished
        (_with(2, state="left"), False),  # a leave finished
        (_with(2, status="down"), False),
        (_with(2, vnodes=32), False),  # a rebalance finished
        (_with(2, address="c:2"), False),  # restarted elsewhere: pushes go to the new address
        (_with(2, zone="z1"), False),
    ],
)
def test_repair_passes_when_ownership_changes_not_when_a_move_starts(
    view: RingView, same: bool
) -> None:
    """``RingView.placement`` is what starts a repair pass on every node (node/repair.py)."""
    before = RingView(6, tuple(_base()), 3, 2, 16)
    assert (view.placement() == before.placement()) is same


@settings(max_examples=150, deadline=None)
@given(
    one=st.dictionaries(
        st.sampled_from(NAMES[:4]), st.sampled_from(["normal", "joining", "leaving", "left"])
    ),
    two=st.dictionaries(
        st.sampled_from(NAMES[:4]), st.sampled_from(["normal", "joining", "leaving", "left"])
    ),
    down=st.sets(st.sampled_from(NAMES[:4]), max_size=1),
)
def test_the_same_placement_means_the_same_owners(
    one: dict[str, str], two: dict[str, str], down: set[str]
) -> None:
    """Oracle: two views whose placements match name the same owners for every key, so a
    repair pass skipped for the second would have found nothing the first did not."""
    a, b = _view(one, frozenset(down)), _view(two, frozenset(down))
    if a.placement() == b.placement():
        for k in (f"k{i}" for i in range(64)):
            assert a.replicas_of(k) == b.replicas_of(k)
