"""``statestore spark-repartition``: change a stopped ring-backed Spark query's number of
state partitions from the command line (a local Spark session on the ring, a progress bar, one
line when done). The work is ``spark_connector.repartition``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from statestore.cli.command import Subparsers, add_client_tls, positive, seeds

__all__ = ["add_parser", "repartition_query", "run"]


def add_parser(sub: Subparsers) -> None:
    sr = sub.add_parser(
        "spark-repartition",
        help="change a stopped ring-backed Spark query's number of state partitions",
    )
    sr.add_argument(
        "--seeds",
        type=seeds,
        default=os.environ.get("STATESTORE_SEEDS") or "127.0.0.1:7400",
        metavar="HOST:PORT,...",
        help="the ring the query's state is on (default: $STATESTORE_SEEDS, else "
        "127.0.0.1:7400, where statestore local starts)",
    )
    sr.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    sr.add_argument("--partitions", type=positive, required=True, help="the new partition count")
    sr.add_argument(
        "--skip-failed-batch",
        action="store_true",
        help="go on when the last batch did not commit (its input is read again)",
    )
    sr.add_argument("--threads", type=positive, default=4, help="partitions moved at once (1-64)")
    sr.add_argument("--token-file", default=None, help="the ring's client token, in a file")
    sr.add_argument(
        "--driver-memory",
        default="2g",
        help="the local Spark driver's heap (it holds one store's rows at a time; default 2g)",
    )
    add_client_tls(sr)
    sr.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return repartition_query(
        args.seeds,
        args.checkpoint,
        args.partitions,
        skip_failed_batch=args.skip_failed_batch,
        threads=args.threads,
        token_file=args.token_file,
        tls_ca=args.tls_ca,
        driver_memory=args.driver_memory,
    )


def repartition_query(
    seeds: Sequence[str],
    checkpoint: str,
    partitions: int,
    *,
    skip_failed_batch: bool = False,
    threads: int = 4,
    token_file: str | None = None,
    tls_ca: str | None = None,
    driver_memory: str = "2g",
) -> int:
    """``statestore spark-repartition``: a local Spark session on the ring, a progress bar,
    one line when done. Returns the exit code."""
    if partitions < 1:
        print(
            f"statestore spark-repartition: --partitions must be >= 1, got {partitions}",
            file=sys.stderr,
        )
        return 2
    if "://" not in checkpoint and not os.path.isdir(checkpoint):
        print(
            f"statestore spark-repartition: --checkpoint {checkpoint} is not a directory",
            file=sys.stderr,
        )
        return 2
    from pyspark.sql import SparkSession
    from rich.progress import Progress

    from spark_connector import SparkConnectorError, configure, repartition

    spark = None
    try:
        builder = SparkSession.builder.master("local[2]").appName("statestore-repartition")
        builder = builder.config("spark.ui.enabled", "false")
        # the tool holds one store's rows at a time in the driver (docs/spark.md)
        builder = builder.config("spark.driver.memory", driver_memory)
        spark = configure(builder, seeds, token_file=token_file, tls_ca=tls_ca).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        started = time.monotonic()
        with Progress(transient=True) as bar:
            task = bar.add_task("moving stores", total=None)

            def show(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total or None)

            batch = repartition(
                spark,
                checkpoint,
                partitions,
                enforce_exactly_once_sink=not skip_failed_batch,
                threads=threads,
                on_progress=show,
            )
    except SparkConnectorError as exc:
        print(f"statestore spark-repartition: {exc}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()
    print(
        f"repartitioned {checkpoint} to {partitions} partitions in batch {batch} "
        f"({time.monotonic() - started:.1f}s): the query's next start runs at {partitions}"
    )
    return 0
