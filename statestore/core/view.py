"""A ring view (pure): the live members, their addresses, R and W, at one epoch.

This is what ``GET /v1/ring`` returns and what the client routes with: the same placement
code runs in the node and the client, so both agree on who holds what at a given epoch.

While nodes join or leave (``core/handover.py``) a view holds two rings: the *read* ring of
the live ``normal`` and ``leaving`` members, which owns every item now (reads, restores,
repair, compaction), and the *future* ring of the live ``normal`` and ``joining`` members.
A member whose token count is changing (``statestore rebalance``: ``next_vnodes`` set) has its
current count on the read ring and its next one on the future ring.
Writes go to both (:meth:`RingView.write_replicas_of`). With nobody moving they are one ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from statestore.core.chunk import DEFAULT_BLOCK_SIZE
from statestore.core.errors import MalformedData
from statestore.core.handover import FUTURE_STATES, READ_STATES, NodeState
from statestore.core.ids import StoreId
from statestore.core.placement import DEFAULT_VNODES, Member, Ring
from statestore.core.quorum import validate_rw

__all__ = ["LEAVING_LAST", "MemberInfo", "RingView"]

STATUSES = ("up", "suspect", "down")
STATES = tuple(s.value for s in NodeState)
# Bounds on a view read from the wire: a ring of vnodes x members tokens is built from it,
# so a view claiming 2^31 vnodes would hang its reader (found by statestore-fuzz).
MAX_VIEW_MEMBERS = 4096
MAX_VIEW_VNODES = 4096
MAX_VIEW_TOKENS = 1 << 21
# reads ask a leaving replica after the others (RingView.read_order); False only for
# bench/elastic.py, which alternates both within one run to measure what it buys
LEAVING_LAST = True
ORDERS_KEPT = 4096  # keys whose read order a view keeps


def _count(value: Any) -> int:
    """A member's token count from the wire: an integer from 0 to MAX_VIEW_VNODES."""
    if type(value) is not int or not 0 <= value <= MAX_VIEW_VNODES:
        raise ValueError(f"a member's token count is 0 to {MAX_VIEW_VNODES}, not {value!r:.40}")
    return value


@dataclass(frozen=True)
class MemberInfo:
    """One member as a ring view shows it: who, where, its failure-detector state, its zone,
    its ring state (joining, normal, leaving, left), how many tokens it owns (``vnodes``, 0:
    the view's count) and, while a rebalance moves them, how many it will own
    (``next_vnodes``, 0: no change)."""

    id: str
    address: str
    status: str = "up"  # "up" | "suspect" | "down"
    zone: str = ""
    state: str = "normal"
    vnodes: int = 0
    next_vnodes: int = 0

    def to_json(self) -> dict[str, str | int]:
        return {
            "id": self.id,
            "address": self.address,
            "status": self.status,
            "zone": self.zone,
            "state": self.state,
            "vnodes": self.vnodes,
            "next_vnodes": self.next_vnodes,
        }

    def placed(self, default: int) -> Member:
        """This member on the read ring of a view whose count is ``default``."""
        n = self.vnodes or default
        return Member(self.id, self.zone, 0 if n == default else n)

    def placed_later(self, default: int) -> Member:
        """This member on the future ring."""
        n = self.next_vnodes or self.vnodes or default
        return Member(self.id, self.zone, 0 if n == default else n)


