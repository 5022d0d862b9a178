"""Errors a newcomer meets and JSON logs (docs/operations.md, Logs), each tried as a new user
would: the real ``statestore`` command in a process of its own, its exit code and what it
prints."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from statestore.cli.local import NodeProcess, clean_node_env

pytestmark = pytest.mark.timeout(180)

# the checkout (found upwards: the file may move between test folders)
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
ADMIN, READER = "admin-token-0123456789", "reader-token-0123456789"


def env(**extra: str) -> dict[str, str]:
    out = clean_node_env(os.environ)
    for var in ("STATESTORE_TOKEN", "STATESTORE_TOKEN_FILE", "STATESTORE_TLS_CA"):
        out.pop(var, None)
    out["COLUMNS"] = "400"  # rich tables unwrapped
    return out | extra


def statestore(
    args: Sequence[str], *, timeout: float = 60.0, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ or env(),
        cwd=ROOT,
    )


def closed_port() -> int:
    """A TCP port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_free(port: int) -> bool:
    """Whether loopback TCP ``port`` can be bound now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def run_node_for(
    args: Sequence[str],
    until: str,
    count: int,
    limit: float,
    environ: dict[str, str],
    printed: str = "",
) -> tuple[str, str]:
    """Start ``statestore node args``, stop it once its stderr holds ``until`` ``count``
    times and its stdout holds ``printed`` (or after ``limit`` seconds); its stdout and
    stderr."""
    with tempfile.TemporaryDirectory() as d:
        out_path, err_path = Path(d) / "out", Path(d) / "err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "statestore", "node", *args],
                stdout=out,
                stderr=err,
                env=environ,
                cwd=ROOT,
            )
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and proc.poll() is None:
            if err_path.read_text(errors="replace").count(until) >= count and (
                printed in out_path.read_text(errors="replace")
            ):
                break
            time.sleep(0.2)
        proc.terminate()
        proc.wait(timeout=30)
        return out_path.read_text(), err_path.read_text(errors="replace")


# -- 1. seeds that never answer ---------------------------------------------------------------
def test_unanswered_seeds_are_reported_again_and_again_without_a_traceback(
    tmp_path: Path,
) -> None:
    seed = f"127.0.0.1:{closed_port()}"
    out, err = run_node_for(
        # DEBUG: not even the most verbose level shows a traceback for it
        [
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "d"),
            "--seeds",
            seed,
            "--down-after",
            "1",
            "--log-level",
            "DEBUG",
        ],
        until="has heard from none of its seeds",
        count=2,  # after --down-after (1 s), then every six times that
        limit=40.0,
        environ=env(),
    )
    assert " listening on " in out.splitlines()[0]
    warnings = [line for line in err.splitlines() if "has heard from none of its seeds" in line]
    assert len(warnings) >= 2, err
    assert seed in warnings[0] and "--seeds" in warnings[0] and "Connect" in warnings[0]
    assert "Traceback" not in err
    assert "There are no known neighbors" not in err  # the kademlia package's noise, gone


# -- 2. the files the node reads name themselves ----------------------------------------------
@pytest.mark.parametrize("flag", ["--cluster-secret-file", "--auth-file", "--quota-file"])
def test_an_unreadable_file_is_named_with_its_flag(tmp_path: Path, flag: str) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTIzNDU2Cg==\n")
    missing = tmp_path / "missing.json"
    args = ["node", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")]
    if flag == "--auth-file":
        args += ["--cluster-secret-file", str(secret)]
    done = statestore([*args, flag, str(missing)])
    assert done.returncode == 2, done
    assert f"{flag} {missing}" in done.stderr, done.stderr
    assert "--data-dir" not in done.stderr and "Traceback" not in done.stderr


# -- 3. statestore local on busy ports --------------------------------------------------------
def test_local_on_a_busy_port_names_base_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = int(busy.getsockname()[1])
        done = statestore(
            ["local", "--nodes", "2", "--base-port", str(port - 1), "--data-dir", str(tmp_path)]
        )
    assert done.returncode == 1, done
    assert "--base-port" in done.stderr and str(port) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1  # one line


# -- 4, 6 and the SDK's STATESTORE_TOKEN_FILE: a node with tokens -----------------------------
@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One node (R=W=1) with a cluster secret and tokens: an admin's and a reader's."""
    d = tmp_path_factory.mktemp("secured")
    (d / "cluster.secret").write_text("c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTIzNDU2Cg==\n")
    tokens = {
        ADMIN: {"queries": ["*"], "rights": ["read", "write", "admin"]},
        READER: {"queries": ["*"], "rights": ["read"]},
    }
    (d / "tokens.json").write_text(json.dumps(tokens))
    (d / "admin.token").write_text(ADMIN + "\n")
    node = NodeProcess(
        str(d / "node"),
        0,
        [
            "--replicas",
            "1",
            "--write-quorum",
            "1",
            "--no-dht",
            "--cluster-secret-file",
            str(d / "cluster.secret"),
            "--auth-file",
            str(d / "tokens.json"),
        ],
    )
    node.start([])
    try:
        yield node.address, d
    finally:
        node.stop()


