"""docker/: the image, the compose ring, the systemd unit and the Kubernetes example, read.

Every node command in them (the image's ENTRYPOINT/CMD, each compose service, the unit's
ExecStart with its node.toml, the StatefulSet's script) parses with the real CLI, and their
addresses, probes and grace periods fit together. The files are read as text (YAML with
PyYAML); the health check script runs against a stub node. tests/ring/test_compose.py starts the
compose file for real (with podman).
"""

from __future__ import annotations

import configparser
import http.server
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from statestore.cli.main import build_parser
from statestore.node.settings import resolve

DOCKER = Path(__file__).resolve().parents[2] / "docker"


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


def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with no variable set (the file's defaults)."""
    assert "$$" not in text
    out = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)
    assert "$" not in out, f"an interpolation without a default: {text}"
    return out


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


def healthcheck_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", DOCKER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the image ----------------------------------------------------------------------------
def test_dockerfile_entrypoint_and_cmd_parse(dockerfile: dict[str, list[str]]) -> None:
    assert dockerfile["FROM"] == ["${BASE}"]
    assert "BASE=python:3.11-slim" in dockerfile["ARG"], "real users build on python:3.11-slim"
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
    (install,) = dockerfile["RUN"]
    assert "pip install '.[node]'" in install  # from PyPI by default
    assert "--no-index --find-links \"$WHEELS\" 'statestore[node]'" in install  # WHEELS=dir
    assert dockerfile.get("USER") not in (None, ["root"]), "the node should not run as root"
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    for needed in ("!docker/healthcheck.py", "!docker/wheels/**"):
        assert needed in ignore


def test_dockerfile_healthcheck_is_the_script_on_the_node_port(
    dockerfile: dict[str, list[str]],
) -> None:
    (check,) = dockerfile["HEALTHCHECK"]
    assert check.split("CMD", 1)[1].strip() == json.dumps(
        ["python3", "/opt/statestore/healthcheck.py"]
    )
    assert any(
        "docker/healthcheck.py /opt/statestore/healthcheck.py" in c for c in dockerfile["COPY"]
    )


def test_healthcheck_finds_the_node_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hc = healthcheck_module()
    monkeypatch.delenv("STATESTORE_LISTEN", raising=False)
    monkeypatch.delenv("STATESTORE_CONFIG", raising=False)
    argv: list[str] = []
    monkeypatch.setattr(hc, "node_argv", lambda: argv)
    assert hc.listen_port() == 7400
    conf = tmp_path / "node.toml"
    conf.write_text('listen = "0.0.0.0:7420"\n')
    monkeypatch.setenv("STATESTORE_CONFIG", str(conf))
    assert hc.listen_port() == 7420
    monkeypatch.setenv("STATESTORE_LISTEN", "0.0.0.0:7410")
    assert hc.listen_port() == 7410
    argv[:] = ["--listen", "0.0.0.0:7401", "--data-dir", "/data", "--listen=0.0.0.0:7402"]
    assert hc.listen_port() == 7402  # flag > environment > file, the last flag winning