@dataclass(frozen=True)
class RingView:
    epoch: int
    members: tuple[MemberInfo, ...]
    replicas: int = 3
    write_quorum: int = 2
    vnodes: int = DEFAULT_VNODES
    # some node enforces per-query quotas (--quota-file): writers ask for room first
    quotas: bool = False
    # every member reads blocked chunks (core/chunk.py, core/formats.CHUNK_FORMAT): writers
    # may write them; until then (a ring being upgraded from 0.2) they write whole chunks
    blocks: bool = False
    # every member reads chunk format 3: a writer's whole snapshot names its chunks ``w``
    # (core/manifest.Manifest.whole); until then ``s``, as a folded one's
    whole_names: bool = False

    def block_size(self, wanted: int = DEFAULT_BLOCK_SIZE) -> int:
        """The block size a writer on this ring uses: ``wanted``, or 0 (whole chunks) while
        some member does not read blocked chunks."""
        return wanted if self.blocks else 0

    def snapshot_kind(self) -> str:
        """The chunk kind of a writer's whole snapshot on this ring (core/chunk.encode_chunks):
        ``w``, or ``s`` while some member does not read chunk format 3."""
        return "w" if self.whole_names else "s"

    def __post_init__(self) -> None:
        validate_rw(self.replicas, self.write_quorum)
        live = [m for m in self.members if m.status != "down" and m.state != NodeState.LEFT]
        now = {m.placed(self.vnodes) for m in live if m.state in READ_STATES}
        later = {m.placed_later(self.vnodes) for m in live if m.state in FUTURE_STATES}
        ring = Ring(now, self.vnodes)
        object.__setattr__(self, "_ring", ring)
        object.__setattr__(self, "_future", ring if later == now else Ring(later, self.vnodes))
        object.__setattr__(self, "_live", tuple(sorted(m.id for m in live)))
        object.__setattr__(self, "_addr", {m.id: m.address for m in self.members})
        leaving = frozenset(m.address for m in live if m.state == NodeState.LEAVING)
        object.__setattr__(self, "_leaving", leaving)
        object.__setattr__(self, "_orders", {})  # read_order's, kept

    @property
    def ring(self) -> Ring:
        ring: Ring = self.__dict__["_ring"]
        return ring

    @property
    def future(self) -> Ring:
        """The ring once every move finishes (the read ring when nobody moves)."""
        ring: Ring = self.__dict__["_future"]
        return ring

    @property
    def moving(self) -> bool:
        """Whether a member is joining, leaving or changing its token count (the two rings
        differ)."""
        return self.future is not self.ring

    def placement(self) -> tuple[tuple[Member, ...], tuple[str, ...]]:
        """Who owns what now: the read ring's members (tokens and zones) and their
        addresses. A member that starts joining or leaving moves the epoch but not this
        (its copies move through the hand-over), nor does a suspicion; a member that is
        declared down, comes back, finishes a move or changes address does."""
        members = self.ring.members
        return members, tuple(self.address(m.id) for m in members)

    def only_left_since(self, before: object) -> bool:
        """Whether the read ring differs from ``before`` (an earlier :meth:`placement`) only
        by members that are gone since in state ``left``: a finished decommission, whose
        hand-over verified every copy before it switched. False for a member declared down,
        one added, or any change of tokens or addresses."""
        if not isinstance(before, tuple) or len(before) != 2:
            return False
        was = dict(zip(before[0], before[1], strict=False))
        members, addresses = self.placement()
        now = dict(zip(members, addresses, strict=True))
        if now == was or any(was.get(m) != a for m, a in now.items()):
            return False
        states = {m.id: m.state for m in self.members}
        return all(states.get(m.id) == NodeState.LEFT for m in was.keys() - now.keys())

    def moving_tokens(self) -> list[str]:
        """Ids of the live members changing their token count (``statestore rebalance``)."""
        return [m.id for m in self.members if m.status != "down" and m.next_vnodes]

    def busy(self, besides: str = "") -> str | None:
        """Why no member may start a token move now (None: it may): a member that owned
        ranges is down (its copies are one short), or one is joining, leaving or moving
        tokens (one move at a time, so every ring in between holds R copies); the member
        ``besides`` (a node's own move) not counted."""
        for m in self.members:
            if m.id == besides:
                continue
            if m.status == "down" and m.state in READ_STATES:
                return (
                    f"member {m.id} is down: its copies are one short until it comes back, "
                    "is replaced (`statestore node --replace`) or is removed for good "
                    "(`statestore removenode`); move tokens after that"
                )
            if m.status != "down" and (
                m.state in (NodeState.JOINING, NodeState.LEAVING) or m.next_vnodes
            ):
                what = "tokens" if m.next_vnodes else m.state
                return f"member {m.id} is moving ({what}): one move at a time"
        return None

    def address(self, node_id: str) -> str:
        addr: str = self.__dict__["_addr"][node_id]
        return addr

    def live_addresses(self) -> list[str]:
        """Every member that is not down and has not left, joining ones included."""
        return [self.address(i) for i in self.__dict__["_live"]]

    def replicas_of(self, key: str) -> list[str]:
        """Addresses of the R nodes that hold ``key`` at this epoch (its current owners)."""
        return [self.address(n) for n in self.ring.replicas(key, self.replicas)]

    def future_replicas_of(self, key: str) -> list[str]:
        """Addresses of ``key``'s owners once every move finishes."""
        if not self.moving:
            return self.replicas_of(key)
        return [self.address(n) for n in self.future.replicas(key, self.replicas)]

    def write_replicas_of(self, key: str) -> list[str]:
        """Where a write of ``key`` goes: its current owners, then its pending owners (future
        owners that do not own it yet)."""
        now = self.replicas_of(key)
        if not self.moving:
            return now
        return now + [a for a in self.future_replicas_of(key) if a not in now]

    def store_write_replicas(self, store: StoreId) -> list[str]:
        return self.write_replicas_of(store.path)

    def leaving(self) -> frozenset[str]:
        """Addresses of the live members that are leaving: owners still, and each the
        busiest node of the ring while it streams everything it holds to its next owners.
        Reads ask them last (:meth:`read_order`, the restore planner's ``avoid``)."""
        out: frozenset[str] = self.__dict__["_leaving"] if LEAVING_LAST else frozenset()
        return out

    def read_order(self, key: str) -> list[str]:
        """Replicas first, a leaving one after the others (:meth:`leaving`), then every other
        live node in ring order (where it may have moved). The orders of the last keys asked
        are kept with the view (a reader asks the same few chunks' order read after read)."""
        orders: dict[tuple[str, bool], tuple[str, ...]] = self.__dict__["_orders"]
        kept = orders.get((key, LEAVING_LAST))
        if kept is None:
            if len(orders) >= ORDERS_KEPT:
                orders.clear()
            kept = orders[(key, LEAVING_LAST)] = tuple(self._read_order(key))
        return list(kept)

    def _read_order(self, key: str) -> list[str]:
        first = self.replicas_of(key)
        leaving = self.leaving()
        if leaving:
            first = [a for a in first if a not in leaving] + [a for a in first if a in leaving]
        rest = [self.address(n) for n in self.ring.preference(key)]
        return first + [a for a in rest if a not in first]

    def same_owners(self, other: RingView, keys: Sequence[str]) -> bool:
        """Whether ``other`` gives each of ``keys`` the same owners (as a set: reads ask
        them all) under the same R and W, so a quorum read made on one view is one on the
        other."""
        if (self.replicas, self.write_quorum) != (other.replicas, other.write_quorum):
            return False
        if self.placement() == other.placement():
            return True
        return all(set(self.replicas_of(k)) == set(other.replicas_of(k)) for k in keys)

    def previous_replicas(self, key: str) -> list[str]:
        """Addresses of ``key``'s replicas on the ring that still counted the down nodes:
        where the item lived before they were declared down."""
        ring: Ring = self.__dict__.get("_all_ring") or Ring(
            (m.placed(self.vnodes) for m in self.members if m.state in READ_STATES),
            self.vnodes,
        )
        self.__dict__["_all_ring"] = ring
        return [self.address(n) for n in ring.replicas(key, self.replicas)]

    def write_homes(self, key: str) -> list[str]:
        """``key``'s home replicas as a manifest write counts them (core/quorum
        ``check_write_sets``): a live one by its address, a down one as ``down:ID``, which no
        answer ever matches. A write needs W of them however many are down, so a stand-in's
        copy never stands for a home replica's (it is a hint), and a down member's address
        taken by a new member is not that member's."""
        self.previous_replicas(key)  # builds the ring counting every member
        ring: Ring = self.__dict__["_all_ring"]
        live = set(self.__dict__["_live"])
        return [
            self.address(n) if n in live else f"down:{n}" for n in ring.replicas(key, self.replicas)
        ]

    def live_home_replicas(self, key: str) -> list[str]:
        """``key``'s home replicas (:meth:`previous_replicas`) that this view does not call
        down, by member id (a down member's address may be a new member's now). A manifest
        write goes to them (net/writes.py, :meth:`write_homes`) and a latest read waits for a
        read quorum of them (net/reads.py)."""
        return [a for a in self.write_homes(key) if not a.startswith("down:")]

    def store_replicas(self, store: StoreId) -> list[str]:
        return self.replicas_of(store.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "replicas": self.replicas,
            "write_quorum": self.write_quorum,
            "vnodes": self.vnodes,
            "members": [m.to_json() for m in self.members],
            "quotas": self.quotas,
            "blocks": self.blocks,
            "whole_names": self.whole_names,
        }

    @classmethod
    def from_json(cls, obj: Any) -> RingView:
        try:
            members = tuple(
                MemberInfo(
                    str(m["id"]),
                    str(m["address"]),
                    str(m["status"]),
                    str(m.get("zone", "")),
                    str(m.get("state", "normal")),
                    _count(m.get("vnodes", 0)),
                    _count(m.get("next_vnodes", 0)),
                )
                for m in obj["members"]
            )
            if any(m.status not in STATUSES for m in members):
                raise ValueError(f"a member status is not one of {STATUSES}")
            if any(m.state not in STATES for m in members):
                raise ValueError(f"a member state is not one of {STATES}")
            vnodes = int(obj["vnodes"])
            tokens = sum(max(m.vnodes or vnodes, m.next_vnodes) for m in members)
            if not (
                len(members) <= MAX_VIEW_MEMBERS
                and 1 <= vnodes <= MAX_VIEW_VNODES
                and tokens <= MAX_VIEW_TOKENS
            ):
                raise ValueError(
                    f"{len(members)} members owning {tokens} tokens ({vnodes} vnodes by "
                    "default) is past the bounds of a ring "
                    f"({MAX_VIEW_MEMBERS} members, {MAX_VIEW_VNODES} vnodes, "
                    f"{MAX_VIEW_TOKENS} tokens)"
                )
            return cls(
                int(obj["epoch"]),
                members,
                int(obj["replicas"]),
                int(obj["write_quorum"]),
                vnodes,
                obj.get("quotas") is True,
                obj.get("blocks") is True,
                obj.get("whole_names") is True,
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise MalformedData(f"ring view is malformed ({exc!r})") from exc
