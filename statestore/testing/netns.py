"""A private network for real node processes: one network namespace per node, a veth pair
from each into a bridge in the test's own namespace (where the clients run), and per-node
``iptables`` rules (inside each node's namespace, never the host's) that drop packets to and
from the endpoints a partition cuts off.

Addresses: the bridge (the clients) is ``10.213.T.1``, node ``i`` is ``10.213.T.(10 + i)``,
with ``T`` chosen per harness so parallel runs do not collide. Every node listens on the same
port inside its own namespace. :meth:`Netns.teardown` deletes the namespaces (and with them
their rules and veth ends) and the bridge; it is safe to call twice and after a failed setup.

Cutting is by DROP (silence, like a real partition: a connection attempt hangs until its
deadline, an established connection stops answering), not by REJECT.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence

__all__ = ["Netns", "unavailable_reason"]


def _run(cmd: Sequence[str], stdin: str | None = None, check: bool = True) -> str:
    out = subprocess.run(
        list(cmd), input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def unavailable_reason(install: bool = True) -> str | None:
    """Why the harness cannot run here (None: it can). As root with ``apt-get`` and no
    ``iptables``, installs it first when ``install`` (the only package it needs)."""
    if os.geteuid() != 0:
        return "partition tests need root (network namespaces and iptables)"
    if shutil.which("ip") is None:
        return "partition tests need iproute2 (`ip netns`)"
    if shutil.which("iptables") is None and install and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "iptables"],
            capture_output=True,
            timeout=300,
            check=False,
        )
    if shutil.which("iptables") is None or shutil.which("iptables-restore") is None:
        return "partition tests need iptables (apt-get install -y iptables)"
    probe = f"ssprobe{os.getpid() % 100000}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(
            [
                "ip",
                "netns",
                "exec",
                probe,
                "iptables",
                "-A",
                "INPUT",
                "-s",
                "10.0.0.9",
                "-j",
                "DROP",
            ]
        )
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace with iptables rules here: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


class Netns:
    """``n`` node namespaces on a private bridge; see the module docstring."""

    def __init__(self, n: int, tag: int | None = None) -> None:
        self.n = n
        self.tag = tag if tag is not None else os.getpid() % 200 + 20
        t = self.tag
        self.bridge = f"ssb{t}"
        self.client_ip = f"10.213.{t}.1"
        self.names = [f"ss{t}n{i}" for i in range(n)]
        self.ips = [f"10.213.{t}.{10 + i}" for i in range(n)]
        self._host_veths = [f"ss{t}h{i}" for i in range(n)]
        self._blocked: list[frozenset[str]] = [frozenset() for _ in range(n)]
        self._lock = threading.Lock()  # the nemesis changes cuts from worker threads

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a process in node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.names[i]]

    def setup(self) -> Netns:
        self.teardown()  # what a crashed earlier run with the same tag left
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.client_ip}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for i, (ns, ip, host) in enumerate(
                zip(self.names, self.ips, self._host_veths, strict=True)
            ):
                peer = f"ss{self.tag}p{i}"
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer])
                _run(["ip", "link", "set", peer, "netns", ns])
                _run(["ip", "link", "set", host, "master", self.bridge])
                _run(["ip", "link", "set", host, "up"])
                inside = ["ip", "netns", "exec", ns]
                _run([*inside, "ip", "link", "set", "lo", "up"])
                _run([*inside, "ip", "link", "set", peer, "name", "eth0"])
                _run([*inside, "ip", "addr", "add", f"{ip}/24", "dev", "eth0"])
                _run([*inside, "ip", "link", "set", "eth0", "up"])
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> None:
        for ns in self.names:
            _run(["ip", "netns", "del", ns], check=False)
        for host in self._host_veths:
            _run(["ip", "link", "del", host], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)

    # -- cuts ----------------------------------------------------------------------------
    def block(self, i: int, peers: Iterable[str]) -> None:
        """Node ``i`` neither sends to nor receives from ``peers`` (addresses: other nodes'
        or :attr:`client_ip`); replaces what was blocked for it before."""
        with self._lock:
            self._block(i, frozenset(peers))

    def _block(self, i: int, want: frozenset[str]) -> None:
        if want == self._blocked[i]:
            return
        rules = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        for p in sorted(want):
            rules.append(f"-A INPUT -s {p}/32 -j DROP")
            rules.append(f"-A OUTPUT -d {p}/32 -j DROP")
        rules.append("COMMIT")
        _run([*self.prefix(i), "iptables-restore"], stdin="\n".join(rules) + "\n")
        self._blocked[i] = want

    def apply(self, cut: Iterable[tuple[str, str]]) -> None:
        """Make exactly the pairs in ``cut`` (unordered, by address) unable to talk."""
        per: list[set[str]] = [set() for _ in range(self.n)]
        index = {ip: i for i, ip in enumerate(self.ips)}
        for a, b in cut:
            if a in index:
                per[index[a]].add(b)
            if b in index:
                per[index[b]].add(a)
        with self._lock:
            for i in range(self.n):
                self._block(i, frozenset(per[i]))

    def heal(self) -> None:
        with self._lock:
            for i in range(self.n):
                self._block(i, frozenset())

    def rules(self, i: int) -> str:
        return _run([*self.prefix(i), "iptables", "-S"])
