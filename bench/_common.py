"""Shared pieces of the benchmark scripts: rows, a local ring, timing and plain tables.

Every benchmark measures the ring and its baseline in the same run, interleaved round by
round, and reports ratios: the machine is shared, so absolute figures drift but ratios hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from client import RingClient
from statestore.cli.local import LocalRing

ROOT = Path(__file__).resolve().parent.parent

MiB = 1024 * 1024
KEY_BYTES = 16
VALUE_HEX = 42  # 84 hex characters: a row of ~100 B that compresses about 2:1, like real state


def rows(n: int, rng: random.Random, key_space: int = 10**9) -> dict[bytes, bytes]:
    """``n`` random-ish rows of ~100 B (16 B key, 84 B value)."""
    out: dict[bytes, bytes] = {}
    while len(out) < n:
        k = f"k{rng.randrange(key_space):015d}".encode()
        out[k] = rng.randbytes(VALUE_HEX).hex().encode()
    return out


@contextlib.contextmanager
def local_ring(
    nodes: int = 3, args: Sequence[str] = (), *, secure: bool = False
) -> Iterator[LocalRing]:
    """``nodes`` node processes on loopback in a temporary directory, stopped on exit.
    ``secure`` turns on all of docs/security.md: TLS (a CA and a node certificate made here),
    a client token (``read`` and ``write`` on every query) and node identity (a cluster
    secret); :func:`client_options` gives what a client needs to reach such a ring."""
    with tempfile.TemporaryDirectory(prefix="statestore-bench-") as tmp:
        options: dict[str, Any] = {}
        extra: list[str] = []
        if secure:
            sys.path.insert(0, str(ROOT))  # tests/certs.py: the tests' CA maker
            from tests.certs import make_tls

            tls = make_tls(Path(tmp) / "tls")
            token = "bench-" + os.urandom(16).hex()
            auth = Path(tmp) / "tokens.json"
            auth.write_text(json.dumps({token: {"queries": ["*"], "rights": ["read", "write"]}}))
            secret = Path(tmp) / "cluster.secret"
            secret.write_text(os.urandom(32).hex())
            extra = [*tls.node_args(), "--auth-file", str(auth)]
            extra += ["--cluster-secret-file", str(secret)]
            options = {"token": token, "tls_ca": str(tls.ca)}
        ring = LocalRing(
            os.path.join(tmp, "ring"),
            nodes,
            args=[*args, *extra],
            tls_ca=options.get("tls_ca"),
            token=options.get("token"),
        )
        try:
            ring.start()
            yield ring
        finally:
            ring.stop()


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU seconds so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quiet(ring: LocalRing, below: float = 0.05, window: float = 5.0, limit: float = 600.0) -> float:
    """Wait until ``ring``'s node processes together use less than ``below`` of a core over
    ``window`` seconds (their compaction, repair and retention done), at most ``limit``
    seconds; return the seconds waited. A measurement that starts while the nodes still fold
    what the last one wrote pays for that work, whichever runs first."""
    start = time.monotonic()
    pids = [p.proc.pid for p in ring.procs if p.proc is not None and p.alive]
    while time.monotonic() - start < limit:
        before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(window)
        if (sum(cpu_seconds(pid) for pid in pids) - before) / window < below:
            break
    return time.monotonic() - start


def client_options(ring: LocalRing) -> dict[str, Any]:
    """The ``RingClient`` options that reach ``ring``: its token and CA, if it has them."""
    return {"token": ring.token, "tls_ca": ring.tls_ca} if ring.tls_ca else {}


SECURITY = {"off": "ring, auth and TLS off", "on": "ring, token + TLS + node identity on"}


@contextlib.contextmanager
def security_pair(args: Sequence[str] = ()) -> Iterator[dict[str, RingClient]]:
    """Two 3-node rings side by side, security ``off`` and ``on`` (``local_ring(secure=True)``),
    and a client of each, by those names (labels in :data:`SECURITY`)."""
    with (
        local_ring(3, args) as plain,
        local_ring(3, args, secure=True) as secured,
        RingClient(plain.seeds) as off,
        RingClient(secured.seeds, **client_options(secured)) as on,
    ):
        yield {"off": off, "on": on}


def print_security_ratio(on: Sequence[float], off: Sequence[float], per: str) -> None:
    """The on/off verdict: the median of the ratios ``per`` pair (e.g. "commit by commit"),
    their spread, and whether the median is within the issue's 1.1x goal."""
    mid, lo, hi = paired_ratio(on, off)
    verdict = "within" if mid <= 1.1 else "NOT within"
    print(
        f"\non / off, {per}: median {mid:.2f}x the time (25th-75th percentile {lo:.2f}x-"
        f"{hi:.2f}x, {len(on)} pairs); total time {sum(on) / sum(off):.2f}x "
        f"({verdict} the 1.1x goal)"
    )


def pct(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def paired_ratio(on: Sequence[float], off: Sequence[float]) -> tuple[float, float, float]:
    """Per-round ratios ``on[i] / off[i]`` of two paths measured in the same rounds: their
    median, and the 25th and 75th percentiles (the spread)."""
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return median(ratios), pct(ratios, 25), pct(ratios, 75)


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Python {sys.version.split()[0]}, "
        f"load average at start {load[0]:.2f} (shared machine: compare ratios, not absolutes)"
    )


def table(headers: Sequence[str], body: Sequence[Sequence[object]]) -> str:
    """A Markdown table (what docs/benchmarks.md pastes)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in body]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])
