"""docker/: the image's ENTRYPOINT/CMD and every compose service's command parse with the CLI.

No Docker engine runs in CI, so nothing is built here; the files are read as text (the compose
file with PyYAML, so it may use any YAML a compose file may).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from statestore.cli.main import build_parser

DOCKER = Path(__file__).resolve().parent.parent / "docker"


# -- readers ------------------------------------------------------------------------------
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, args = line.partition(" ")
        out.append((word.upper(), args.strip()))
    assert not pending, "Dockerfile ends in a line continuation"
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), args
    return value


def parse_cli(argv: list[str]) -> Any:
    """The real ``statestore`` parser; an argparse exit becomes a test failure with the argv."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"statestore {shlex.join(argv)} does not parse (exit {exc.code})")


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dockerfile() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for word, args in dockerfile_instructions((DOCKER / "Dockerfile").read_text()):
        found.setdefault(word, []).append(args)
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc


@pytest.fixture(scope="module")
def entrypoint(dockerfile: dict[str, list[str]]) -> list[str]:
    (ep,) = dockerfile["ENTRYPOINT"]
    return exec_form(ep)


def node_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if "entrypoint" not in s}


# -- the image ----------------------------------------------------------------------------
def test_dockerfile_entrypoint_and_cmd_parse(dockerfile: dict[str, list[str]]) -> None:
    assert dockerfile["FROM"] == ["python:3.11-slim"]
    (ep,) = dockerfile["ENTRYPOINT"]
    (cmd,) = dockerfile["CMD"]
    entry, args = exec_form(ep), exec_form(cmd)
    assert entry[0] == "statestore"
    ns = parse_cli(entry[1:] + args)
    assert ns.command == "node"
    assert ns.listen == ("0.0.0.0", 7400)
    assert ns.data_dir == "/data"


def test_dockerfile_exposes_http_and_dht_and_keeps_data_on_a_volume(
    dockerfile: dict[str, list[str]],
) -> None:
    exposed = {p for line in dockerfile["EXPOSE"] for p in line.split()}
    assert {"7400/tcp", "7400/udp"} <= exposed
    assert any("/data" in exec_form(v) for v in dockerfile["VOLUME"])
    assert any("pip install '.[node]'" in r for r in dockerfile["RUN"])
    assert dockerfile.get("USER") not in (None, ["root"]), "the node should not run as root"


# -- the compose ring -----------------------------------------------------------------------
def test_compose_has_three_nodes_built_from_the_dockerfile(compose: dict[str, Any]) -> None:
    nodes = node_services(compose)
    assert sorted(nodes) == ["node1", "node2", "node3"]
    for name, svc in compose["services"].items():
        assert svc["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
        assert svc["image"] == "statestore:dev", name
    for name, svc in nodes.items():
        assert svc["hostname"] == name
        assert svc["volumes"] == [f"{name}-data:/data"]
        assert f"{name}-data" in compose["volumes"]


def test_compose_commands_parse_with_the_cli(
    compose: dict[str, Any], entrypoint: list[str]
) -> None:
    for name, svc in compose["services"].items():
        entry = svc.get("entrypoint", entrypoint)
        assert entry[0] == "statestore", name
        ns = parse_cli(entry[1:] + svc["command"])
        if name == "ring":
            assert ns.command == "ring"
            assert {s.split(":")[0] for s in ns.seeds} <= set(compose["services"])
            continue
        assert ns.command == "node"
        assert ns.listen == ("0.0.0.0", 7400)
        assert tuple(ns.advertise) == (name, 7400), "peers must reach the node by its name"
        assert ns.data_dir == "/data"
        if name == "node1":
            assert ns.seeds == []
        else:
            assert ns.seeds == ["node1:7400"]
            assert svc["depends_on"] == {"node1": {"condition": "service_healthy"}}
