"""The operator commands' one HTTP helper (statestore/cli/http.py) against a real node on port
0: each refusal raises the error tree's class the node named, no answer is NodeUnavailable or
RequestTimeout; and a command whose seeds do not answer ends with one line, no traceback."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore.cli.http import first_view, request_json
from statestore.cli.main import main
from statestore.core.errors import (
    AccessDenied,
    Forbidden,
    MalformedData,
    NodeUnavailable,
    NotFound,
    QueryDropping,
    RequestTimeout,
    SetupError,
    StateStoreError,
    Unauthenticated,
)
from statestore.node.daemon import Node, NodeConfig
from statestore.node.server import start_node, stop_node
from statestore.node.tombstones import DROPPING

ADMIN = "admin-token-0000000001"
READER = "etl-reader-token-0001"
TOKENS = {
    ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
    READER: {"queries": ["etl-*"], "rights": ["read"]},
}


@pytest.fixture(autouse=True)
def no_token_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STATESTORE_TOKEN", "STATESTORE_TOKEN_FILE", "STATESTORE_TLS_CA"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[tuple[Node, Any]]:
    """One node with client tokens (and the cluster secret tokens need), and its app."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    config = NodeConfig(
        port=0,
        data_dir=str(tmp_path / "node"),
        storage="memory://",
        dht=False,
        replicas=1,
        write_quorum=1,
        auth_file=str(tokens),
        cluster_secret_file=str(secret),
    )
    node, runner = await start_node(config)
    yield node, runner.app
    await stop_node(node, runner)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A loopback address that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


async def ask(address: str, path: str, body: object = None, **kw: Any) -> Any:
    # the helper blocks: off the loop that serves the node
    return await asyncio.to_thread(request_json, address, path, body, **kw)


async def test_an_answer_is_decoded(
    guarded: tuple[Node, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _ = guarded
    health = await ask(node.address, "/v1/health")  # open, no token
    assert health["status"] in ("ok", "degraded")
    view = await ask(node.address, "/v1/ring", token=ADMIN)
    assert [m["id"] for m in view["members"]] == [node.id]
    monkeypatch.setenv("STATESTORE_TOKEN", ADMIN)  # as the operator commands take it
    seed, seen = await asyncio.to_thread(first_view, ["127.0.0.1:9", node.address], None)
    assert seed == node.address and seen["epoch"] == view["epoch"]


@pytest.mark.parametrize(
    ("method", "path", "token", "raised", "status"),
    [
        ("GET", "/v1/stores/etl-a/0/0/default/head", READER, NotFound, 404),
        ("GET", "/v1/stores/q1/0/0/default/head", READER, Forbidden, 403),
        ("POST", "/v1/queries/etl-a/drop", READER, Forbidden, 403),
        ("GET", "/v1/ring", "", Unauthenticated, 401),
        ("POST", "/v1/stores/q-dropping/0/0/default/commit?version=1&epoch=1", ADMIN,
         QueryDropping, 409),
    ],
)  # fmt: skip
async def test_a_refusal_raises_the_class_the_node_named(
    guarded: tuple[Node, Any],
    method: str,
    path: str,
    token: str,
    raised: type[StateStoreError],
    status: int,
) -> None:
    node, app = guarded
    app[DROPPING].queries.add("q-dropping")  # a drop between its purge and its seal
    body = {} if method == "POST" else None
    with pytest.raises(raised) as caught:
        await ask(node.address, path, body, token=token or None)
    assert caught.value.status == status
    assert f"(from {node.address})" in str(caught.value)  # the node's message, and who said it
    if raised is Forbidden:
        assert isinstance(caught.value, AccessDenied)


async def test_an_answer_that_is_not_json_is_malformed_data(guarded: tuple[Node, Any]) -> None:
    node, _ = guarded
    with pytest.raises(MalformedData, match="not JSON"):
        await ask(node.address, "/dashboard")


def test_an_unreachable_node_is_node_unavailable(closed_port: int) -> None:
    with pytest.raises(NodeUnavailable, match=f"127.0.0.1:{closed_port} is unreachable"):
        request_json(f"127.0.0.1:{closed_port}", "/v1/ring", timeout=2.0)
    with pytest.raises(NodeUnavailable, match="no seed answered"):
        first_view([f"127.0.0.1:{closed_port}"])


def test_a_node_that_does_not_answer_in_time_is_a_timeout(silent_address: str) -> None:
    with pytest.raises(RequestTimeout, match=r"did not answer /v1/ring within 0\.3s"):
        request_json(silent_address, "/v1/ring", timeout=0.3)


def test_a_ca_file_it_cannot_use_is_a_setup_error(tmp_path: Path, closed_port: int) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(SetupError, match="cannot use TLS CA file"):
        request_json(f"127.0.0.1:{closed_port}", "/v1/ring", tls_ca=str(bad))


@pytest.mark.parametrize(
    "command",
    [
        ["ring"],
        ["ring", "--json"],
        ["decommission", "--node", "n1", "--timeout", "5"],
        ["removenode", "--node", "n1", "--timeout", "5"],
        ["rebalance", "--dry-run"],
        ["stores", "ls"],
        ["inspect", "--store", "q1/0/0/default"],
        ["drop", "--query", "q1", "--yes"],
    ],
)
def test_a_command_whose_seeds_do_not_answer_says_so_in_one_line(
    command: list[str], closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # `stores ls` is `stores` + `ls`: the seeds go after the subcommand either way
    code = main([*command, "--seeds", f"127.0.0.1:{closed_port}"])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"statestore {command[0]}: "), err
    assert "no seed answered" in err and f"127.0.0.1:{closed_port}" in err
    assert "Traceback" not in err


def test_the_command_line_exits_non_zero_without_a_traceback(
    closed_port: int, tmp_path: Path
) -> None:
    for command in (
        ["ring"],
        ["backup", "--query", "q1", "--out", str(tmp_path / "b")],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "statestore", *command, "--seeds", f"127.0.0.1:{closed_port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "no seed answered" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())  # the failed backup kept nothing
