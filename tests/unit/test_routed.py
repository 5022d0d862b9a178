"""A client's read that answers show ran on a stale view (client ``_routed``): run again on a
fresh view unless that view gives the stores read the same replicas. A member starting to
join or leave moves the epoch, not the owners; a member that has left or is down moves them.

The ring here is a stand-in transport that serves ``GET /v1/ring`` from a given view (the
real nodes' side of it runs in tests/ring/test_elastic.py); what is checked is how many times the
client runs the read, never a duration."""

from __future__ import annotations

import json
from typing import Any

import pytest

from client import AsyncRingClient, StoreId
from statestore.core.errors import StoreNotFound
from statestore.core.view import MemberInfo, RingView
from statestore.net.transport import Response

IDS = ["a", "b", "c", "d"]  # and "e" when a test names its state


def view(epoch: int, states: dict[str, str], down: frozenset[str] = frozenset()) -> RingView:
    members = tuple(
        MemberInfo(n, f"{n}:1", "down" if n in down else "up", "", states.get(n, "normal"))
        for n in IDS + [n for n in states if n not in IDS]
    )
    return RingView(epoch, members, 3, 2, 16)


class Ring:
    """Serves the current view; ``seen_epoch`` as answers from the nodes would move it."""

    timeout = 1.0

    def __init__(self, current: RingView) -> None:
        self.current = current
        self.seen_epoch = current.epoch

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def request(self, method: str, address: str, path: str, **_: Any) -> Response:
        assert (method, path) == ("GET", "/v1/ring")
        return Response(200, json.dumps(self.current.to_json()).encode(), self.current.epoch)


OLD = view(3, {})
STORES = [StoreId("q", 0, p) for p in range(100)]
d_owns = next(s for s in STORES if "d:1" in OLD.store_replicas(s))
d_lacks = next(s for s in STORES if "d:1" not in OLD.store_replicas(s))


async def runs(
    newer: RingView, seen: int, stores: list[StoreId], *, not_found: bool = False
) -> int:
    """How many times ``_routed`` runs a read on the client's view ``OLD`` whose answers carry
    epoch ``seen`` while the ring serves ``newer`` (``not_found``: the read finds nothing)."""
    ring = Ring(OLD)
    async with AsyncRingClient(["a:1"], transport=ring) as client:  # type: ignore[arg-type]
        await client.refresh()
        used: list[int] = []

        async def op(v: RingView) -> int:
            used.append(v.epoch)
            ring.current, ring.seen_epoch = newer, seen
            if not_found:
                raise StoreNotFound("no such store")
            return len(used)

        try:
            assert await client._routed(op, read=True, stores=stores) == len(used)
        except StoreNotFound:
            assert not_found
        assert used[0] == 3 and all(e == newer.epoch for e in used[1:])
        return len(used)


@pytest.mark.parametrize(
    ("newer", "store", "again"),
    [
        (view(4, {"d": "leaving"}), d_owns, 1),  # a leave starts: same owners
        (view(4, {"e": "joining"}), d_owns, 1),  # nothing that owns moved
        (view(4, {"d": "left"}), d_owns, 2),  # the leave ended: d's stores have new owners
        (view(4, {"d": "left"}), d_lacks, 1),  # ... the others keep theirs
        (view(4, {}, frozenset({"d"})), d_owns, 2),  # d declared down
    ],
)
async def test_a_read_runs_again_only_when_its_stores_owners_changed(
    newer: RingView, store: StoreId, again: int
) -> None:
    assert await runs(newer, 4, [store]) == again
    assert await runs(newer, 4, [store], not_found=True) == again  # "not found" is final alike
    assert await runs(newer, 4, []) == 2  # a caller that does not say what it read: again


async def test_a_fresh_view_older_than_an_answer_does_not_spare_the_run() -> None:
    """The node asked for the view is behind the epoch an answer carried: the owners it gives
    prove nothing about that epoch, so the read runs again."""
    assert await runs(view(4, {"d": "leaving"}), 5, [d_owns]) == 2
