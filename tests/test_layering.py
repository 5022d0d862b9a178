"""The pure core imports no I/O; each package's public surface is what __all__ says."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = [
    "ids",
    "errors",
    "placement",
    "chunk",
    "manifest",
    "quorum",
    "membership",
    "view",
    "rows",
    "plan",
    "frames",
    "bucket",
    "cache",
    "commit",
]
IO = {
    "asyncio",
    "socket",
    "aiohttp",
    "time",
    "threading",
    "subprocess",
    "lmdb",
    "kademlia",
    "urllib",
    "os",
    "requests",
    "random",
}


@pytest.mark.parametrize("module", PURE)
def test_pure_core_imports_no_io(module: str) -> None:
    tree = ast.parse((ROOT / "statestore" / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            assert node.module in PURE, f"{module} imports non-core .{node.module}"
    assert not imported & IO, f"{module} imports {imported & IO}"


@pytest.mark.parametrize("package", ["statestore", "client"])
def test_public_surface(package: str) -> None:
    mod = importlib.import_module(package)
    assert sorted(mod.__all__) == sorted(set(mod.__all__))
    for name in mod.__all__:
        assert hasattr(mod, name), f"{package}.{name} is in __all__ but missing"


def test_client_contract_names() -> None:
    import client

    for name in ("RingClient", "AsyncRingClient", "StoreId", "StateStoreError", "StaleEpoch"):
        assert name in client.__all__


def test_client_does_not_reach_into_the_node() -> None:
    for path in (ROOT / "client").glob("*.py"):
        text = path.read_text()
        for shell in (
            "statestore.node",
            "statestore.api",
            "statestore.storage",
            "statestore.server",
        ):
            assert shell not in text, f"{path.name} imports {shell}"
