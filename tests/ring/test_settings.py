"""Node settings written once (docs/operations.md, Configuration): one table
(statestore/node/settings.py) makes the ``statestore node`` flags, the TOML config file's keys and
the ``STATESTORE_*`` variables; precedence flag > environment > file > default; a bad value names
the setting and its source; the CLI reference in the docs is generated from the parser.

Every test here fails on the code before the table: ``statestore.node.settings``,
``statestore.cli.reference``, ``--config``, the variables and docs/cli.md did not exist.
Unit tests (no process) but for one node started from a config file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from statestore.cli.local import clean_node_env, http_json
from statestore.cli.main import build_parser, main
from statestore.cli.reference import REGENERATE, check
from statestore.node.config import NodeConfig
from statestore.node.settings import (
    INTERNAL_FIELDS,
    NOT_SETTINGS,
    SETTINGS,
    Resolved,
    SettingError,
    env_name,
    node_env_names,
    resolve,
)

ROOT = Path(__file__).resolve().parents[2]


def settings(argv: list[str], env: dict[str, str] | None = None) -> Resolved:
    return resolve(build_parser().parse_args(["node", *argv]), env or {})


def toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return str(path)


# -- the table ---------------------------------------------------------------------------------
def test_every_config_field_is_set_by_a_setting_or_declared_internal() -> None:
    from dataclasses import fields

    reachable = {f for s in SETTINGS for f in s.fields}
    every = {f.name for f in fields(NodeConfig)}
    assert reachable | set(INTERNAL_FIELDS) == every, every ^ (reachable | set(INTERNAL_FIELDS))
    assert not reachable & set(INTERNAL_FIELDS)
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)


def test_the_old_flags_and_defaults_still_give_the_same_config() -> None:
    """Every flag of the hand-written parser, with its old name, default and mapping
    (--listen -> host/port, --retain -> retain_versions, --no-dht -> dht, ...)."""
    assert settings(["--data-dir", "d"]).config == NodeConfig(data_dir="d")
    argv = [
        "--listen", "0.0.0.0:7411", "--data-dir", "d", "--seeds", "a:1,b:2",
        "--replicas", "5", "--write-quorum", "4", "--vnodes", "16", "--zone", "z",
        "--advertise", "h:7411", "--storage", "memory://", "--max-body", "1000",
        "--max-chunk", "2000", "--lookup-cache", "2500",
        "--max-commit", "3000", "--memory-budget", "4000",
        "--scrub-mbps", "0", "--scrub-interval", "7", "--hint-ttl", "9",
        "--reclaim-at", "0.25", "--reclaim-min", "5", "--min-free", "6", "--snapshot-every", "3",
        "--retain", "4", "--rebase-at", "2", "--thin-snapshots", "50",
        "--gossip-interval", "0.2",
        "--suspect-after", "1", "--down-after", "2.5", "--inject-delay", "0.1", "--no-dht",
        "--cluster-secret-file", "s", "--auth-file", "a", "--quota-file", "q",
        "--tls-cert", "c", "--tls-key", "k", "--tls-ca", "ca", "--join",
        "--stream-mbps", "5", "--switch-interval-ms", "2", "--no-gc-freeze",
        "--no-repair-digests", "--auto-rebalance", "1.5", "--rebalance-interval", "30",
        "--drain-on-stop", "--drain-timeout", "60", "--replace", "n1", "--log-level", "info",
        "--log-format", "json", "--chunk-format", "1",
    ]  # fmt: skip
    got = settings(argv)
    assert got.config == NodeConfig(
        host="0.0.0.0", port=7411, data_dir="d", seeds=["a:1", "b:2"], replicas=5,
        write_quorum=4, vnodes=16, zone="z", advertise="h:7411", storage="memory://",
        max_body=1000, max_chunk=2000, lookup_cache=2500,
        max_commit=3000, memory_budget=4000, scrub_mbps=0.0,
        scrub_interval=7.0, hint_ttl=9.0, reclaim_at=0.25, reclaim_min=5, min_free_bytes=6,
        snapshot_every=3,
        retain_versions=4, rebase_at=2.0, thin_snapshots=50,
        gossip_interval=0.2, suspect_after=1.0, down_after=2.5, inject_delay=0.1, dht=False,
        cluster_secret_file="s", auth_file="a", quota_file="q", tls_cert="c", tls_key="k",
        tls_ca="ca", join=True, stream_mbps=5.0, switch_interval_ms=2.0, gc_freeze=False,
        repair_digests=False, auto_rebalance=1.5, rebalance_interval=30.0,
        drain_on_stop=True, drain_timeout=60.0, replace="n1", chunk_format=1,
    )  # fmt: skip
    assert (got.log_level, got.log_format) == ("INFO", "json")
    assert set(got.sources.values()) - {"default"} == {f"--{s.name}" for s in SETTINGS}
    # the namespace keeps the attributes scripts and tests read (tests/ring/test_docker.py)
    ns = build_parser().parse_args(["node", "--data-dir", "d"])
    assert (ns.listen, ns.seeds, ns.advertise, ns.data_dir) == (("127.0.0.1", 7400), [], None, "d")


def test_write_quorum_defaults_to_a_majority_of_the_replicas_from_any_source() -> None:
    assert settings(["--data-dir", "d", "--replicas", "5"]).config.write_quorum == 3
    assert settings(["--data-dir", "d"], {"STATESTORE_REPLICAS": "1"}).config.write_quorum == 1


# -- precedence ---------------------------------------------------------------------------------
def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    path = toml(
        tmp_path,
        'data-dir = "from-file"\nreplicas = 2\nzone = "file"\nvnodes = 64\n'
        'seeds = ["f:1"]\ndown-after = 9\n',
    )
    env = {"STATESTORE_REPLICAS": "1", "STATESTORE_ZONE": "env", "STATESTORE_SEEDS": "e:1,e:2"}
    got = settings(["--config", path, "--zone", "flag"], env)
    c = got.config
    assert (c.data_dir, c.replicas, c.zone, c.vnodes, c.down_after) == (
        "from-file",
        1,
        "flag",
        64,
        9.0,
    )
    assert c.seeds == ["e:1", "e:2"] and c.suspect_after == 2.0  # env list; a default
    assert got.sources["zone"] == "--zone"
    assert got.sources["replicas"] == "STATESTORE_REPLICAS"
    assert got.sources["vnodes"] == f"{path}: vnodes"
    assert got.sources["suspect-after"] == "default"
    # STATESTORE_CONFIG names the file when --config does not; --config wins over it
    assert settings([], {"STATESTORE_CONFIG": path}).config.data_dir == "from-file"
    other = tmp_path / "other.toml"
    other.write_text('data-dir = "other"\n')
    assert (
        settings(["--config", str(other)], {"STATESTORE_CONFIG": path}).config.data_dir == "other"
    )


def test_booleans_in_all_three_sources(tmp_path: Path) -> None:
    base = ["--data-dir", "d"]
    assert settings(base).config.dht and settings(base).config.gc_freeze
    path = toml(tmp_path, "no-dht = true\njoin = true\ndrain-on-stop = true\ngc-freeze = false\n")
    c = settings([*base, "--config", path]).config
    assert (c.dht, c.join, c.drain_on_stop, c.gc_freeze) == (False, True, True, False)
    env = {"STATESTORE_NO_DHT": "yes", "STATESTORE_JOIN": "1", "STATESTORE_GC_FREEZE": "off"}
    c = settings(base, env).config
    assert (c.dht, c.join, c.gc_freeze) == (False, True, False)
    assert not settings(base, {"STATESTORE_NO_GC_FREEZE": "true"}).config.gc_freeze
    assert not settings(base, {"STATESTORE_NO_REPAIR_DIGESTS": "1"}).config.repair_digests
    # the flag beats both: --gc-freeze over the environment's 0 and the file's false
    assert settings([*base, "--config", path, "--gc-freeze"], env).config.gc_freeze
    # an environment false beats a file true; an empty variable counts as unset
    assert settings([*base, "--config", path], {"STATESTORE_JOIN": "false"}).config.join is False
    assert settings([*base, "--config", path], {"STATESTORE_JOIN": ""}).config.join is True
    assert settings([*base], {"STATESTORE_JOIN": "0"}).config.join is False
    path2 = toml(tmp_path, "no-gc-freeze = true\n")
    assert not settings([*base, "--config", path2]).config.gc_freeze


def test_lists_are_arrays_in_the_file_and_comma_separated_in_the_environment(
    tmp_path: Path,
) -> None:
    path = toml(tmp_path, 'data-dir = "d"\nseeds = ["a:7400", "b:7401"]\n')
    assert settings(["--config", path]).config.seeds == ["a:7400", "b:7401"]
    assert settings(["--config", toml(tmp_path, 'data-dir = "d"\nseeds = []\n')]).config.seeds == []
    env = {"STATESTORE_SEEDS": "c:1, d:2"}
    assert settings(["--config", path], env).config.seeds == ["c:1", "d:2"]


# -- errors name the setting and its source -----------------------------------------------------
@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("flag", "argument --memory-budget: 'lots' is not a positive integer"),
        ("env", "STATESTORE_MEMORY_BUDGET: 'lots' is not a positive integer"),
        ("file", "node.toml: memory-budget: expected an integer, got a string ('lots')"),
    ],
)
def test_a_bad_value_names_the_setting_and_its_source_and_exits_2(
    source: str, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    for var in node_env_names():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    argv = ["node", "--data-dir", "d"]
    if source == "flag":
        argv += ["--memory-budget", "lots"]
    elif source == "env":
        monkeypatch.setenv("STATESTORE_MEMORY_BUDGET", "lots")
    else:
        (tmp_path / "node.toml").write_text('memory-budget = "lots"\n')
        argv += ["--config", "node.toml"]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit for a bad flag
        code = int(str(exc.code))
    err = capsys.readouterr().err
    assert code == 2
    assert where in err and "Traceback" not in err, err


def test_each_kind_of_bad_value_is_refused_wherever_it_comes_from(tmp_path: Path) -> None:
    bad_file = {
        'listen = "nope"': "listen: address 'nope' is not HOST:PORT",
        "listen = 7400": 'listen: expected a string "HOST:PORT", got an integer',
        'seeds = "a:1"': "seeds: expected an array of strings",
        'seeds = ["a:1", "nope"]': "seeds: seed 'nope' is not HOST:PORT",
        "replicas = 0": "replicas: '0' is not a positive integer",
        "replicas = 2.5": "replicas: expected an integer, got a number",
        "replicas = true": "replicas: expected an integer, got a boolean",
        "down-after = -1": "down-after: '-1.0' is not a positive number",
        "scrub-mbps = nan": "scrub-mbps: 'nan' is not a number >= 0",
        'join = "yes"': "join: expected true or false, got a string",
        "zone = 3": "zone: expected a string, got an integer",
        "[node]\nreplicas = 3": "node: no such node setting",
    }
    for line, message in bad_file.items():
        path = toml(tmp_path, 'data-dir = "d"\n' + line + "\n")
        with pytest.raises(SettingError, match=re.escape(f"{path}: {message}")):
            settings(["--config", path])
    bad_env = {
        "STATESTORE_LISTEN": ("nope", "STATESTORE_LISTEN: address 'nope' is not HOST:PORT"),
        "STATESTORE_SEEDS": ("a:1,,x", "STATESTORE_SEEDS: seed 'x' is not HOST:PORT"),
        "STATESTORE_DOWN_AFTER": ("inf", "STATESTORE_DOWN_AFTER: 'inf' is not a positive number"),
        "STATESTORE_NO_DHT": ("maybe", "STATESTORE_NO_DHT: 'maybe' is not a boolean"),
        "STATESTORE_LOG_LEVEL": ("loud", "STATESTORE_LOG_LEVEL: 'loud' is not a log level"),
    }
    for var, (value, message) in bad_env.items():
        with pytest.raises(SettingError, match=re.escape(message)):
            settings(["--data-dir", "d"], {var: value})
    with pytest.raises(SettingError, match=r"--data-dir is required: .*STATESTORE_DATA_DIR"):
        settings([])
    with pytest.raises(SettingError, match="not valid TOML"):
        settings(["--config", toml(tmp_path, "data-dir = \n")])
    with pytest.raises(SettingError, match="cannot read it"):
        settings(["--config", str(tmp_path / "absent.toml")])
    with pytest.raises(SettingError, match="contradicts"):
        settings(["--config", toml(tmp_path, "gc-freeze = true\nno-gc-freeze = true\n")])


def test_a_check_across_settings_says_where_they_came_from(tmp_path: Path) -> None:
    path = toml(tmp_path, 'data-dir = "d"\nmax-body = 5000\n')
    with pytest.raises(SettingError) as exc:
        settings(["--config", path], {"STATESTORE_MEMORY_BUDGET": "1000"})
    message = str(exc.value)
    assert "--memory-budget (1000) is below --max-body" in message
    assert "--memory-budget is from STATESTORE_MEMORY_BUDGET" in message
    assert f"--max-body is from {path}: max-body" in message


# -- unknown names --------------------------------------------------------------------------------
def test_an_unknown_key_in_the_file_is_refused_with_the_nearest_name(tmp_path: Path) -> None:
    for key, hint in [
        ("memory-budgt = 5", "did you mean memory-budget?"),
        ("data_dir = 'd'", "did you mean data-dir?"),
        ("retain-versions = 5", "did you mean retain?"),
        ("config = 'x.toml'", "no such node setting"),
        ("dht = false", "did you mean no-dht?"),
    ]:
        path = toml(tmp_path, key + "\n")
        with pytest.raises(SettingError, match=re.escape(hint)) as exc:
            settings(["--data-dir", "d", "--config", path])
        assert str(exc.value).startswith(f"{path}: {key.split(' ')[0]}: ")


def test_a_near_miss_variable_is_refused_and_the_clients_variables_are_left_alone() -> None:
    typos = [
        ("STATESTORE_MEMORY_BUDGT", "STATESTORE_MEMORY_BUDGET"),
        ("STATESTORE_DATADIR", "STATESTORE_DATA_DIR"),
        ("STATESTORE_SEED", "STATESTORE_SEEDS"),
        ("STATESTORE_REPLICA", "STATESTORE_REPLICAS"),
    ]
    for var, meant in typos:
        with pytest.raises(SettingError, match=f"{var} is no node setting.*{meant}"):
            settings(["--data-dir", "d"], {var: "1"})
    # every STATESTORE_ name the repository uses is a setting or left alone
    used: set[str] = set()
    for pattern in ("*.py", "*.md", "*.sh", "*.yml", "run", "Dockerfile"):
        for path in ROOT.rglob(pattern):
            if ".venv" not in path.parts and ".git" not in path.parts and path.is_file():
                used |= set(re.findall(r"STATESTORE_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    for var in sorted(used - node_env_names() - {typo for typo, _ in typos}):
        settings(["--data-dir", "d"], {var: "x"})  # no error
    env = dict.fromkeys(NOT_SETTINGS - {"STATESTORE_CONFIG"}, "/nonexistent")
    assert settings(["--data-dir", "d"], env).config == NodeConfig(data_dir="d")
    # --tls-ca has no variable: the clients' STATESTORE_TLS_CA does not half-configure TLS
    assert not any(s.env for s in SETTINGS if s.name == "tls-ca")
    assert settings(["--data-dir", "d"], {"STATESTORE_TLS_CA": "ca.pem"}).config.tls_ca == ""


def test_local_rings_start_their_nodes_without_node_setting_variables() -> None:
    env = {"STATESTORE_SEEDS": "elsewhere:7400", "STATESTORE_TOKEN": "t", "PATH": "/bin"}
    assert clean_node_env(env) == {"STATESTORE_TOKEN": "t", "PATH": "/bin"}
    assert {env_name(s) for s in SETTINGS if s.env} <= node_env_names()


# -- help and docs ------------------------------------------------------------------------------
def test_help_states_the_precedence_and_the_sources(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["node", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "flag > environment > file > default" in out
    assert "--config FILE.toml" in out and "STATESTORE_DATA_DIR" in out


def test_the_docs_cli_reference_matches_the_parser() -> None:
    stale = check()
    assert not stale, f"{', '.join(stale)} differ from the parser: run {REGENERATE}"
    cli = (ROOT / "docs" / "cli.md").read_text()
    for s in SETTINGS:  # every setting is in the table, with its variable and key
        assert f"`--{s.name}" in cli and f"`{s.name} = " in cli
    client = (ROOT / "docs" / "client.md").read_text()
    for parser_prog in ("statestore node", "statestore removenode", "statestore backup"):
        assert parser_prog in client


def test_the_settings_module_loads_no_node_machinery() -> None:
    code = (
        "import sys, statestore.node.settings, statestore.cli.main\n"
        "bad = [m for m in ('statestore.node.server', 'statestore.node.daemon', 'lmdb', "
        "'kademlia', 'aiohttp') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


# -- a real node ----------------------------------------------------------------------------------
def test_a_node_started_from_a_config_file_with_a_variable_overriding_it(tmp_path: Path) -> None:
    path = toml(
        tmp_path,
        f'listen = "127.0.0.1:0"\ndata-dir = "{tmp_path / "data"}"\nreplicas = 1\n'
        'vnodes = 16\nno-dht = true\nzone = "file-zone"\n',
    )
    env = clean_node_env(os.environ)
    env["STATESTORE_VNODES"] = "24"
    with (
        open(tmp_path / "node.err", "wb") as err,
        subprocess.Popen(
            [sys.executable, "-m", "statestore", "node", "--config", path],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=tmp_path,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert " listening on " in line, (line, (tmp_path / "node.err").read_text())
            address = line.split()[5]
            deadline = time.monotonic() + 20
            while True:
                try:
                    ring = http_json(address, "/v1/ring", timeout=2.0)
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert isinstance(ring, dict)
            assert ring["replicas"] == 1 and ring["write_quorum"] == 1  # from the file
            assert ring["vnodes"] == 24  # STATESTORE_VNODES over the file's 16
            (member,) = ring["members"]
            assert member["zone"] == "file-zone"
            assert (tmp_path / "data" / "node.json").exists()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
