"""Node processes on loopback: ``statestore local``, the demo, the tests and the benchmarks.

Each node is a separate ``python -m statestore node`` process (so ``kill -9`` is real), started
on a given or OS-chosen port; its first stdout line announces the address it bound.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statestore.cli.command import Subparsers, failer, positive
from statestore.cli.http import open_node
from statestore.cli.node import missing_node_packages, node_install_hint
from statestore.node.settings import node_env_names

__all__ = ["LocalRing", "NodeProcess", "add_parser", "clean_node_env", "http_json", "run"]


def http_json(
    address: str,
    path: str,
    timeout: float = 2.0,
    *,
    tls_ca: str | None = None,
    token: str | None = None,
) -> object:
    """GET a node's JSON answer (cli/http.py's request, with ``token`` or the environment's,
    over HTTPS verified against ``tls_ca`` or ``STATESTORE_TLS_CA`` when one is given).

    For the harness and its tests, which read statuses: raises urllib's errors (an
    ``HTTPError`` for an error answer, another OSError when the node cannot be reached or
    verified), not the error tree's (the operator commands use ``request_json``).
    """
    return json.loads(open_node(address, path, timeout=timeout, tls_ca=tls_ca, token=token))


def clean_node_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the node-setting variables (``STATESTORE_SEEDS``, ...: a node
    reads them, node/settings.py): the nodes started here are described by their flags alone,
    whatever the caller's shell holds."""
    drop = node_env_names()
    return {k: v for k, v in environ.items() if k not in drop}


