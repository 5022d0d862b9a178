"""The layers hold: imports point down only, the core and the wire formats do no I/O, the
client never reaches into the node, and each package's public surface is what __all__ says.

Every import counts: top-level, function-local and under ``TYPE_CHECKING`` (a cycle hidden
behind a lazy import is still a cycle).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("statestore", "client", "spark_connector")

# What each layer may import from this project (besides itself).
ALLOWED: dict[str, set[str]] = {
    "statestore.core": set(),
    "statestore.wire": {"statestore.core"},
    "statestore.net": {"statestore.core", "statestore.wire"},
    "client": {"statestore.core", "statestore.wire", "statestore.net", "statestore"},
    "statestore.node": {"statestore.core", "statestore.wire", "statestore.net"},
    "statestore.cli": {
        "statestore.core",
        "statestore.wire",
        "statestore.net",
        "statestore.node",
        "client",
        "spark_connector",
    },
    # the simulator and the real-process partition harness, on top: they run the node in
    # process and drive node processes through cli/local.py; nothing below imports them
    "statestore.testing": {
        "statestore.core",
        "statestore.wire",
        "statestore.net",
        "statestore.node",
        "statestore.cli",
        "client",
    },
    "spark_connector": {"statestore.core", "client"},
}
# Modules of the standard library and third parties that mean I/O, a clock or randomness.
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
    "concurrent",
    "selectors",
    "ssl",
    "shutil",
    "tempfile",
}


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, resolved to absolute names, wherever the import sits."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import module` imports that module (a parent package is imported
            # implicitly by any submodule import, which is not counted anywhere)
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
            out |= set(subs) if subs and len(subs) == len(node.names) else {mod, *subs}
    return out


def _layer(name: str) -> str:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if name == layer or name.startswith(layer + "."):
            return layer
    return name  # statestore/__init__, __main__


def _ours(mod: str) -> str | None:
    while mod and mod not in MODULES:
        mod = mod.rpartition(".")[0]
    return mod or None


GRAPH = {
    name: {m for m in (_ours(i) for i in _imports(name, path)) if m and m != name}
    for name, path in MODULES.items()
}


def test_there_are_layers_to_check() -> None:
    for layer in ("statestore.core", "statestore.wire", "statestore.net", "statestore.node"):
        assert any(_layer(m) == layer for m in MODULES), f"no module in {layer}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name: str) -> None:
    layer = _layer(name)
    if layer not in ALLOWED:
        return
    for dep in GRAPH[name]:
        dep_layer = _layer(dep)
        if dep_layer == layer or dep == "statestore":
            continue
        assert dep_layer in ALLOWED[layer], f"{name} ({layer}) imports {dep} ({dep_layer})"


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize(
    "name", sorted(m for m in MODULES if _layer(m) in ("statestore.core", "statestore.wire"))
)
def test_core_and_wire_do_no_io(name: str) -> None:
    top = {i.split(".")[0] for i in _imports(name, MODULES[name])}
    assert not top & IO, f"{name} imports {top & IO}"


def test_the_checker_sees_function_local_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from statestore.node.daemon import Node\n"
        "def f():\n    import asyncio\n    from . import ids\n"
    )
    found = _imports("statestore.core.m", src)
    assert {"statestore.node.daemon", "asyncio", "statestore.core.ids"} <= found


def test_import_client_loads_no_server_or_node_module() -> None:
    code = (
        "import sys, client\n"
        "bad = sorted(m for m in sys.modules if m.startswith(("
        "'aiohttp.web', 'lmdb', 'kademlia', 'rich', 'statestore.node', 'statestore.cli')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "", f"import client loaded: {out.stdout.strip()}"


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


def test_every_error_class_is_in_the_one_tree() -> None:
    import client
    from statestore.core import errors

    tree = errors._tree(errors.StateStoreError)
    assert {c.__name__ for c in tree} == {
        n for n in errors.__all__ if isinstance(getattr(errors, n), type)
    }
    assert len({c.code for c in tree}) == len(tree), "two error classes share a code"
    for name in client.__all__:
        obj = getattr(client, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert obj in tree, f"client.{name} is outside the error tree"


def test_the_base_install_is_the_client() -> None:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"])
    for node_only in ("lmdb", "kademlia"):
        assert node_only not in base, f"{node_only} is a node dependency, not the client's"
        assert any(node_only in d for d in meta["optional-dependencies"]["node"])


def test_the_cli_client_commands_work_without_node_packages() -> None:
    # lmdb, kademlia and the node layer made unimportable: `statestore ring` must still run
    # (and say that no seed answered) on a client-only install.
    code = (
        "import sys\n"
        "for m in ('lmdb', 'kademlia', 'statestore.node.daemon', 'statestore.node.api'):\n"
        "    sys.modules[m] = None\n"
        "from statestore.cli.main import main\n"
        "sys.exit(main(['ring', '--seeds', '127.0.0.1:1']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1, out.stderr
    assert "no seed answered" in out.stderr
