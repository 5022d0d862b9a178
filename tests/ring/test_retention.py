"""Retention set by the writer: a commit may carry ``retain=N`` (Spark's minBatchesToRetain),
and the store's replicas keep its last N versions instead of the node's ``--retain``.

Real node processes: one store committed with ``retain=3`` loses its old versions to
compaction while a store committed without it keeps all of them; a bad ``retain`` is refused
and changes nothing.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from client import RingClient, StoreId, VersionNotFound
from statestore.wire.rows import encode_rows
from tests.ringkit import FAST, local_ring


def _commit(seed: str, store: StoreId, version: int, query: str = "") -> int:
    body = b"".join(encode_rows([(f"k{version}".encode(), b"v")]))
    url = f"http://{seed}/v1/stores/{store.path}/commit?version={version}&epoch=1{query}"
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_writer_sets_how_many_versions_its_store_keeps(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, [*FAST, "--snapshot-every", "2"]) as ring:
        short, long = StoreId("ret", 0, 0, "short"), StoreId("ret", 0, 0, "long")
        seed = ring.seeds[0]
        assert _commit(seed, short, 1, "&retain=0") == 400  # refused: nothing written
        assert _commit(seed, short, 1, "&retain=x") == 400
        for v in range(1, 13):
            assert _commit(seed, short, v, "&retain=3") == 201
            assert _commit(seed, long, v) == 201
        with RingClient(ring.seeds) as client:
            deadline = time.monotonic() + 60
            while client.versions(short)[0] < 10 - 2 and time.monotonic() < deadline:
                time.sleep(0.3)
            kept = client.versions(short)
            assert kept[0] >= 8 and kept[-1] == 12, kept  # the last 3, from a snapshot below
            assert client.versions(long) == list(range(1, 13))  # the node's default: 100
            state = client.restore(short, 10)
            assert dict(state) == {f"k{v}".encode(): b"v" for v in range(1, 11)}
            with pytest.raises(VersionNotFound):
                client.restore(short, 2)
