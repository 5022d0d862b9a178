"""Membership and failure detection (pure): heartbeat gossip, up / suspect / down, ring epoch.

Each node owns a heartbeat counter that it bumps every gossip round; gossip exchanges the whole
table and keeps, per member, the entry with the highest ``(incarnation, heartbeat)`` (a node
restarted from its data dir keeps its id and takes a new, higher incarnation). A member whose
heartbeat has not advanced for ``suspect_after`` seconds of *local* time is suspect, and after
``down_after`` it is down. The ring is built from members that are not down; whenever that set
changes the epoch goes up, and epochs merge by maximum, so every node converges on the same
epoch and anything placement-dependent can be tagged with it. Time is passed in.

Each entry also carries the member's ring state (``core/handover.NodeState``: joining, normal,
leaving, left), written only by the member itself (:meth:`Membership.set_state` bumps its
heartbeat so the change spreads); a state change moves the epoch like a change of the live set.
So does its token count (``vnodes``, 0: the ring's count) and, while a rebalance moves tokens,
the count it is moving to (``next_vnodes``): :meth:`Membership.set_vnodes`.

A newer life of our own id is refuted (we take a higher incarnation) when it names our address,
and is *not* when it names another one: that is a replacement (``statestore node --replace``)
that took our id, and :attr:`Membership.superseded` says so; the node then stands aside.

**Removal** (``statestore removenode``, node/removal.py): a dead member that will not come
back is written off by a survivor, which writes that member's entry itself with a
``removal`` mark: ``removing`` while the survivors re-replicate its share, then ``removed``
(ring state ``left``). A marked entry is always down, and the mark orders entries before
``(incarnation, heartbeat)`` does (``removed`` > ``removing`` > none), so it wins every merge
whatever the dead member's own entries say: a node that missed the removal (partitioned, or
restarted from a data dir that kept the mark) converges on it, and the removed member's own
gossip, even from a new incarnation, is ignored: its id never comes back. A node that sees
its *own* id marked (:attr:`Membership.removed_self`) stands aside like a superseded one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from statestore.core.address import parse_address
from statestore.core.errors import InvalidAddress, MalformedData
from statestore.core.formats import CHUNK_FORMAT
from statestore.core.handover import READ_STATES, NodeState
from statestore.core.placement import Member

__all__ = [
    "MAX_EPOCH_STEP",
    "MAX_INCARNATION_STEP",
    "REMOVED",
    "REMOVING",
    "MemberState",
    "Membership",
    "Status",
]

MAX_RING_EPOCH = 2**53 - 1
MAX_EPOCH_STEP = 2**32  # far more live-set changes than a ring sees between two gossips
MAX_INCARNATION = 2**31 - 1
MAX_INCARNATION_STEP = 1024  # restarts of one member between two gossips
MAX_HEARTBEAT = 2**53 - 1
MAX_VNODES = 4096  # a member's token count (core/view.MAX_VIEW_VNODES)
REMOVING = "removing"  # a removal's marks (module docstring), in the order they win
REMOVED = "removed"
_REMOVAL_RANK = {"": 0, REMOVING: 1, REMOVED: 2}
_LOOPBACK = ("localhost", "0.0.0.0", "[::]", "[::1]", "[0:0:0:0:0:0:0:1]", "ip6-localhost")


class Status(StrEnum):
    UP = "up"
    SUSPECT = "suspect"
    DOWN = "down"


@dataclass(frozen=True)
class MemberState:
    id: str
    address: str
    zone: str
    incarnation: int
    heartbeat: int
    status: Status = Status.UP
    last_advance: float = 0.0
    state: NodeState = NodeState.NORMAL
    vnodes: int = 0
    next_vnodes: int = 0
    removal: str = ""  # "", REMOVING or REMOVED (statestore removenode)
    removed_by: str = ""  # the survivor that marked it
    chunk_format: int = 1  # the newest chunk layout it reads (core/formats.CHUNK_FORMAT)

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "address": self.address,
            "zone": self.zone,
            "incarnation": self.incarnation,
            "heartbeat": self.heartbeat,
            "state": self.state.value,
            "vnodes": self.vnodes,
            "next_vnodes": self.next_vnodes,
        }
        if self.removal:  # only then: a ring that never removed a node gossips as before
            out |= {"removal": self.removal, "removed_by": self.removed_by}
        if self.chunk_format > 1:  # builds before 0.3.0 say nothing: they read format 1
            out["chunk_format"] = self.chunk_format
        return out

    @property
    def rank(self) -> tuple[int, int, int]:
        """What orders two entries of one member: the removal mark, then its life."""
        return _REMOVAL_RANK[self.removal], self.incarnation, self.heartbeat


@dataclass(frozen=True)
class _Entry:
    id: str
    address: str
    zone: str
    incarnation: int
    heartbeat: int
    state: NodeState
    vnodes: int
    next_vnodes: int
    removal: str = ""
    removed_by: str = ""
    chunk_format: int = 1

    @property
    def rank(self) -> tuple[int, int, int]:
        return _REMOVAL_RANK[self.removal], self.incarnation, self.heartbeat


def _parse_entry(obj: Any) -> _Entry:
    try:
        ident, addr, zone = obj["id"], obj["address"], obj.get("zone", "")
        inc, hb = obj["incarnation"], obj["heartbeat"]
        state = obj.get("state", "normal")
        vnodes, next_vnodes = obj.get("vnodes", 0), obj.get("next_vnodes", 0)
        removal, removed_by = obj.get("removal", ""), obj.get("removed_by", "")
        chunk_format = obj.get("chunk_format", 1)
    except (KeyError, TypeError, AttributeError) as exc:
        raise MalformedData(f"gossip entry {obj!r:.200} is malformed") from exc
    if not all(
        isinstance(x, str) for x in (ident, addr, zone, state, removal, removed_by)
    ) or not all(type(x) is int for x in (inc, hb, vnodes, next_vnodes, chunk_format)):
        raise MalformedData(f"gossip entry {obj!r:.200} has fields of the wrong type")
    if not (0 <= inc <= MAX_INCARNATION and 0 <= hb <= MAX_HEARTBEAT):
        raise MalformedData(f"gossip entry {ident!r:.80}: incarnation or heartbeat out of range")
    if not (0 <= vnodes <= MAX_VNODES and 0 <= next_vnodes <= MAX_VNODES):
        raise MalformedData(f"gossip entry {ident!r:.80}: a token count is not 0 to {MAX_VNODES}")
    try:
        ring_state = NodeState(state)
    except ValueError as exc:
        raise MalformedData(
            f"gossip entry {ident!r:.80}: unknown ring state {state!r:.40}"
        ) from exc
    if removal not in _REMOVAL_RANK:
        raise MalformedData(f"gossip entry {ident!r:.80}: unknown removal mark {removal!r:.40}")
    if not 1 <= chunk_format <= 255:
        raise MalformedData(f"gossip entry {ident!r:.80}: chunk format {chunk_format} is not 1-255")
    return _Entry(
        ident,
        addr,
        zone,
        inc,
        hb,
        ring_state,
        vnodes,
        next_vnodes,
        removal,
        removed_by[:64],
        chunk_format,
    )


def is_self_alias(address: str, own: str, own_hosts: frozenset[str] = frozenset()) -> bool:
    """Whether ``address`` names the node at ``own``: the same port on a loopback host, a
    wildcard, or one of ``own_hosts`` (its host names and addresses, lower case)."""
    try:
        host, port = parse_address(address)
        own_host, own_port = parse_address(own, bind=True)
    except InvalidAddress:
        return False
    if port != own_port:
        return False
    host = host.lower()
    return (
        host == own_host.lower()
        or host in own_hosts
        or host in _LOOPBACK
        or host.startswith("127.")
        or host.startswith("[::ffff:127.")
    )


class Membership:
    """One node's view of the cluster."""

    def __init__(
        self,
        self_id: str,
        address: str,
        zone: str,
        incarnation: int,
        now: float,
        *,
        suspect_after: float = 2.0,
        down_after: float = 5.0,
        own_hosts: frozenset[str] = frozenset(),
        state: NodeState = NodeState.NORMAL,
        vnodes: int = 0,
        chunk_format: int = CHUNK_FORMAT,
    ) -> None:
        self.self_id = self_id
        self.address = address
        self.refused: list[str] = []  # why entries of the last merge were skipped
        # (address, incarnation) of a newer life of our id at another address: a
        # replacement (``statestore node --replace``) took our place; we do not refute it
        self.superseded: tuple[str, int] | None = None
        # (mark, by) once gossip says a survivor removed our id (statestore removenode)
        self.removed_self: tuple[str, str] | None = None
        self.own_hosts = frozenset(h.lower() for h in own_hosts)
        self.suspect_after = suspect_after
        self.down_after = down_after
        self.epoch = 1
        self._members: dict[str, MemberState] = {
            self_id: MemberState(
                self_id,
                address,
                zone,
                incarnation,
                0,
                Status.UP,
                now,
                state,
                vnodes,
                chunk_format=chunk_format,
            )
        }
        self._live = self._live_set()

    # -- queries -------------------------------------------------------------------------
    def members(self) -> list[MemberState]:
        return sorted(self._members.values(), key=lambda m: m.id)

    def get(self, node_id: str) -> MemberState | None:
        return self._members.get(node_id)

    def removals(self) -> list[MemberState]:
        """The members marked ``removing`` or ``removed`` (statestore removenode)."""
        return [m for m in self.members() if m.removal]

    def live(self) -> list[MemberState]:
        return [m for m in self.members() if m.status is not Status.DOWN]

    def placement_members(self) -> list[Member]:
        """The current owners: live members that are ``normal`` or ``leaving``, each with its
        token count (0: the ring's)."""
        return [Member(m.id, m.zone, m.vnodes) for m in self.live() if m.state in READ_STATES]

    @property
    def state(self) -> NodeState:
        """This node's own ring state."""
        return self._members[self.self_id].state

    def addresses(self) -> dict[str, str]:
        return {m.id: m.address for m in self._members.values()}

    def digest(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "members": [m.wire() for m in self.members()]}

    # -- transitions ---------------------------------------------------------------------
    def tick(self, now: float) -> bool:
        """Bump our heartbeat and re-judge everyone. True if the live set changed."""
        me = self._members[self.self_id]
        self._members[self.self_id] = replace(me, heartbeat=me.heartbeat + 1, last_advance=now)
        for ident, m in list(self._members.items()):
            if ident == self.self_id or m.removal:  # a removal's mark is down for good
                continue
            age = now - m.last_advance
            status = (
                Status.UP
                if age < self.suspect_after
                else Status.SUSPECT
                if age < self.down_after
                else Status.DOWN
            )
            if status is not m.status:
                self._members[ident] = replace(m, status=status)
        return self._recompute()

    def set_state(self, state: NodeState, now: float) -> bool:
        """Change this node's own ring state; its heartbeat moves so the entry wins every
        merge. True if the live set (which counts states) changed."""
        me = self._members[self.self_id]
        self._members[self.self_id] = replace(
            me, state=state, heartbeat=me.heartbeat + 1, last_advance=now
        )
        return self._recompute()

    def set_vnodes(self, vnodes: int, next_vnodes: int, now: float) -> bool:
        """Change this node's own token count (``vnodes``) or the count a rebalance moves it
        to (``next_vnodes``, 0: none); spreads like :meth:`set_state`."""
        if not (0 <= vnodes <= MAX_VNODES and 0 <= next_vnodes <= MAX_VNODES):
            raise ValueError(f"a token count is 0 to {MAX_VNODES}")
        me = self._members[self.self_id]
        self._members[self.self_id] = replace(
            me,
            vnodes=vnodes,
            next_vnodes=next_vnodes,
            heartbeat=me.heartbeat + 1,
            last_advance=now,
        )
        return self._recompute()

    def merge(self, digest: Mapping[str, Any], now: float) -> bool:
        """Merge a peer's table. True if the live set changed.

        Raises MalformedData for a table that is malformed or whose epoch is out of bounds
        (nothing merged). Entries that fail a sanity check are skipped and listed in
        :attr:`refused` (the reason of each), the others merged.
        """
        self.refused = self.check(digest)
        entries: Iterable[Any] = digest.get("members", [])  # check() allows it missing
        for obj in entries:
            e = _parse_entry(obj)
            ident, addr, inc, hb = e.id, e.address, e.incarnation, e.heartbeat
            if ident == self.self_id:
                me = self._members[ident]
                if e.removal:  # a survivor removed us: never refuted (module docstring)
                    if self.removed_self is None or e.removal == REMOVED:
                        self.removed_self = (e.removal, e.removed_by)
                    continue
                if (inc, hb) > (me.incarnation, me.heartbeat) and addr != me.address:
                    # another process lives our id elsewhere, newer: we were replaced.
                    # Refuting would make the two fight over the id (and its tokens).
                    if self.superseded is None or inc > self.superseded[1]:
                        self.superseded = (addr, inc)
                    continue
                if (inc, hb) > (me.incarnation, me.heartbeat) and inc < MAX_INCARNATION:
                    # refute: a peer claims a newer life of ours than we lived
                    self._members[ident] = replace(me, incarnation=inc + 1, last_advance=now)
                continue
            if self._refusal(ident, addr, inc, e.removal) is not None:
                continue
            cur = self._members.get(ident)
            if cur is None or e.rank > cur.rank:  # a removal's mark wins over any life
                self._members[ident] = MemberState(
                    ident,
                    addr,
                    e.zone,
                    inc,
                    hb,
                    Status.DOWN if e.removal else Status.UP,
                    cur.last_advance if cur is not None and e.removal else now,
                    e.state,
                    e.vnodes,
                    e.next_vnodes,
                    e.removal,
                    e.removed_by,
                    e.chunk_format,
                )
        self.epoch = max(self.epoch, int(digest.get("epoch", 0)))
        return self._recompute()

    def mark_removal(self, target: str, mark: str, by: str, now: float) -> bool:
        """Write member ``target`` off (``statestore removenode``): its entry, marked
        ``mark`` (REMOVING, then REMOVED: ring state ``left``) by member ``by``, down for
        good; it wins every merge (module docstring). True if the epoch moved (it does:
        views drop a removed member). Raises ValueError for ourselves or an unknown id."""
        if target == self.self_id:
            raise ValueError("a node does not remove itself")
        if mark not in (REMOVING, REMOVED):
            raise ValueError(f"a removal's mark is {REMOVING} or {REMOVED}, not {mark!r}")
        cur = self._members.get(target)
        if cur is None:
            raise ValueError(f"no member {target}")
        self._members[target] = replace(
            cur,
            status=Status.DOWN,
            removal=mark,
            removed_by=by,
            heartbeat=min(cur.heartbeat + 1, MAX_HEARTBEAT),
            state=NodeState.LEFT if mark == REMOVED else cur.state,
        )
        return self._recompute()

    def remember(self, entries: Iterable[Any], now: float) -> bool:
        """Take back removal marks kept in the data dir (``MemberState.wire`` objects) as if
        gossiped: a restarted node does not forget a removed member, so that member cannot
        come back through it. Entries without a mark, or that do not parse, are skipped.
        True if the epoch moved."""
        for obj in entries:
            try:
                e = _parse_entry(obj)
            except MalformedData:
                continue
            if not e.removal:
                continue
            if e.id == self.self_id:
                self.removed_self = (e.removal, e.removed_by)
                continue
            cur = self._members.get(e.id)
            if cur is None or e.rank > cur.rank:
                self._members[e.id] = MemberState(
                    e.id,
                    e.address,
                    e.zone,
                    e.incarnation,
                    e.heartbeat,
                    Status.DOWN,
                    now,
                    e.state,
                    e.vnodes,
                    e.next_vnodes,
                    e.removal,
                    e.removed_by,
                    e.chunk_format,
                )
        return self._recompute()

    def check(self, digest: Mapping[str, Any]) -> list[str]:
        """Validate a peer's table without merging it: raises MalformedData if it is unusable
        as a whole, and returns why each entry that would be skipped is refused."""
        if not isinstance(digest, Mapping):
            raise MalformedData("gossip digest must be an object with epoch and members")
        entries = digest.get("members", [])
        remote_epoch = digest.get("epoch", 0)
        if not isinstance(entries, list) or type(remote_epoch) is not int:
            raise MalformedData("gossip digest must have an integer epoch and a members list")
        if not 0 <= remote_epoch <= min(MAX_RING_EPOCH, self.epoch + MAX_EPOCH_STEP):
            raise MalformedData(
                f"gossip epoch {remote_epoch} is out of bounds (ours is {self.epoch}): "
                "refused, it would move the ring epoch past what clients can hold"
            )
        out = []
        for obj in entries:
            e = _parse_entry(obj)
            if e.id != self.self_id:
                why = self._refusal(e.id, e.address, e.incarnation, e.removal)
                if why is not None:
                    out.append(why)
        return out

    def _refusal(self, ident: str, addr: str, inc: int, removal: str = "") -> str | None:
        try:
            parse_address(addr)
        except InvalidAddress:
            return f"member {ident} has no usable HOST:PORT address ({addr!r:.80})"
        if removal:
            # a removal's mark names a dead member's last address, which a new node (or
            # this one) may use now: it claims nothing there, it only writes the id off
            return None
        cur = self._members.get(ident)
        if cur is not None and cur.removal:
            return None  # a removed member's own entries lose every merge, silently
        if is_self_alias(addr, self.address, self.own_hosts):
            return f"member {ident} at {addr} is an alias of this node ({self.address})"
        if cur is not None and inc > cur.incarnation + MAX_INCARNATION_STEP:
            return (
                f"member {ident} incarnation {inc} leaps past {cur.incarnation} + "
                f"{MAX_INCARNATION_STEP}"
            )
        for m in self._members.values():
            if m.id != ident and m.address == addr and m.status is not Status.DOWN:
                return f"address {addr} belongs to live member {m.id}, not {ident}"
        if cur is not None and cur.address != addr and inc <= cur.incarnation:
            return f"member {ident} moves to {addr} without a new incarnation"
        return None

    def _live_set(self) -> frozenset[tuple[str, str, str, int, int, int]]:
        """What moves the epoch: the live members' places, and the removals' marks (a view
        drops a removed member, so clients must refresh theirs)."""
        return frozenset(
            (m.id, m.address, m.state.value, m.vnodes, m.next_vnodes, m.chunk_format)
            for m in self._members.values()
            if m.status is not Status.DOWN
        ) | frozenset((m.id, "", m.removal, -1, -1, 0) for m in self._members.values() if m.removal)

    def _recompute(self) -> bool:
        live = self._live_set()
        if live != self._live:
            self._live = live
            self.epoch += 1
            return True
        return False
