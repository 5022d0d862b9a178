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

On a ring with client tokens and TLS (docs/security.md), ``configure(..., token=...,
tls_ca=...)`` sets ``spark.statestore.token`` (or ``tokenFile``) and ``spark.statestore.tlsCa``;
left out, they come from ``STATESTORE_TOKEN`` (or ``STATESTORE_TOKEN_FILE``) and
``STATESTORE_TLS_CA``. Files named there must exist on the driver and on every executor.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from client import RingClient
from statestore.core.address import parse_address
from statestore.core.errors import InvalidAddress, StateStoreError
from statestore.core.plan import PLANS

from ._build import PROVIDER_CLASS, SUPPORTED, SparkConnectorError, jar_path
from .repartition import repartition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CONF_PREFIX",
    "PROVIDER_CLASS",
    "RING_FS_CLASS",
    "SUPPORTED",
    "SparkConnectorError",
    "check_seeds",
    "configure",
    "jar_path",
    "main",
    "repartition",
    "ring_conf",
]

CONF_PREFIX = "spark.statestore."
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
# checkpoints on the ring: checkpointLocation="ring://NAME/path" (docs/spark.md)
RING_FS_CONF = "spark.hadoop.fs.ring.impl"
RING_FS_CLASS = "statestore.spark.RingFileSystem"


def _check_address(seed: str) -> str:
    try:
        host, port = parse_address(seed, what="seed")
    except InvalidAddress as exc:
        raise SparkConnectorError(str(exc)) from exc
    return f"{host}:{port}"


def check_seeds(
    seeds: Sequence[str],
    timeout: float = 3.0,
    *,
    token: str | None = None,
    tls_ca: str | None = None,
) -> dict[str, Any]:
    """Ask the seeds for the ring view (through the SDK, with ``token`` and ``tls_ca`` as
    ``RingClient`` takes them); the first answer is returned as JSON. Raises
    SparkConnectorError naming what went wrong (no seed answering, a refused token, a node
    TLS could not verify)."""
    try:
        with RingClient(list(seeds), timeout=timeout, token=token, tls_ca=tls_ca) as ring:
            return ring.ring().to_json()
    except (StateStoreError, ValueError) as exc:
        raise SparkConnectorError(
            f"no ring seed answered as it should ({exc}): start the ring (statestore local), "
            "or fix the seeds, the token or the TLS CA"
        ) from exc


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
    token: str | None = None,
    token_file: str | None = None,
    tls_ca: str | None = None,
) -> dict[str, str]:
    """The ``spark.statestore.*`` keys for these options (unset ones keep their defaults).

    ``token`` (or ``token_file``, a file holding it) is sent as a bearer token; ``tls_ca``, a
    PEM CA file, turns HTTPS on. Files are made absolute: executors read them by path."""
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
        if restore_plan not in PLANS:
            raise SparkConnectorError(
                f"restore_plan {restore_plan!r} is not a plan name: {', '.join(PLANS)}"
            )
        conf[CONF_PREFIX + "restorePlan"] = restore_plan
    if token and token_file:
        raise SparkConnectorError("give token or token_file, not both")
    if token is not None:
        if not token or not all(0x20 < ord(c) < 0x7F for c in token):
            raise SparkConnectorError("token must be non-empty printable ASCII without spaces")
        conf[CONF_PREFIX + "token"] = token
    for key, path in (("tokenFile", token_file), ("tlsCa", tls_ca)):
        if path:
            if not os.path.isfile(path):
                raise SparkConnectorError(f"{key} {path} is not a file")
            conf[CONF_PREFIX + key] = os.path.abspath(path)
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
    token: str | None = None,
    token_file: str | None = None,
    tls_ca: str | None = None,
    check: bool = True,
) -> SparkSession.Builder:
    """Point ``builder``'s streaming state at the ring and return it.

    Sets ``spark.sql.streaming.stateStore.providerClass``, adds the provider jar (built on
    first use) to ``spark.jars`` and sets ``spark.statestore.*``: ``seeds``,
    ``restorePlan`` (default ``auto``; ``line`` and ``tree`` run through the nodes' relay),
    ``snapshotInterval`` (0 = let the ring compact),
    ``connectTimeoutMs``, ``requestTimeoutMs`` (one attempt), ``retryBudgetMs`` (all
    attempts of a commit or head read), ``maxAttempts`` (rounds over the ring's members
    within that budget), ``readTimeoutMs`` (a stalled restore body), ``restoreTimeoutMs``
    (a whole restore) and ``maxCommitBytes`` (the largest commit body); docs/spark.md says
    what each bounds. On a secured ring, ``token`` (else ``$STATESTORE_TOKEN``) or
    ``token_file`` (else ``$STATESTORE_TOKEN_FILE``) sets ``token`` or ``tokenFile``, and
    ``tls_ca`` (else ``$STATESTORE_TLS_CA``) sets ``tlsCa``. With ``check`` the seeds must
    answer now, with that token and CA: a clear SparkConnectorError instead of a failed query
    later.
    """
    if token is None and token_file is None:
        token = os.environ.get("STATESTORE_TOKEN", "").strip() or None
        token_file = None if token else os.environ.get("STATESTORE_TOKEN_FILE") or None
    tls_ca = tls_ca or os.environ.get("STATESTORE_TLS_CA") or None
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
        token=token,
        token_file=token_file,
        tls_ca=tls_ca,
    )
    if check:
        if token_file:
            with open(token_file) as f:
                token = f.read().strip()
        check_seeds(conf[CONF_PREFIX + "seeds"].split(","), token=token, tls_ca=tls_ca)
    jar = jar_path()
    options: dict[str, object] = getattr(builder, "_options", {})
    jars = [j for j in str(options.get("spark.jars") or "").split(",") if j and j != jar]
    builder = builder.config("spark.jars", ",".join([*jars, jar]))
    builder = builder.config(PROVIDER_CONF, PROVIDER_CLASS)
    builder = builder.config(RING_FS_CONF, RING_FS_CLASS)
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
