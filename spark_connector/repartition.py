"""Change a stopped ring-backed query's number of state partitions.

``repartition(spark, checkpoint, n)`` runs the provider's ``statestore.spark.Repartition``
in the driver's JVM: Spark's own offline repartition steps (a new batch after the last
committed one, carrying the new ``spark.sql.shuffle.partitions``), with every stateful
operator's state re-split by Spark's partitioning of that operator's keys and written through
the ring provider. The next start of the query runs at ``n`` partitions. docs/spark.md has the
details; ``statestore spark-repartition`` (statestore/cli/spark_repartition.py) is the
command-line form.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._build import NEWER_SPARK, SparkConnectorError, pyspark_home, spark_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["repartition"]

JAVA_CLASS = "statestore.spark.Repartition"


def _java_message(exc: BaseException) -> str:
    """The Java exception's own message (and Spark error condition), not py4j's stack."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return str(exc)
    text = str(java.toString())
    cond = getattr(java, "getCondition", None)
    try:
        name = cond() if cond is not None else None
    except Exception:
        name = None
    return f"[{name}] {text}" if name else text


def repartition(
    spark: SparkSession,
    checkpoint: str,
    num_partitions: int,
    *,
    enforce_exactly_once_sink: bool = True,
    threads: int = 4,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Repartition the state of the stopped ring-backed query at ``checkpoint`` to
    ``num_partitions``; returns the repartition batch's id.

    ``spark`` is a session made by ``configure()`` (its ring seeds are the query's).
    ``enforce_exactly_once_sink``: refuse when the last batch did not commit (else it is
    skipped and its input read again on the next run, as Spark's own runner does).
    ``threads``: partitions read and written at once. ``on_progress(done, total)`` is called
    with the number of stores moved while it runs. Atomic: on any failure the checkpoint is
    left as it was and the query restarts at its old count. Raises SparkConnectorError."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise SparkConnectorError(f"num_partitions must be an integer, got {num_partitions!r}")
    if num_partitions < 1:
        raise SparkConnectorError(f"num_partitions must be >= 1, got {num_partitions}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
        raise SparkConnectorError(f"threads must be an integer in 1..64, got {threads!r}")
    if not checkpoint:
        raise SparkConnectorError("checkpoint must name the query's checkpoint location")
    version = pyspark_home()[1]
    need = NEWER_SPARK["Repartition.java"]
    if spark_version(version) < need:
        raise SparkConnectorError(
            f"repartition needs pyspark >= {need[0]}.{need[1]} (Spark's offline repartition), "
            f"this is {version}"
        )
    jvm: Any = spark._jvm
    runner = jvm.statestore.spark.Repartition
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["batch"] = int(
                runner.run(
                    spark._jsparkSession,
                    str(checkpoint),
                    num_partitions,
                    enforce_exactly_once_sink,
                    threads,
                )
            )
        except Exception as exc:
            result["error"] = exc

    worker = threading.Thread(target=call, name="statestore-repartition", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        if on_progress is not None:
            done, total = (int(x) for x in str(runner.progress()).split("/"))
            on_progress(done, total)
    if "error" in result:
        raise SparkConnectorError(
            f"repartition of {checkpoint} to {num_partitions} failed, the checkpoint is as it "
            f"was: {_java_message(result['error'])}"
        ) from result["error"]
    return int(result["batch"])