class _Stub(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = json.dumps({"status": "ready" if self.status == 200 else "not_ready"}).encode()
        self.send_response(self.status if self.path == "/v1/health/ready" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub_node() -> Iterator[tuple[int, type[_Stub]]]:
    handler = type("Handler", (_Stub,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_fails_while_not_ready(stub_node: tuple[int, type[_Stub]]) -> None:
    port, handler = stub_node
    script = [sys.executable, str(DOCKER / "healthcheck.py"), str(port)]
    ok = subprocess.run(script, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    handler.status = 503  # joining, leaving or degraded
    bad = subprocess.run(script, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "not ready (503)" in bad.stderr
    handler.status = 200
    gone = [sys.executable, str(DOCKER / "healthcheck.py"), "1"]
    none = subprocess.run(gone, capture_output=True, text=True, timeout=30)
    assert none.returncode == 1 and "no answer on port 1" in none.stderr


# -- the compose ring -----------------------------------------------------------------------
def test_compose_has_three_nodes_built_from_the_dockerfile(compose: dict[str, Any]) -> None:
    nodes = node_services(compose)
    assert sorted(nodes) == ["node1", "node2", "node3"]
    for name, svc in compose["services"].items():
        assert svc["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
        assert svc["image"] == "statestore:dev", name
    for name, svc in nodes.items():
        assert svc["hostname"] == name
        assert svc["volumes"][0] == f"{name}-data:/data"
        assert f"{name}-data" in compose["volumes"]
        assert svc["healthcheck"]["test"] == ["CMD", "python3", "/opt/statestore/healthcheck.py"]
        assert svc["stop_grace_period"] == "35s"


def test_compose_nodes_advertise_what_the_host_and_the_containers_reach(
    compose: dict[str, Any], entrypoint: list[str]
) -> None:
    """Each node advertises the network's gateway (RING_HOST's default) on its own port,
    published there under the same number: the host owns that address, and containers
    reach it through the published port."""
    (ipam,) = compose["networks"]["ring"]["ipam"]["config"]
    gateway = ipam["gateway"]
    advertised = {}
    for name, svc in node_services(compose).items():
        assert svc["networks"] == ["ring"]
        ns = parse_cli(entrypoint[1:] + [interpolate(a) for a in svc["command"]])
        assert ns.command == "node"
        host, port = ns.advertise
        assert host == gateway, name
        assert ns.listen == ("0.0.0.0", port), "the same port inside and outside"
        assert [interpolate(p) for p in svc["ports"]] == [f"{gateway}:{port}:{port}/tcp"]
        assert resolve(ns, {}).config.dht is False, "no Kademlia behind the ports' NAT"
        assert ns.data_dir == "/data"
        advertised[name] = f"{host}:{port}"
    assert len(set(advertised.values())) == 3
    for name, svc in node_services(compose).items():
        ns = parse_cli(entrypoint[1:] + [interpolate(a) for a in svc["command"]])
        if name == "node1":
            assert ns.seeds == []
        else:
            assert ns.seeds == [advertised["node1"]]
            assert svc["depends_on"]["node1"] == {"condition": "service_healthy"}
    ring = compose["services"]["ring"]
    ns = parse_cli(ring["entrypoint"][1:] + [interpolate(a) for a in ring["command"]])
    assert ns.command == "ring" and sorted(ns.seeds) == sorted(advertised.values())


def test_compose_secret_comes_from_the_init_service(
    compose: dict[str, Any], entrypoint: list[str]
) -> None:
    init = compose["services"]["secret-init"]
    assert init["volumes"] == ["cluster-secret:/secret"]
    script = init["command"][0]
    assert 'path = "/secret/cluster.secret"' in script and "os.urandom(32)" in script
    assert "if not os.path.exists(path)" in script, "a restart must keep the secret"
    assert "os.chown(tmp, 10001, 10001)" in script  # the image's statestore user
    assert "cluster-secret" in compose["volumes"]
    for name, svc in node_services(compose).items():
        ns = parse_cli(entrypoint[1:] + [interpolate(a) for a in svc["command"]])
        assert ns.cluster_secret_file == "/run/statestore/cluster.secret", name
        assert "cluster-secret:/run/statestore:ro" in svc["volumes"], name
        assert svc["depends_on"]["secret-init"] == {"condition": "service_completed_successfully"}


def test_compose_secret_init_script_compiles() -> None:
    """The secret-init script is valid Python (it runs with the image's python3 -c)."""
    doc = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    compile(doc["services"]["secret-init"]["command"][0], "secret-init", "exec")


# -- systemd ------------------------------------------------------------------------------
def test_systemd_unit_runs_the_node_with_its_config_and_waits_for_a_drain() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DOCKER / "systemd" / "statestore-node.service").read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/statestore")
    ns = parse_cli(argv[1:])
    assert ns.command == "node" and ns.config == "/etc/statestore/node.toml"
    example = parse_cli(["node", "--config", str(DOCKER / "systemd" / "node.toml")])
    config = resolve(example, {}).config
    assert config.data_dir == "/var/lib/statestore"
    assert service["StateDirectory"] == "statestore"
    assert config.drain_on_stop
    assert int(service["TimeoutStopSec"]) > config.drain_timeout
    assert service["KillSignal"] == "SIGTERM"


# -- Kubernetes ---------------------------------------------------------------------------
def k8s_docs() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DOCKER / "k8s" / "statefulset.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def test_k8s_statefulset_probes_grace_and_command() -> None:
    docs = k8s_docs()
    service, sts = docs["Service"], docs["StatefulSet"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True  # joining pods are reachable
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    pod = sts["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    assert node["livenessProbe"]["httpGet"]["path"] == "/v1/health/live"
    assert node["readinessProbe"]["httpGet"]["path"] == "/v1/health/ready"
    assert pod["securityContext"]["runAsUser"] == 10001
    # the node's command line, as the script execs it for pod 1 of namespace "ns"
    script = node["args"][0]
    (line,) = [x.strip() for x in script.splitlines() if x.strip().startswith("exec statestore")]
    env = {"$POD_NAME": "statestore-1", "$domain": "statestore.ns.svc.cluster.local"}
    for var, value in env.items():
        line = line.replace(var, value)
    argv = shlex.split(line.replace("$join", "--join"))[1:]
    assert "$" not in " ".join(argv)
    ns = parse_cli(argv[1:])
    assert ns.command == "node" and ns.join and ns.drain_on_stop
    assert tuple(ns.advertise) == ("statestore-1.statestore.ns.svc.cluster.local", 7400)
    assert len(ns.seeds) == sts["spec"]["replicas"]
    assert ns.cluster_secret_file.startswith(node["volumeMounts"][1]["mountPath"] + "/")
    assert pod["terminationGracePeriodSeconds"] > ns.drain_timeout
    assert node["ports"][0]["containerPort"] == ns.listen[1]
