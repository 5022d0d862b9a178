"""The container's health check: exit 0 when the node in this container is ready.

Asks ``GET /v1/health/ready`` (docs/operations.md, "Probes") on the node's own port: 200 once
it is a normal member of the ring, serving and not degraded; 503 while it joins, leaves or is
degraded (a full disk, a tokens file that no longer parses, a failing loop), so the container
is unhealthy then. HTTP, or HTTPS for a node started with ``--tls-cert``: it asks its own
loopback port, which the certificate need not name, so the TLS attempt does not verify it.

The port is the first argument when given, else the node's own, found as the node finds it
(flag > environment > config file > 7400): ``--listen`` in the node's command line (the
container's ``statestore node`` process), ``STATESTORE_LISTEN``, ``listen`` in the file of
``--config`` or ``STATESTORE_CONFIG``. So one health check fits every node, whatever port it
listens on. Standard library only: it runs in the image's Python, outside the node.
"""

from __future__ import annotations

import os
import ssl
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_PORT = 7400


def node_argv() -> list[str]:
    """The command line of this container's ``statestore node`` process (PID 1 normally;
    any process when an init runs first), or [] when none is found."""
    pids = sorted(
        (p for p in Path("/proc").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    for proc in pids:
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if os.path.basename(arg) == "statestore" and argv[i + 1] == "node":
                return argv[i + 2 :]
    return []


def flag(argv: list[str], name: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value  # the last one wins, as with argparse


def listen_port() -> int:
    argv = node_argv()
    listen = flag(argv, "--listen") or os.environ.get("STATESTORE_LISTEN")
    if not listen:
        config = flag(argv, "--config") or os.environ.get("STATESTORE_CONFIG")
        if config:
            try:
                with open(config, "rb") as f:
                    listen = str(tomllib.load(f).get("listen", "")) or None
            except (OSError, tomllib.TOMLDecodeError):
                listen = None
    if not listen:
        return DEFAULT_PORT
    return int(listen.rsplit(":", 1)[1])


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else listen_port()
    attempts = (("http", None), ("https", ssl._create_unverified_context()))
    for scheme, ctx in attempts:
        url = f"{scheme}://127.0.0.1:{port}/v1/health/ready"
        try:
            urllib.request.urlopen(url, timeout=2, context=ctx)
            sys.exit(0)
        except urllib.error.HTTPError as exc:
            sys.exit(f"not ready ({exc.code}): {exc.read()[:500].decode(errors='replace')}")
        except Exception:
            pass
    sys.exit(f"no answer on port {port}")


if __name__ == "__main__":
    main()
