"""Fixtures every tier can use (the vocabulary itself is tests/ringkit.py), and the order
in which the tiers run.

The tiers are folders, by what their tests start: ``unit`` (no process, no socket),
``ring`` (real nodes: in-process servers on port 0 or node processes), ``spark`` (Spark
jobs on a ring), ``partition`` (real network partitions, root only)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from statestore.cli.local import LocalRing
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node
from tests.ringkit import local_ring

# ``./run test`` hands files to its two workers in collection order (xdist's loadfile
# scheduling without reordering): the longest files first, the short unit files last, so
# that neither worker is left with one long file at the end. A test file elsewhere under
# tests/ runs after ring, before unit.
TIER_ORDER = ("partition", "spark", "ring")
TIER_LAST = ("unit",)


def _tier_rank(item: pytest.Item) -> int:
    parts = Path(item.path).relative_to(Path(__file__).parent).parts
    tier = parts[0] if len(parts) > 1 else ""
    if tier in TIER_ORDER:
        return TIER_ORDER.index(tier)
    return len(TIER_ORDER) + 1 if tier in TIER_LAST else len(TIER_ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_tier_rank)  # stable: each file's tests stay together and in order


@pytest.fixture
async def solo(tmp_path: Path) -> AsyncIterator[Node]:
    """One in-process node on port 0 with in-memory storage, R=W=1, no DHT."""
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "solo"),
        storage="memory://",
        replicas=1,
        write_quorum=1,
        dht=False,
        max_body=1024 * 1024,
        max_chunk=4 * 1024 * 1024,
    )
    node, runner = await start_node(config)
    yield node
    await stop_node(node, runner)


@pytest.fixture
def ring3(tmp_path: Path) -> Iterator[LocalRing]:
    """Three node processes (LocalRing, FAST timers)."""
    with local_ring(tmp_path, 3) as ring:
        yield ring
