"""docker/: the image's ENTRYPOINT/CMD and every compose service's command parse with the CLI.

No Docker engine runs in CI, so nothing is built here; the files are read as text. The compose
file is kept to a small YAML subset (see its header) read by ``read_yaml`` below, which fails
loudly on anything outside that subset rather than misreading it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from statestore.cli.main import build_parser

DOCKER = Path(__file__).resolve().parent.parent / "docker"


# -- readers ------------------------------------------------------------------------------
def _scalar(text: str) -> Any:
    text = text.strip()
    if text.startswith(("[", '"')):
        return json.loads(text)  # flow lists and quoted strings are written in JSON form
    if text.startswith(("&", "*", "{", "'", "|", ">")) or " #" in text:
        raise ValueError(f"outside the YAML subset: {text!r}")
    return text


def read_yaml(text: str) -> Any:
    """Block mappings, block lists of scalars, JSON-form flow lists and scalars; no anchors."""
    lines = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError(f"tab indentation: {raw!r}")
        lines.append((len(raw) - len(raw.lstrip(" ")), stripped))

    def block(i: int, indent: int) -> tuple[Any, int]:
        if lines[i][1].startswith("- "):
            items = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                items.append(_scalar(lines[i][1][2:]))
                i += 1
            return items, i
        mapping: dict[str, Any] = {}
        while i < len(lines) and lines[i][0] == indent:
            key, sep, rest = lines[i][1].partition(":")
            if not sep or (rest and not rest.startswith(" ")):
                raise ValueError(f"not a 'key: value' line: {lines[i][1]!r}")
            if key in mapping:
                raise ValueError(f"duplicate key {key!r}")
            i += 1
            if rest.strip():
                mapping[key] = _scalar(rest)
            elif i < len(lines) and lines[i][0] > indent:
                mapping[key], i = block(i, lines[i][0])
            else:
                mapping[key] = None
        if i < len(lines) and lines[i][0] > indent:
            raise ValueError(f"bad indentation at {lines[i][1]!r}")
        return mapping, i

    value, end = block(0, lines[0][0])
    assert end == len(lines)
    return value


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
    doc = read_yaml((DOCKER / "docker-compose.yml").read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc


@pytest.fixture(scope="module")
def entrypoint(dockerfile: dict[str, list[str]]) -> list[str]:
    (ep,) = dockerfile["ENTRYPOINT"]
    return exec_form(ep)


def node_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if "entrypoint" not in s}


# -- the image ----------------------------------------------------------------------------
def test_reader_refuses_what_it_does_not_understand() -> None:
    assert read_yaml('a:\n  b: ["x", "y"]\n  c:\n    - "d"\n') == {
        "a": {"b": ["x", "y"], "c": ["d"]}
    }
    for bad in ("a: &x 1\n", "a: 'q'\n", "a: b # c\n", "a:\n    b: 1\n  c: 2\n"):
        with pytest.raises(ValueError):
            read_yaml(bad)


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
