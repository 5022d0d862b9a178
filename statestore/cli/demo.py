"""The README's main job: a local 3-node ring, commits, ``kill -9`` of a node, a restore."""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from typing import TYPE_CHECKING

from statestore.cli.command import Subparsers
from statestore.cli.local import LocalRing

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_parser", "run", "run_demo"]


def add_parser(sub: Subparsers) -> None:
    d = sub.add_parser(
        "demo", help="local 3-node ring: commit, kill -9 a node, restore; then the Spark demo"
    )
    d.add_argument("--no-spark", action="store_true", help="skip the Spark streaming part")
    d.add_argument("--data-dir", default=None)
    d.add_argument("--base-port", type=int, default=0)
    d.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="statestore-demo-")
    return run_demo(data_dir, args.base_port, spark=not args.no_spark)


def _spark_demo(ring: LocalRing, console: Console) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        console.print("pyspark is not installed: skipping the Spark part (pip install '.[spark]')")
        return 0
    from statestore.cli.spark_demo import run_spark_demo

    return run_spark_demo(ring.seeds, ring)


def run_demo(data_dir: str, base_port: int = 0, *, spark: bool = True) -> int:
    from rich.console import Console
    from rich.table import Table

    from client import RingClient, StoreId

    console = Console()
    console.rule("statestore demo")
    ring = LocalRing(data_dir, 3, base_port, args=["--down-after", "3"])
    try:
        with console.status("starting 3 node processes on loopback..."):
            ring.start()
        console.print(f"ring up: seeds {', '.join(ring.seeds)}")
        sid = StoreId(query="demo", operator=0, partition=0, name="counts")
        rng = random.Random(7)
        reference: dict[bytes, bytes] = {}
        with RingClient(ring.seeds) as client:
            for version in range(1, 21):
                puts = {}
                for _ in range(500):
                    word = f"word-{rng.randrange(2000):04d}".encode()
                    count = int(reference.get(word, b"0")) + 1
                    puts[word] = str(count).encode()
                dels = [k for k in list(reference)[:5] if k not in puts] if version % 5 == 0 else []
                client.commit(
                    sid, version, puts, dels, positions={"events": version * 500}, epoch=1
                )
                reference.update(puts)
                for k in dels:
                    reference.pop(k, None)
            head = client.latest(sid)
            console.print(
                f"committed 20 versions; head is version {head.version}, "
                f"epoch {head.epoch}; {len(reference)} keys"
            )
            victim = ring.procs[1]
            console.print(f"[bold red]kill -9[/] node {victim.id} at {victim.address}")
            ring.kill(1)
            started = time.perf_counter()
            st = client.restore(sid)
            took = time.perf_counter() - started
            same = dict(st) == reference
            table = Table(title="restored after the kill")
            for col in (
                "version",
                "keys",
                "positions",
                "chunks",
                "bytes",
                "failovers",
                "seconds",
                "identical",
            ):
                table.add_column(col)
            table.add_row(
                str(st.version),
                str(len(st)),
                str(st.positions),
                str(st.stats["chunks"]),
                str(st.stats["bytes"]),
                str(st.stats["failovers"]),
                f"{took:.3f}",
                "[green]yes[/]" if same else "[red]NO[/]",
            )
            console.print(table)
            word = next(iter(sorted(reference)))
            console.print(f"point read {word!r} -> {client.get(sid, word)!r}")
        rc = 0 if same else 1
        if spark:
            # bring the killed node back: the Spark part kills one of its own (W=2 of R=3)
            ring.restart(1)
            ring.wait_ring(3)
            console.print(f"node {ring.procs[1].id} restarted with its data dir and rejoined")
            rc = _spark_demo(ring, console) or rc
        return rc
    finally:
        ring.stop()
        console.print(f"stopped; node data in {data_dir}")