@dataclass
class NodeProcess:
    data_dir: str
    port: int
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    id: str = ""
    log_path: str = ""
    paused: bool = False
    host: str = "127.0.0.1"  # the address it listens on (and advertises)
    # run the node under this command (e.g. ``ip netns exec NS``: the partition tests)
    prefix: list[str] = field(default_factory=list)
    # the node's environment (default: ours without node-setting variables, clean_node_env)
    env: dict[str, str] | None = None
    # the interpreter that runs it (default: ours; the upgrade test runs a previous build's)
    python: str = ""

    def start(self, seeds: Sequence[str], timeout: float = 30.0) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        out_path = os.path.join(self.data_dir, "node.out")
        self.log_path = os.path.join(self.data_dir, "node.log")
        cmd = [
            *self.prefix,
            self.python or sys.executable,
            "-m",
            "statestore",
            "node",
            "--listen",
            f"{self.host}:{self.port}",
            "--data-dir",
            self.data_dir,
            *self.args,
        ]
        if seeds:
            cmd += ["--seeds", ",".join(seeds)]
        with open(out_path, "wb") as out, open(self.log_path, "ab") as err:
            env = self.env if self.env is not None else clean_node_env(os.environ)
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, start_new_session=True, env=env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(out_path, "rb") as f:
                line = f.readline().decode()
            if line.endswith("\n") and " listening on " in line:
                parts = line.split()
                self.id = parts[2]
                self.address = parts[5]
                self.port = int(self.address.rsplit(":", 1)[1])  # keep the port on restart
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        with open(self.log_path, "rb") as f:
            tail = f.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"node in {self.data_dir} did not start:\n{tail}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if self.paused:  # a stopped process takes no signal but KILL until continued
                self.proc.send_signal(signal.SIGCONT)
                self.paused = False
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class LocalRing:
    """N node processes on 127.0.0.1 (port 0 = let the OS choose); ``tls_ca`` verifies them
    when ``args`` turn TLS on (``--tls-cert``, ``--tls-key``, ``--tls-ca``), and ``token``
    (default ``STATESTORE_TOKEN``) is what its own reads send to nodes with ``--auth-file``."""

    base_dir: str
    nodes: int = 3
    base_port: int = 0
    args: list[str] = field(default_factory=list)
    procs: list[NodeProcess] = field(default_factory=list)
    tls_ca: str | None = None
    token: str | None = None

    def start(self) -> LocalRing:
        for _ in range(self.nodes):
            self.add_node()
        self.wait_ring(self.nodes)
        return self

    def add_node(self, args: Sequence[str] = ()) -> NodeProcess:
        i = len(self.procs)
        port = self.base_port + i if self.base_port else 0
        node = NodeProcess(os.path.join(self.base_dir, f"node-{i}"), port, [*self.args, *args])
        node.start(self.seeds[:1])
        self.procs.append(node)
        return node

    @property
    def seeds(self) -> list[str]:
        return [p.address for p in self.procs if p.alive and not p.paused]

    def kill(self, i: int) -> None:
        """``kill -9`` node ``i``."""
        self.procs[i].stop(signal.SIGKILL)

    def pause(self, i: int) -> None:
        """``kill -STOP`` node ``i``: alive, holding its sockets, answering nothing."""
        proc = self.procs[i].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        self.procs[i].paused = True

    def resume(self, i: int) -> None:
        proc = self.procs[i].proc
        assert proc is not None
        proc.send_signal(signal.SIGCONT)
        self.procs[i].paused = False

    def restart(self, i: int) -> None:
        self.procs[i].start([s for s in self.seeds if s != self.procs[i].address][:1])

    def ring(self, address: str | None = None) -> dict[str, Any]:
        obj = http_json(address or self.seeds[0], "/v1/ring", tls_ca=self.tls_ca, token=self.token)
        assert isinstance(obj, dict)
        return obj

    def wait_ring(self, up: int, timeout: float = 60.0) -> None:
        """Wait until every live node sees exactly ``up`` members up and one epoch."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                views = [self.ring(a) for a in self.seeds]
                counts = [sum(1 for m in v["members"] if m["status"] == "up") for v in views]
                epochs = {v["epoch"] for v in views}
                last = (counts, epochs)
                if all(c == up for c in counts) and len(epochs) == 1:
                    return
            except (OSError, ValueError) as exc:  # not up yet, or not answering JSON yet
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"ring did not settle on {up} up members: {last}")

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


def add_parser(sub: Subparsers) -> None:
    loc = sub.add_parser("local", help="run N nodes on loopback until Ctrl-C")
    loc.add_argument("--nodes", type=positive, default=3, help="nodes to run (default: 3)")
    loc.add_argument(
        "--base-port",
        type=int,
        default=7400,
        metavar="P",
        help="node i listens on port P+i, TCP and UDP (default: 7400; 0: ports the OS picks)",
    )
    loc.add_argument(
        "--data-dir",
        default="data/local",
        metavar="DIR",
        help="node i keeps its data in DIR/node-i (default: data/local)",
    )
    loc.set_defaults(run=run)


def busy_ports(host: str, ports: Sequence[int]) -> list[int]:
    """The ``ports`` some process already listens on (TCP) at ``host``."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a node binds
            try:
                s.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def run(args: argparse.Namespace) -> int:
    """``statestore local``: the ring up until Ctrl-C (or SIGTERM), then stopped."""
    fail = failer("local")
    if missing := missing_node_packages():  # its nodes would each fail the same way
        return fail(node_install_hint(missing))
    ports = [args.base_port + i for i in range(args.nodes)] if args.base_port else []
    if busy := busy_ports("127.0.0.1", ports):
        return fail(
            f"port{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))} on 127.0.0.1 "
            f"{'are' if len(busy) > 1 else 'is'} in use (another statestore local or node?); "
            f"node i listens on --base-port + i: give a --base-port with {args.nodes} free "
            "ports from it, or --base-port 0 for ports the OS picks"
        )
    ring = LocalRing(os.path.abspath(args.data_dir), args.nodes, args.base_port)
    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    try:
        try:
            ring.start()
        except (RuntimeError, TimeoutError) as exc:  # a node that did not start, or no ring
            why = str(exc).strip().splitlines()
            hint = " (pick another --base-port)" if "cannot listen" in why[-1] else ""
            return fail(f"{why[0]} {why[-1] if len(why) > 1 else ''}".strip() + hint)
        print(f"local ring of {args.nodes} nodes up; seeds: {','.join(ring.seeds)}", flush=True)
        print("Ctrl-C stops them.", flush=True)
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        ring.stop()
        print("local ring stopped", flush=True)
    return 0
