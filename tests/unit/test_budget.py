"""The node's memory budget (node/budget.MemoryBudget): room taken at once when there is
some, a taker without room waits for a give and is refused when none comes in time."""

from __future__ import annotations

import asyncio

import pytest

from statestore.core.errors import PayloadTooLarge, RateLimited
from statestore.node.budget import Lease, MemoryBudget


def test_a_taker_without_room_gets_it_when_another_gives_it_back() -> None:
    async def run() -> list[str]:
        budget = MemoryBudget(100, wait=5.0, max_body=10)
        await budget.take(80, "a")
        order: list[str] = []

        async def b() -> None:
            await budget.take(50, "b")
            order.append("b in")

        waiter = asyncio.create_task(b())
        await asyncio.sleep(0.01)
        order.append(f"used {budget.used}")
        await budget.take(10, "c")  # there is room for it: it does not wait
        order.append("c in")
        await budget.give(80)
        await asyncio.wait_for(waiter, 1.0)
        order.append(f"used {budget.used}")
        await budget.give(60)
        order.append(f"used {budget.used}")
        return order

    assert asyncio.run(run()) == ["used 80", "c in", "b in", "used 60", "used 0"]


def test_a_taker_that_finds_no_room_in_time_is_refused_and_holds_nothing() -> None:
    async def run() -> tuple[int, int]:
        budget = MemoryBudget(100, wait=0.05, max_body=10)
        await budget.take(60, "a")
        with pytest.raises(RateLimited):
            await budget.take(50, "b")
        with pytest.raises(PayloadTooLarge):
            await budget.take(30, "c", held=80)  # the request would hold 110: never
        return budget.used, budget.refused

    assert asyncio.run(run()) == (60, 1)


def test_a_reservation_larger_than_the_budget_waits_to_run_alone() -> None:
    """``Lease.reserve`` (a restore's fold): more than the whole budget is not refused as a
    ``take`` is; it waits until the others give theirs back, then holds all of it, and a
    reservation beyond what it holds takes nothing more."""

    async def run() -> list[str]:
        budget = MemoryBudget(100, wait=5.0, max_body=10)
        other = Lease(budget)
        await other.take(30, "a")
        big = Lease(budget)
        order: list[str] = []

        async def restore() -> None:
            await big.reserve(500, "a restore")
            order.append(f"reserved {big.held}")
            await big.reserve(10, "more of it")  # nothing is left to take: no wait
            order.append(f"reserved {big.held}")

        waiter = asyncio.create_task(restore())
        await asyncio.sleep(0.01)
        order.append(f"waiting, used {budget.used}")
        await other.close()
        await asyncio.wait_for(waiter, 1.0)
        await big.close()
        order.append(f"used {budget.used}")
        return order

    assert asyncio.run(run()) == [
        "waiting, used 30", "reserved 100", "reserved 100", "used 0",
    ]  # fmt: skip


def test_an_impatient_take_without_room_is_refused_at_once() -> None:
    """A tree hop's take (``patient=False``) does not wait on a budget others hold: its
    parent holds its own memory meanwhile and can fetch the hop's chunks itself. A lease
    whose request ended takes nothing (a task it left behind)."""

    async def run() -> tuple[int, int, int]:
        budget = MemoryBudget(100, wait=30.0, max_body=10)
        other = Lease(budget)
        await other.take(90, "a")
        hop = Lease(budget)
        with pytest.raises(RateLimited):
            await asyncio.wait_for(hop.take(50, "a tree fold", patient=False), 1.0)
        await hop.take(10, "a small fold", patient=False)  # room now: taken
        used, held = budget.used, hop.held
        await hop.close()
        with pytest.raises(RateLimited):
            await hop.take(1, "a fold left behind", patient=False)
        return used, held, budget.refused, budget.used

    assert asyncio.run(run()) == (100, 10, 1, 90)


def test_taking_room_never_waits_nor_refuses_and_giving_back_is_bounded() -> None:
    """Background work and rows already decoded take what room there is now, up to a cap
    (``Lease.take_room``: compaction's fold, a restore's rows beyond its claims), and a
    claim trued up gives back at most what the lease holds (``Lease.give``)."""

    async def run() -> list[int]:
        budget = MemoryBudget(100, wait=30.0, max_body=10)
        other = Lease(budget)
        await other.take(70, "a")
        work = Lease(budget)
        await asyncio.wait_for(work.take_room(50, "a fold"), 1.0)  # 30 of room: 30 taken
        seen = [work.held, budget.used]
        await other.close()
        await work.take_room(50, "a fold", most=40)  # room now, but at most 40 held in all
        seen += [work.held]
        await work.give(25)
        await work.give(100)  # no more than it holds
        seen += [work.held, budget.used]
        await work.close()
        await work.take_room(10, "left behind")  # its request ended: nothing
        return [*seen, budget.used]

    assert asyncio.run(run()) == [30, 100, 40, 0, 0, 0]


def test_a_take_that_waited_past_its_requests_end_gives_its_room_back() -> None:
    """A take waiting for room in a task that outlives its request: once the room comes,
    the request has ended and closed its lease, so nothing would ever give it back. It is
    given back at once and the take refused (a review's remark, latent on the builds
    before: every take that waits runs in its request's own task today)."""

    async def run() -> int:
        budget = MemoryBudget(100, wait=30.0, max_body=10)
        other = Lease(budget)
        await other.take(90, "a")
        late = Lease(budget)
        waiting = asyncio.create_task(late.take(50, "a task left behind"))
        await asyncio.sleep(0.01)
        await late.close()  # its request ends while the take waits
        await other.close()  # room comes
        with pytest.raises(RateLimited):
            await asyncio.wait_for(waiting, 1.0)
        return budget.used

    assert asyncio.run(run()) == 0


def test_a_negative_take_is_refused_and_changes_nothing() -> None:
    """A negative amount (a peer's claim taken on trust) would give room nobody gave back:
    two takes near the whole budget would then both get in (hostile review 87)."""

    async def run() -> tuple[int, int]:
        budget = MemoryBudget(100, wait=0.1, max_body=10)
        lease = Lease(budget)
        with pytest.raises(ValueError, match="negative"):
            await lease.take(-(2**62), "a claim")
        with pytest.raises(ValueError, match="negative"):
            await budget.take(-1, "a claim")
        return budget.used, lease.held

    assert asyncio.run(run()) == (0, 0)
