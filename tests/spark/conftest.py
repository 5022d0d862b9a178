"""Fixtures of the Spark tests."""

from __future__ import annotations

import pytest

from .harness import compile_harness


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The provider harness (tests/spark/java) compiled against the provider jar."""
    return compile_harness(tmp_path_factory.mktemp("harness"))
