from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from statestore.cli.local import LocalRing
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node

FAST = ["--gossip-interval", "0.2", "--suspect-after", "1", "--down-after", "2.5"]


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
    ring = LocalRing(str(tmp_path), 3, args=FAST).start()
    yield ring
    ring.stop()
