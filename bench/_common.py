"""Shared pieces of the benchmark scripts: rows, a local ring, timing and plain tables.

Every benchmark measures the ring and its baseline in the same run, interleaved round by
round, and reports ratios: the machine is shared, so absolute figures drift but ratios hold.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence

from statestore.cli.local import LocalRing

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
def local_ring(nodes: int = 3, args: Sequence[str] = ()) -> Iterator[LocalRing]:
    """``nodes`` node processes on loopback in a temporary directory, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="statestore-bench-") as tmp:
        ring = LocalRing(os.path.join(tmp, "ring"), nodes, args=list(args))
        try:
            ring.start()
            yield ring
        finally:
            ring.stop()


def pct(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


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
