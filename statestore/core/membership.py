"""Membership and failure detection (pure): heartbeat gossip, up / suspect / down, ring epoch.

Each node owns a heartbeat counter that it bumps every gossip round; gossip exchanges the whole
table and keeps, per member, the entry with the highest ``(incarnation, heartbeat)`` (a node
restarted from its data dir keeps its id and takes a new, higher incarnation). A member whose
heartbeat has not advanced for ``suspect_after`` seconds of *local* time is suspect, and after
``down_after`` it is down. The ring is built from members that are not down; whenever that set
changes the epoch goes up, and epochs merge by maximum, so every node converges on the same
epoch and anything placement-dependent can be tagged with it. Time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from statestore.core.errors import MalformedData
from statestore.core.placement import Member

__all__ = ["MemberState", "Membership", "Status"]


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

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "address": self.address,
            "zone": self.zone,
            "incarnation": self.incarnation,
            "heartbeat": self.heartbeat,
        }


def _parse_entry(obj: Any) -> tuple[str, str, str, int, int]:
    try:
        ident, addr, zone = obj["id"], obj["address"], obj.get("zone", "")
        inc, hb = obj["incarnation"], obj["heartbeat"]
    except (KeyError, TypeError) as exc:
        raise MalformedData(f"gossip entry {obj!r} is malformed") from exc
    if not all(isinstance(x, str) for x in (ident, addr, zone)) or not all(
        isinstance(x, int) for x in (inc, hb)
    ):
        raise MalformedData(f"gossip entry {obj!r} has fields of the wrong type")
    return ident, addr, zone, inc, hb


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
    ) -> None:
        self.self_id = self_id
        self.suspect_after = suspect_after
        self.down_after = down_after
        self.epoch = 1
        self._members: dict[str, MemberState] = {
            self_id: MemberState(self_id, address, zone, incarnation, 0, Status.UP, now)
        }
        self._live = self._live_set()

    # -- queries -------------------------------------------------------------------------
    def members(self) -> list[MemberState]:
        return sorted(self._members.values(), key=lambda m: m.id)

    def get(self, node_id: str) -> MemberState | None:
        return self._members.get(node_id)

    def live(self) -> list[MemberState]:
        return [m for m in self.members() if m.status is not Status.DOWN]

    def placement_members(self) -> list[Member]:
        return [Member(m.id, m.zone) for m in self.live()]

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
            if ident == self.self_id:
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

    def merge(self, digest: Mapping[str, Any], now: float) -> bool:
        """Merge a peer's table. True if the live set changed."""
        entries: Iterable[Any] = digest.get("members", [])
        remote_epoch = digest.get("epoch", 0)
        if not isinstance(entries, list) or not isinstance(remote_epoch, int):
            raise MalformedData("gossip digest must have an integer epoch and a members list")
        for obj in entries:
            ident, addr, zone, inc, hb = _parse_entry(obj)
            if ident == self.self_id:
                continue
            cur = self._members.get(ident)
            if cur is None or (inc, hb) > (cur.incarnation, cur.heartbeat):
                self._members[ident] = MemberState(ident, addr, zone, inc, hb, Status.UP, now)
        self.epoch = max(self.epoch, remote_epoch)
        return self._recompute()

    def _live_set(self) -> frozenset[tuple[str, str]]:
        return frozenset(
            (m.id, m.address) for m in self._members.values() if m.status is not Status.DOWN
        )

    def _recompute(self) -> bool:
        live = self._live_set()
        if live != self._live:
            self._live = live
            self.epoch += 1
            return True
        return False
