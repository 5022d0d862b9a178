"""A floor a node refused while it lagged (Node.lagging_floors) is asked again once repair
brought its head there (node/repair._caught_up): the heads and floors are read in a thread,
the entries changed on the event loop, and an entry a refusal lowered meanwhile is kept."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import cast

from statestore.core.ids import StoreId
from statestore.core.manifest import Head
from statestore.node import repair
from statestore.node.daemon import Node

A, B, C, D = ("q/0/0/default", "q/0/1/default", "q/0/2/default", "q/0/3/default")


class _Storage:
    """Heads and floors by store path; records which thread read them."""

    def __init__(self, heads: dict[str, int | None], floors: dict[str, int]) -> None:
        self.heads = heads
        self.floors = floors
        self.threads: set[int] = set()

    def head(self, store: StoreId) -> Head | None:
        self.threads.add(threading.get_ident())
        v = self.heads.get(store.path)
        return None if v is None else Head(v, 1)

    def floor(self, store: StoreId) -> int:
        self.threads.add(threading.get_ident())
        return self.floors.get(store.path, 0)


def _node(storage: _Storage, lagging: dict[str, int]) -> Node:
    return cast(Node, SimpleNamespace(store=storage, lagging_floors=lagging))


async def test_a_store_that_reached_its_refused_floor_asks_again_and_the_others_settle() -> None:
    storage = _Storage(
        heads={A: 12, B: 9, C: None, D: 20},  # A reached 12; B still lags; C is gone from here
        floors={D: 15},  # D's floor rose past what it refused
    )
    lagging = {A: 12, B: 12, C: 12, D: 12}
    node = _node(storage, lagging)
    assert await repair._caught_up(node) is True
    assert lagging == {B: 12}  # A asked again, C and D forgotten, B kept
    assert threading.get_ident() not in storage.threads  # not read on the event loop
    assert await repair._caught_up(node) is False  # B still lags: nothing to ask
    assert lagging == {B: 12}


async def test_an_entry_a_refusal_lowered_while_it_was_read_is_kept() -> None:
    storage = _Storage(heads={A: 12}, floors={})
    lagging = {A: 12}
    node = _node(storage, lagging)
    real = storage.head

    def head(store: StoreId) -> Head | None:
        lagging[A] = 8  # a refusal of a lower floor, on the loop, while the thread reads
        return real(store)

    storage.head = head  # type: ignore[method-assign]
    assert await repair._caught_up(node) is False
    assert lagging == {A: 8}  # the next tick reads it again


async def test_no_lagging_store_reads_nothing() -> None:
    storage = _Storage(heads={}, floors={})
    node = _node(storage, {})
    assert await repair._caught_up(node) is False
    assert storage.threads == set()