def test_stores_ls_without_the_right_exits_non_zero(secured: tuple[str, Path]) -> None:
    address, _ = secured
    bare = statestore(["stores", "ls", "--seeds", address])
    assert bare.returncode == 1, bare
    assert "bearer token" in bare.stderr and "check --seeds" not in bare.stderr, bare.stderr
    reader = statestore(["stores", "ls", "--seeds", address], environ=env(STATESTORE_TOKEN=READER))
    assert reader.returncode == 1, reader
    assert "'admin'" in reader.stderr, reader.stderr
    admin = statestore(
        ["stores", "ls", "--seeds", address, "--json"], environ=env(STATESTORE_TOKEN=ADMIN)
    )
    assert admin.returncode == 0, admin


def test_sdk_token_file_and_the_restore_summary_gives_autos_reason(
    secured: tuple[str, Path],
) -> None:
    address, d = secured
    # the SDK reads STATESTORE_TOKEN_FILE, as the CLI does (docs/client.md)
    commit = textwrap.dedent(
        f"""
        from client import RingClient, StoreId
        with RingClient([{address!r}]) as ring:
            sid = StoreId("newcomer", 0, 0, "default")
            for v in range(1, 4):
                ring.commit(sid, v, {{b"k%d" % v: b"v" * 1000}}, [], {{}}, epoch=1)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", commit],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(STATESTORE_TOKEN_FILE=str(d / "admin.token")),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    restore = statestore(
        ["restore", "--seeds", address, "--store", "newcomer/0/0/default"],
        environ=env(STATESTORE_TOKEN_FILE=str(d / "admin.token")),
    )
    assert restore.returncode == 0, restore
    plan = next(line for line in restore.stderr.splitlines() if " plan " in line)
    assert "auto: predicted" in plan and "asked for" not in plan, restore.stderr


# -- 5. a client-only install ------------------------------------------------------------------
BLOCK = """
import sys

class NoNodeExtra:  # an install without '.[node]': lmdb and kademlia cannot be imported
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("lmdb", "kademlia"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoNodeExtra())
"""


@pytest.mark.parametrize("command", ["node", "local"])
def test_a_client_only_install_says_to_install_the_node_extra(tmp_path: Path, command: str) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    args = ["--listen", "127.0.0.1:0"] if command == "node" else ["--base-port", "0"]
    done = statestore(
        [command, *args, "--data-dir", str(tmp_path / "d")],
        environ=env(PYTHONPATH=str(tmp_path)),
    )
    assert done.returncode == 1, done
    assert "pip install '.[node]'" in done.stderr and "lmdb" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# -- 7. the DHT's UDP port: the real one is printed and a taken one is said -------------------
def test_a_taken_udp_port_is_said_and_the_real_one_printed(tmp_path: Path) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        while True:  # a port free on TCP whose UDP number is taken
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            if tcp_free(port):  # another test's node may listen on that TCP number
                break
            udp.close()  # a race: closed here, the next one in `finally`
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        out, err = run_node_for(
            ["--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d")],
            until="instead",
            count=1,
            limit=30.0,
            environ=env(),
            printed="(dht udp ",  # stderr says "instead" before stdout's line is written
        )
    finally:
        udp.close()
    assert out, f"the node printed nothing; its stderr: {err[-3000:]}"
    first = out.splitlines()[0]
    dht = int(first.split("(dht udp ")[1].split(")")[0].split(",")[0])
    assert dht != port, first
    assert f"UDP port {port} is taken" in err and f"UDP {dht} instead" in err, err


# -- 8. JSON logs -----------------------------------------------------------------------------
def test_json_logs_one_object_per_line_on_stderr(tmp_path: Path) -> None:
    seed = f"127.0.0.1:{closed_port()}"
    out, err = run_node_for(
        [
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "d"),
            "--seeds",
            seed,
            "--down-after",
            "1",
            "--log-format",
            "json",
            "--log-level",
            "INFO",
        ],
        until="has heard from none of its seeds",
        count=1,
        limit=30.0,
        environ=env(),
    )
    assert out.splitlines()[0].startswith("statestore node ")  # stdout: lifecycle lines
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    warned = [r for r in records if "has heard from none" in r["message"]]
    assert warned and warned[0]["level"] == "WARNING"
    assert warned[0]["logger"] == "statestore.node.daemon"
    # a record with a traceback carries it as one string, still one line
    script = (
        "import logging; from statestore.node.logs import setup_logging\n"
        "setup_logging('INFO', 'json')\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.getLogger('x').exception('boom')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert record["message"] == "boom" and "ZeroDivisionError" in record["exc_info"]


def test_log_format_is_a_setting_with_a_named_bad_value(tmp_path: Path) -> None:
    done = statestore(
        ["node", "--data-dir", str(tmp_path)], environ=env(STATESTORE_LOG_FORMAT="xml")
    )
    assert done.returncode == 2 and "STATESTORE_LOG_FORMAT" in done.stderr, done
