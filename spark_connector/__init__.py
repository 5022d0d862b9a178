"""Spark Structured Streaming on a statestore ring.

::

    import spark_connector
    spark = spark_connector.configure(SparkSession.builder, seeds=["127.0.0.1:7400"]).getOrCreate()

``configure`` builds (on first use) the ``RingStateStoreProvider`` jar against the installed
pyspark, and sets the provider class, ``spark.jars`` and the ring's options. Every option is
also a plain Spark conf key (``spark.statestore.*``) for spark-submit users::

    spark-submit --jars "$(statestore spark-jar)" \\
      --conf spark.sql.streaming.stateStore.providerClass=statestore.spark.RingStateStoreProvider \\
      --conf spark.statestore.seeds=10.0.0.1:7400,10.0.0.2:7400 job.py
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING

from statestore.core.address import parse_address
from statestore.core.errors import InvalidAddress

from ._build import PROVIDER_CLASS, SUPPORTED, SparkConnectorError, jar_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CONF_PREFIX",
    "PROVIDER_CLASS",
    "SUPPORTED",
    "SparkConnectorError",
    "check_seeds",
    "configure",
    "jar_path",
    "main",
    "ring_conf",
]

CONF_PREFIX = "spark.statestore."
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


def _check_address(seed: str) -> str:
    try:
        host, port = parse_address(seed, what="seed")
    except InvalidAddress as exc:
        raise SparkConnectorError(str(exc)) from exc
    return f"{host}:{port}"


def check_seeds(seeds: Sequence[str], timeout: float = 3.0) -> dict[str, object]:
    """Ask the seeds for the ring view; the first answer is returned. Raises
    SparkConnectorError naming every seed and what went wrong when none answers."""
    errors = []
    for seed in seeds:
        try:
            with urllib.request.urlopen(f"http://{seed}/v1/ring", timeout=timeout) as resp:
                view = json.loads(resp.read())
            if isinstance(view, dict) and "members" in view:
                return view
            errors.append(f"{seed}: not a statestore node")
        except (OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            errors.append(f"{seed}: {reason}")
    raise SparkConnectorError(
        "no ring seed answered (" + "; ".join(errors) + "): start the ring "
        "(statestore local) or fix the seeds"
    )


def ring_conf(
    seeds: Sequence[str],
    *,
    restore_plan: str | None = None,
    snapshot_interval: int | None = None,
    connect_timeout_ms: int | None = None,
    request_timeout_ms: int | None = None,
    max_attempts: int | None = None,
    retry_budget_ms: int | None = None,
    read_timeout_ms: int | None = None,
    restore_timeout_ms: int | None = None,
    max_commit_bytes: int | None = None,
) -> dict[str, str]:
    """The ``spark.statestore.*`` keys for these options (unset ones keep their defaults)."""
    clean = [_check_address(s) for s in seeds]
    if not clean:
        raise SparkConnectorError("configure() needs at least one ring seed (HOST:PORT)")
    conf = {CONF_PREFIX + "seeds": ",".join(clean)}
    numbers = {
        "snapshotInterval": (snapshot_interval, 0),
        "connectTimeoutMs": (connect_timeout_ms, 1),
        "requestTimeoutMs": (request_timeout_ms, 1),
        "maxAttempts": (max_attempts, 1),
        "retryBudgetMs": (retry_budget_ms, 0),
        "readTimeoutMs": (read_timeout_ms, 1),
        "restoreTimeoutMs": (restore_timeout_ms, 1),
        "maxCommitBytes": (max_commit_bytes, 1024),
    }
    for name, (value, low) in numbers.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SparkConnectorError(f"{name} must be an integer >= {low}, got {value!r}")
        conf[CONF_PREFIX + name] = str(value)
    if restore_plan is not None:
        if not restore_plan.isalpha():
            raise SparkConnectorError(f"restore_plan {restore_plan!r} is not a plan name")
        conf[CONF_PREFIX + "restorePlan"] = restore_plan
    return conf


def configure(
    builder: SparkSession.Builder,
    seeds: Sequence[str],
    *,
    restore_plan: str | None = None,
    snapshot_interval: int | None = None,
    connect_timeout_ms: int | None = None,
    request_timeout_ms: int | None = None,
    max_attempts: int | None = None,
    retry_budget_ms: int | None = None,
    read_timeout_ms: int | None = None,
    restore_timeout_ms: int | None = None,
    max_commit_bytes: int | None = None,
    check: bool = True,
) -> SparkSession.Builder:
    """Point ``builder``'s streaming state at the ring and return it.

    Sets ``spark.sql.streaming.stateStore.providerClass``, adds the provider jar (built on
    first use) to ``spark.jars`` and sets ``spark.statestore.*``: ``seeds``,
    ``restorePlan`` (default ``auto``), ``snapshotInterval`` (0 = let the ring compact),
    ``connectTimeoutMs``, ``requestTimeoutMs`` (one attempt), ``retryBudgetMs`` (all
    attempts of a commit or head read), ``maxAttempts`` (rounds over the ring's members
    within that budget), ``readTimeoutMs`` (a stalled restore body), ``restoreTimeoutMs``
    (a whole restore) and ``maxCommitBytes`` (the largest commit body); docs/spark.md says
    what each bounds. With ``check`` the seeds must answer now: a clear
    SparkConnectorError instead of a failed query later.
    """
    conf = ring_conf(
        seeds,
        restore_plan=restore_plan,
        snapshot_interval=snapshot_interval,
        connect_timeout_ms=connect_timeout_ms,
        request_timeout_ms=request_timeout_ms,
        max_attempts=max_attempts,
        retry_budget_ms=retry_budget_ms,
        read_timeout_ms=read_timeout_ms,
        restore_timeout_ms=restore_timeout_ms,
        max_commit_bytes=max_commit_bytes,
    )
    if check:
        check_seeds(conf[CONF_PREFIX + "seeds"].split(","))
    jar = jar_path()
    options: dict[str, object] = getattr(builder, "_options", {})
    jars = [j for j in str(options.get("spark.jars") or "").split(",") if j and j != jar]
    builder = builder.config("spark.jars", ",".join([*jars, jar]))
    builder = builder.config(PROVIDER_CONF, PROVIDER_CLASS)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder


def main(argv: Sequence[str] | None = None) -> int:
    """``statestore spark-jar``: print the provider jar's path, building it if needed."""
    args = list(sys.argv[1:] if argv is None else argv)
    rebuild = "--rebuild" in args
    try:
        print(jar_path(rebuild=rebuild))
    except SparkConnectorError as exc:
        print(f"statestore spark-jar: {exc}", file=sys.stderr)
        return 1
    return 0
