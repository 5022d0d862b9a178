"""``statestore spark-repartition``: change a stopped ring-backed Spark query's number of
state partitions from the command line (a local Spark session on the ring, a progress bar, one
line when done). The work is ``spark_connector.repartition``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from spark_connector import SparkConnectorError, configure, repartition


def run(
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
