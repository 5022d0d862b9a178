"""Fixtures of the Spark tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore.cli.local import LocalRing
from tests.ringkit import FAST

from .harness import compile_harness


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The provider harness (tests/spark/java) compiled against the provider jar."""
    return compile_harness(tmp_path_factory.mktemp("harness"))


@pytest.fixture
def ring1(tmp_path: Path) -> Iterator[LocalRing]:
    """One node process, one copy of each chunk (the tests of the JVM's heap and of lazy
    restores)."""
    ring = LocalRing(str(tmp_path / "ring"), 1, args=[*FAST, "--replicas", "1"]).start()
    try:
        yield ring
    finally:
        ring.stop()
