"""Tests lean on the kit, not on each other: no test module imports another test module
(shared helpers live in tests/ringkit.py, tests/corekit.py, tests/javakit.py, tests/certs.py,
tests/spark/runs.py), so that moving or deleting a test file breaks nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (top level and function-local), relative ones resolved
    against its package under tests/."""
    package = ["tests", *path.parent.relative_to(TESTS).parts]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out |= {f"{module}.{alias.name}" for alias in node.names}
    return out


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for module in _imported(path):
            if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_"):
                found.append(f"{path.relative_to(TESTS.parent)} imports {module}")
    assert not found, "test modules importing test modules (use the kit):\n" + "\n".join(found)
