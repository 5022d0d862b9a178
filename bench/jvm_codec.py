"""The provider's Java chunk codec against the Python one, CPU per MiB, side by side.

One commit's puts like a Spark task's at 8 partitions of ``bench/spark_state.py`` (default
25,000 rows; ``--shape spark``: 16-byte UnsafeRow keys and values of a count by a long key;
``--shape random``: the ~100 B rows of the other benchmarks) are encoded into chunks, and
the chunks decoded, by Python (``statestore.core.chunk.encode_chunks`` / ``decode_chunk``,
this process's thread CPU time) and by Java (``CodecHarness bench`` from the provider jar, a
long-lived JVM answering one timed round per request, its thread CPU time via
ThreadMXBean), in alternating rounds after a warm-up. Reported: CPU ms per MiB of raw chunk
payload, per round, and the Java/Python ratio's median and spread over the rounds (the
machine is shared: compare ratios measured in the same run). The first encode in a fresh
JVM (interpreted, before the JIT) is reported separately: it is what a restarted executor's
first commit pays.

    .venv/bin/python bench/jvm_codec.py [--rows 25000] [--rounds 9] [--shape spark|random]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

MiB = 1 << 20


def spark_rows(n: int, rng: random.Random) -> dict[bytes, bytes]:
    """``n`` rows of a streaming count by a long key: UnsafeRow key (8-byte null bitset +
    the long) and value (bitset + the count), 16 bytes each."""
    out: dict[bytes, bytes] = {}
    while len(out) < n:
        key = bytes(8) + rng.randrange(1 << 18).to_bytes(8, "little")
        out[key] = bytes(8) + rng.randrange(1, 40).to_bytes(8, "little")
    return out


class JavaCodec:
    """``CodecHarness bench`` in its own JVM, one timed round per request."""

    def __init__(self, puts: dict[bytes, bytes], work: Path) -> None:
        from tests.javakit import harness_classpath  # the harness is not in the product jar

        src = work / "bench.in"
        src.write_bytes(msgpack.packb([list(puts), list(puts.values())], use_bin_type=True))
        cp = harness_classpath()
        self.proc = subprocess.Popen(
            ["java", "-cp", cp, "statestore.spark.CodecHarness", "bench", str(src)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def round(self, what: str, n: int) -> tuple[float, float, int]:
        """(thread CPU s, wall s, raw bytes per encode or rows per decode)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{what} {n}\n")
        self.proc.stdin.flush()
        cpu, wall, size, _ = self.proc.stdout.readline().split()
        return int(cpu) / 1e9, int(wall) / 1e9, int(size)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def py_round(what: str, n: int, puts: dict[bytes, bytes], chunks: list) -> tuple[float, float]:
    from statestore.core.chunk import decode_chunk, encode_chunks

    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(n):
        if what == "encode":
            encode_chunks(puts, [])
        else:
            for c in chunks:
                decode_chunk(c.data)
    return time.thread_time() - cpu0, time.perf_counter() - wall0


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=25_000)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--per-round", type=int, default=10, help="encodes (decodes) per round")
    p.add_argument("--shape", choices=("spark", "random"), default="spark")
    args = p.parse_args()

    from _common import machine, rows

    from statestore.core.chunk import encode_chunks

    print(machine())
    rng = random.Random(12)
    puts = spark_rows(args.rows, rng) if args.shape == "spark" else rows(args.rows, rng)
    chunks = encode_chunks(puts, [])
    raw_mib = sum(c.raw_size for c in chunks) / MiB
    print(
        f"{args.rows:,} rows ({args.shape}), {raw_mib:.2f} MiB raw in {len(chunks)} chunk(s), "
        f"{sum(len(c.data) for c in chunks) / MiB:.3f} MiB compressed"
    )
    with tempfile.TemporaryDirectory(prefix="statestore-jvm-codec-") as tmp:
        java = JavaCodec(puts, Path(tmp))
        try:
            cold_cpu, cold_wall, _ = java.round("encode", 1)
            print(
                f"first encode in a fresh JVM (after one at start-up): "
                f"{cold_cpu * 1e3 / raw_mib:.1f} CPU ms/MiB, {cold_wall * 1e3:.1f} ms wall"
            )
            for what in ("encode", "decode"):  # warm-up: the JIT, Python's caches
                java.round(what, 3 * args.per_round)
                py_round(what, args.per_round, puts, chunks)
            res: dict[str, dict[str, list[float]]] = {
                w: {"java": [], "python": [], "ratio": []} for w in ("encode", "decode")
            }
            for r in range(args.rounds):
                for what in ("encode", "decode"):
                    if r % 2 == 0:
                        jc = java.round(what, args.per_round)[0]
                        pc = py_round(what, args.per_round, puts, chunks)[0]
                    else:
                        pc = py_round(what, args.per_round, puts, chunks)[0]
                        jc = java.round(what, args.per_round)[0]
                    j_ms = jc * 1e3 / (args.per_round * raw_mib)
                    p_ms = pc * 1e3 / (args.per_round * raw_mib)
                    res[what]["java"].append(j_ms)
                    res[what]["python"].append(p_ms)
                    res[what]["ratio"].append(j_ms / p_ms)
        finally:
            java.close()
    print(f"load average now {os.getloadavg()[0]:.2f}; {args.rounds} alternating rounds")
    print()
    print("| codec | Java CPU ms/MiB | Python CPU ms/MiB | Java / Python |")
    print("|---|---|---|---|")
    for what in ("encode", "decode"):
        r = res[what]
        print(f"| {what} | {spread(r['java'])} | {spread(r['python'])} | {spread(r['ratio'])} |")


if __name__ == "__main__":
    main()
