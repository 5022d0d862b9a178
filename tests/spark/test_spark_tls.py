"""The Spark connector end to end on a secured ring: TLS, client tokens and a cluster secret
on every node (docs/security.md), so every request of the provider must be HTTPS verified
against the ring's CA and carry a token, on both data paths.

One small query (a count per user) runs in two JVMs: first on the coordinator path, then,
after every partition folder of its checkpoint is deleted, on the direct path, which
restores the state from the ring. The token and the CA reach the jobs the way a user's would:
``STATESTORE_TOKEN`` and ``STATESTORE_TLS_CA``, read by ``spark_connector.configure``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import spark_connector
from statestore.cli.local import LocalRing
from tests.certs import ADMIN, TOKENS, make_tls, secured_args
from tests.ringkit import FAST
from tests.spark.runs import (
    drop_partition_folders,
    final_output,
    log_tail,
    run_job,
    write_inputs,
)

SPARK = "spark-job-token-000000001"


@pytest.mark.timeout(1200)
def test_query_over_tls_with_a_token_on_both_data_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    tls = make_tls(tmp_path / "tls")
    tokens = {**TOKENS, SPARK: {"queries": ["*"], "rights": ["read", "write"]}}
    monkeypatch.delenv("STATESTORE_TLS_CA", raising=False)
    monkeypatch.setenv("STATESTORE_TOKEN", ADMIN)  # LocalRing's own ring reads
    ring = LocalRing(
        str(tmp_path / "ring"),
        3,
        args=[*FAST, *secured_args(tmp_path, tls, tokens)],
        tls_ca=str(tls.ca),
    ).start()
    try:
        seeds = ring.seeds
        # configure() asks the seeds with the token and CA it will hand to the provider
        with pytest.raises(spark_connector.SparkConnectorError, match="token"):
            spark_connector.configure(
                SparkSession.builder, seeds=seeds, token="not-a-token", tls_ca=str(tls.ca)
            )
        with pytest.raises(spark_connector.SparkConnectorError, match="TLS verification"):
            spark_connector.configure(
                SparkSession.builder, seeds=seeds, token=SPARK, tls_ca=str(tls.other_ca)
            )
        token_file = tmp_path / "spark.token"
        token_file.write_text(SPARK + "\n")
        opts: dict[str, str] = spark_connector.configure(
            SparkSession.builder, seeds=seeds, token_file=str(token_file), tls_ca=str(tls.ca)
        )._options
        assert opts["spark.statestore.tokenFile"] == str(token_file)
        assert opts["spark.statestore.tlsCa"] == str(tls.ca)
        assert "spark.statestore.token" not in opts

        monkeypatch.setenv("STATESTORE_TOKEN", SPARK)
        monkeypatch.setenv("STATESTORE_TLS_CA", str(tls.ca))
        events = write_inputs(tmp_path, 1)
        spec = {"seeds": seeds, "providers": ["ring"], "operators": ["agg"]}
        coordinator = {"conf": {"spark.statestore.dataPath": "coordinator"}}
        done = run_job(tmp_path, {**spec, **coordinator}, "coordinator")
        assert done.returncode == 0, log_tail(tmp_path, "coordinator")
        assert drop_partition_folders(tmp_path / "ckpt" / "ring" / "agg") > 0
        events += write_inputs(tmp_path, 2)
        direct = {"conf": {"spark.statestore.dataPath": "direct"}}
        done = run_job(tmp_path, {**spec, **direct}, "direct")
        assert done.returncode == 0, log_tail(tmp_path, "direct")
    finally:
        ring.stop()
    counts: dict[str, int] = {}
    for e in events:
        counts[e["user"]] = counts.get(e["user"], 0) + 1
    agg = final_output(tmp_path, "ring", "agg")
    assert {u: row["n"] for u, row in agg.items()} == counts
