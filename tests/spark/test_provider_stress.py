"""The provider under stress (docs/spark.md), driven outside Spark's scheduler.

``java/statestore/spark/ProviderHarness.java`` opens stores of a real RingStateStoreProvider
the way Spark's tasks do, against real ring nodes (LocalRing), to stage what a local-mode
query cannot: two attempts of one partition in one JVM, a version re-committed by another
executor, ``loadEmpty``, commits larger than the nodes' ``--max-commit``. Faulty members are
proxies in front of real nodes (``faults.py``): stalled or cut restore bodies, a member that
accepts and hangs, an outage of a few seconds.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from client import RingClient
from spark_connector import SparkConnectorError, ring_conf
from statestore.cli.local import LocalRing
from statestore.core.ids import StoreId
from statestore.wire.manifest import decode_manifest
from tests.certs import make_tls

from .faults import FaultPlan, FaultProxy, start_proxies
from .harness import harness

FAST = ["--gossip-interval", "0.2", "--suspect-after", "1", "--down-after", "2.5"]


@pytest.fixture
def proxied(ring3: LocalRing) -> Iterator[tuple[list[FaultProxy], FaultPlan]]:
    proxies, plan = start_proxies(ring3.seeds)
    yield proxies, plan
    plan.stop.set()
    for p in proxies:
        p.shutdown()
        p.server_close()


# each scenario also with every version and overlay spilled to the local RocksDB store
# (cacheBytes=0, docs/spark.md "Memory per partition")
SPILL = pytest.mark.parametrize("spill", [{}, {"cacheBytes": 0}], ids=["heap", "spilled"])


@SPILL
def test_attempts_and_read_stores_are_isolated_and_the_stale_attempt_is_fenced(
    tmp_path: Path, ring3: LocalRing, classpath: str, spill: dict[str, int]
) -> None:
    seeds = ",".join(ring3.seeds)
    r = harness(classpath, "isolation", tmp_path / "ckpt" / "state", seeds=seeds, **spill)
    # neither the read store nor the other attempt sees attempt a's uncommitted rows
    assert r["read_sees_a"] == 1
    assert r["b_sees_a"] == 1
    assert r["b_sees_a_new_key"] is False
    assert r["a_sees_own"] == 100
    # the later attempt has the higher epoch; once it committed, the older one is fenced
    assert r["epoch_b"] > r["epoch_a"]
    assert r["b_commit"] == "ok"
    assert r["read_after_b_commit"] == 1  # a read store keeps its version
    assert "fenced" in r["a_commit"]
    assert (r["next_v2"], r["next_v2_key2"]) == (2, None)
    assert (r["ring_v2"], r["ring_v2_key2"]) == (2, None)


@SPILL
def test_cached_version_recommitted_elsewhere_is_not_trusted(
    tmp_path: Path, ring3: LocalRing, classpath: str, spill: dict[str, int]
) -> None:
    seeds = ",".join(ring3.seeds)
    r = harness(classpath, "cache", tmp_path / "ckpt" / "state", seeds=seeds, **spill)
    assert r["p2_commit"] == "ok"
    assert r["p1_v2"] == 50
    assert r["p1_hit"] == 0


def test_memory_used_counts_what_a_row_costs_on_the_heap(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """``memoryUsedBytes`` (and the executor's ``cacheBytes`` budget) counts each row as its
    key's and value's bytes plus 160: two UnsafeRow objects, their arrays' headers and the
    map's node (157 bytes measured by ``bench/spark_heap.py``; 64 undercounted 200-byte rows'
    heap by 1.3-1.4x)."""
    r = harness(classpath, "memory", tmp_path / "ckpt" / "state", seeds=",".join(ring3.seeds))
    assert r["memory"] == r["raw"] + 160 * 100, r


@pytest.mark.parametrize("path", ["direct", "coordinator"])
def test_commits_name_the_epoch_of_the_version_they_were_loaded_from(
    tmp_path: Path, ring3: LocalRing, classpath: str, path: str
) -> None:
    """Lineage (docs/design.md): the provider's commit of version N names the epoch of the
    N - 1 its store was loaded from (base_epoch), so restores follow that branch; on both
    data paths, from a cached version and a restored one; a store loaded empty names none."""
    r = harness(
        classpath,
        "lineage",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        dataPath=path,
    )
    e1, e2, e3, e4 = r["epochs"]
    assert e1 < e2 < e3 < e4
    sid = StoreId.parse(r["store"])
    with RingClient(ring3.seeds) as client:
        addr = client.ring().store_replicas(sid)[0]
    got = {}
    for v, kind in [(1, "delta"), (2, "delta"), (3, "delta"), (4, "snapshot")]:
        url = f"http://{addr}/v1/manifests/{sid.path}/{v}/{kind}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            m = decode_manifest(resp.read())
        got[v] = (m.epoch, m.base_epoch)
    assert got == {1: (e1, None), 2: (e2, e1), 3: (e3, e2), 4: (e4, None)}


@SPILL
def test_load_empty_starts_empty_and_old_rows_do_not_come_back(
    tmp_path: Path, ring3: LocalRing, classpath: str, spill: dict[str, int]
) -> None:
    seeds = ",".join(ring3.seeds)
    r = harness(classpath, "empty", tmp_path / "ckpt" / "state", seeds=seeds, **spill)
    assert r["empty_sees_old"] is None and r["empty_rows"] == 0
    assert (r["cached_v2_old"], r["cached_v2_new"]) == (None, 2)
    assert (r["ring_v2_old"], r["ring_v2_new"]) == (None, 2)


def test_state_under_the_path_only_name_is_found_after_upgrade(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    root = tmp_path / "ckpt" / "state"
    root.mkdir(parents=True)
    r = harness(classpath, "legacy", root, seeds=",".join(ring3.seeds))
    assert r["renamed"] is True
    assert r["upgraded_rows"] == 2
    assert r["upgraded_commit"] == "ok" and r["upgraded_snapshot"] == 1
    assert r["ring_v3_rows"] == 3


@pytest.mark.parametrize("validation", ["true", "false"])
def test_restored_rows_that_do_not_match_the_schema_fail_the_load(
    tmp_path: Path, ring3: LocalRing, classpath: str, validation: str
) -> None:
    conf = {"spark.sql.streaming.stateStore.formatValidation.enabled": validation}
    r = harness(
        classpath, "schema", tmp_path / "ckpt" / "state", seeds=",".join(ring3.seeds), **conf
    )
    assert r["commit"] == "ok"
    if validation == "true":
        assert "does not match the operator's state schema" in r["restore_error"], r
        assert r["cause"] == "StateStoreKeyRowFormatValidationFailure", r
    else:  # as HDFS-backed: unchecked rows load (and would be misread)
        assert r.get("restore_error") is None and r["restored_rows"] == 10, r


@SPILL
@pytest.mark.parametrize("path", ["coordinator", "direct"])
def test_commit_larger_than_max_commit_is_split(
    tmp_path: Path, classpath: str, path: str, spill: dict[str, int]
) -> None:
    # the coordinator path learns the limit from the nodes' 413; the direct path sends chunks
    # (never a commit body), so its shards follow maxCommitBytes alone; spilled, a commit's
    # rows reach their shards through local files (ShardFiles), one pass for all shards
    node_args = ["--max-commit", "200000"] if path == "coordinator" else []
    ring = LocalRing(str(tmp_path / "ring"), 3, args=[*FAST, *node_args]).start()
    conf: dict[str, Any] = {"dataPath": path, **spill}
    if path == "direct":
        conf["maxCommitBytes"] = 200000
    try:
        rows, pad, versions = 6000, 100, 3  # ~0.8 MB of rows per version, 4x the limit
        r = harness(
            classpath,
            "bulk",
            tmp_path / "ckpt" / "state",
            seeds=",".join(ring.seeds),
            rows=rows,
            pad=pad,
            versions=versions,
            **conf,
        )
    finally:
        ring.stop()
    assert r["commits"] == ["ok"] * versions
    assert r["shards"] > 1
    assert r["shard_dirs_left"] == 0  # every commit's shard files deleted, 413 rounds too
    n = rows * versions - 1  # key 0 (value 0) is removed in the second version
    assert r["restored_rows"] == n
    assert r["restored_sum"] == sum(range(rows * versions))


def test_a_spilled_version_and_its_overlay_merge_in_key_order(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # both in spill stores: one walk down both in the order of their key bytes (unsigned),
    # on int keys of every sign; the version's snapshot then restores the same rows; an
    # iterator stopped early and closed closes both stores' iterators, the commit those of
    # one never closed
    r = harness(
        classpath,
        "merged",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        cacheBytes=0,
        snapshotInterval=2,
    )
    assert r["spilled"] is True, r
    assert r["merged_equal"] is True, r
    # the spilled overlay's counts, kept without reading each row back
    assert r["overlay_rows"] == r["overlay_rows_expected"] > 0, r
    assert r["overlay_bytes"] == r["overlay_bytes_expected"] > 0, r
    assert r["iterators_while_reading"] == 2, r
    assert r["iterators_after_close"] == 0, r
    # one never closed: the commit closes it
    assert r["iterators_left_open"] == 2, r
    assert r["iterators_after_commit"] == 0, r
    assert r["restored_equal"] is True, r
    # applied to the spilled version in batches, counted by the store, not read back
    assert r["keys_after"] == r["keys_expected"], r
    assert r["bytes_after"] == r["bytes_expected"], r


def test_a_batch_reads_each_key_from_a_spilled_version_once(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # the version and the overlay both spilled, each keeps a filter of its keys: a key the
    # version holds is read from it once (a read, then a put a key later, as a write store's
    # get then put: the put recalls the read's answer); a new key is not read at all, from
    # the version (its filter; the build before read it twice) or the overlay (its filter;
    # the build before: 4 reads a key in all before the overlay's filter). Deterministic:
    # the keys' hashes are fixed, so are the filters' false positives (at most a few in 100)
    r = harness(
        classpath,
        "spill-reads",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        cacheBytes=0,
    )
    assert r["spilled"] is True and r["overlay_spilled"] is True, r
    # keys 500..1499, of which the version holds 500..999 (the build before: 1,000 reads)
    assert 500 <= r["reads"] <= 510, r
    # 100 new keys read, then put (a streaming aggregation; the build before: 196 reads)
    assert r["reads_hashed"] <= 2, r
    assert r["reads_remove"] == 1, r  # the read store's own
    assert r["same_instance"] is True, r  # committed in place: the case a stale answer hits
    assert r["rows_equal"] is True, r
    # 20,000 keys more: the version's filter grew by stages and lost none of them
    assert r["grown_spilled"] is True and r["gets_equal"] is True, r
    assert r["reads_absent"] < 300, r  # of 10,000 keys never put (the build before: 10,000)
    assert r["keys_after"] == r["keys_expected"] == 21600, r
    assert r["bytes_after"] == r["bytes_expected"], r
    assert r["restored_equal"] is True, r


def test_a_spilled_versions_key_filter_stays_bounded(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # a version committed in place keeps its filter batch after batch: putting the same keys
    # again takes no room, and keys that come and go (removed keys keep their bits) make it
    # build itself again from the store; it never answers a held key absent
    r = harness(
        classpath,
        "filter-bounds",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        cacheBytes=0,
    )
    assert r["spilled"] is True, r
    assert 0 < r["same_bytes_before"] == r["same_bytes_after"], r
    assert r["refilters"] >= 1, r  # 40,000 keys went in, 5,000 held at the end
    # sized for the 5,000 keys held, not the 45,000 ever put (67 KB at 12 bits a key; ~98 KB
    # of stages without the rebuilds): under half of those 45,000's after any round
    assert 0 < r["churn_bytes"] < 45_000 * 12 // 8 // 2, r
    assert r["gets_equal"] is True, r
    assert r["keys_after"] == r["keys_expected"] == 5000, r
    assert r["restored_equal"] is True, r


def test_an_overlays_presized_table_is_counted_in_the_cache(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # an overlay made for the batch before's 50,000 rows (a table of 131,072 slots, 512 KiB)
    # counts that table in cacheBytes before any row is put, and gives it back at the abort
    # and at a refused commit
    r = harness(
        classpath, "table-counted", tmp_path / "ckpt" / "state", seeds=",".join(ring3.seeds)
    )
    assert r["table"] == 16 + 131_072 * 4, r
    assert r["counted"] == r["table"], r
    assert r["given_back"] == r["table"], r
    # a refused commit's overlay lets go of what it counted (the build before kept it counted
    # until the overlay was collected); the table's size assumes a heap under 32 GiB
    assert "fenced" in r["fenced_commit"], r
    assert r["fenced_held_before"] > r["table"], r
    assert r["fenced_held_after"] == 0, r


def test_a_commit_whose_apply_fails_part_way_keeps_no_half_applied_version(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # the ring acknowledged version 2; applying it in place in the JVM fails after 500 of
    # 1,000 rows (a test hook). The build before kept that instance cached as version 1
    # (half of version 2's rows in it): a load of version 1 that read a lagging replica's
    # head could take it and count the batch twice (review 86). Now it is let go, the
    # overlay gives back what it counted, and the retry is exact
    r = harness(classpath, "apply-fails", tmp_path / "ckpt" / "state", seeds=",".join(ring3.seeds))
    assert r["in_place"] is True, r
    assert "applying it in this JVM failed" in r["commit"], r
    assert r["has_committed"] is False, r
    assert r["overlay_held_after"] == 0, r
    assert r["cached_after"] == "none", r
    assert r["retry_reads_version_1"] is True, r
    assert r["retry_commit"] == "ok", r
    assert r["version_2_equal"] is True, r


def test_the_jvms_key_filters_are_held_to_a_total(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # each filter was capped, not their sum: an executor holding many spilled partitions
    # held a filter for each, past the cache (review 86). With a 20 KiB total (one ~15 KiB
    # filter fits), a copy of a spilled version gets none and reads its store, exact; an
    # overlay's filter is let go once its commit is sent, so its version has the room
    r = harness(
        classpath,
        "filter-total",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        cacheBytes=0,
    )
    assert r["spilled"] is True and r["copied"] is True, r
    assert 0 < r["v1_filter"] <= 16 << 10, r
    # the overlay's filter was counted until its commit was sent, then given to the version
    assert r["total_before_commit"] == r["overlay_filter"] > 0, r
    assert r["total_after_commit"] == r["v1_filter"], r
    assert r["copy_filter"] == 0, r
    assert r["v1_filter"] <= r["total"] <= 20 << 10, r
    # a version without a filter for want of room does not walk its store at each commit
    assert r["in_place"] is True and r["walks_while_full"] == 0, r
    assert r["gets_equal"] is True, r
    assert r["total_after_close"] == 0, r


def test_a_key_filter_past_its_cap_is_let_go_and_made_again(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # a filter past its cap (16 KiB here, an eighth of cacheBytes by default) is let go: every
    # read asks the spill store and finds what it holds; once the version shrinks, its commit
    # builds the filter again from the store
    r = harness(
        classpath,
        "filter-cap",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        cacheBytes=0,
    )
    assert r["spilled"] is True and r["same_instance"] is True, r
    assert r["capped_bytes"] == 0, r
    assert r["capped_reads_absent"] == 1000, r  # no filter: each absent key read
    assert r["capped_gets_equal"] is True, r
    assert 0 < r["remade_bytes"] <= 8 << 10, r
    assert r["remade_reads_absent"] < 100, r  # the filter answers most absent keys
    assert r["remade_gets_equal"] is True, r
    assert r["keys_after"] == r["keys_expected"] == 1000, r
    assert r["restored_equal"] is True, r
    # the rule sizes a filter by all its stages (one stage's size stops growing at 4M keys)
    assert r["chain_small"] is True and r["chain_two_stages"] is True, r
    assert r["one_stage_stops"] is True, r


def test_prefix_scans_of_a_spilled_version_after_batched_applies(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    # a committed batch goes into the spilled version in write batches: the prefix index
    # follows its puts and removes
    r = harness(
        classpath,
        "prefix-merged",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        cacheBytes=0,
    )
    assert r["spilled"] is True, r
    assert r["prefix_equal"] is True and r["rows"] > 500, r


@SPILL
def test_change_feed_and_replay_read_each_versions_own_changes(
    tmp_path: Path, ring3: LocalRing, classpath: str, spill: dict[str, int]
) -> None:
    # maxCommitBytes small enough that version 4 (3,000 rows of ~130 bytes) is re-split
    r = harness(
        classpath,
        "changes",
        tmp_path / "ckpt" / "state",
        seeds=",".join(ring3.seeds),
        maxCommitBytes=200000,
        rows=3000,
        **spill,
    )
    assert r["batch0"] == sorted(f"{i}={i}" for i in range(10))
    # one change per key: the last put; nothing for key 10 (added and removed), nor key 99
    assert r["batch1"] == ["0=100", "1=1002", "2 deleted"]
    # version 3 was sent whole (loadEmpty): the difference from version 2
    assert r["batch2"] == sorted(["20=20", *(f"{k} deleted" for k in (0, 1, 3, 4, 6, 7, 8, 9))])
    assert r["shards_v4"] > 1 and r["shards_v5"] == r["shards_v4"]
    assert r["batch3"] == 3000
    assert r["batch4"] == sorted(["1000=7", "1001 deleted", "5=55"])
    assert r["rows_v5"] == 3000 - 1 + 2
    assert all(r[f"replay_from_{s}_equal"] for s in range(1, 6)), r
    assert r["replay_1_2"] == sorted(["0=100", "1=1002", *(f"{i}={i}" for i in range(3, 10))])
    assert r["replay_commit"] == "ok" and r["v6_has_replayed_put"] is True
    assert r["rows_v6"] == r["rows_v5"] + 1
    assert "replayReadStateFromSnapshot" in r["read_only_replay"]
    assert "version 9" in r["missing_version"] and "not on the ring" in r["missing_version"]


def _restores_served(ring: LocalRing) -> dict[str, float]:
    """Restores the ring's nodes served (statestore_restore_seconds_count), by path: ``state``
    (a node restoring for a caller) and ``relay`` (a hop of a line or tree plan)."""
    served = {"state": 0.0, "relay": 0.0}
    for seed in ring.seeds:
        with urllib.request.urlopen(f"http://{seed}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for path, count in re.findall(
            r'^statestore_restore_seconds_count\{path="(\w+)"\} (\S+)$', text, re.M
        ):
            served[path] += float(count)
    return served


@pytest.mark.parametrize("plan", ["star", "auto", "line", "tree"])
def test_direct_path_runs_line_and_tree_plans_through_the_nodes_relay(
    tmp_path: Path, ring3: LocalRing, classpath: str, plan: str
) -> None:
    """On the direct path the JVM reads star (and auto) itself: no node restores for it. A
    line or tree plan is run by a node through the relay, and the rows are the same."""
    seeds = ",".join(ring3.seeds)
    root = tmp_path / "ckpt" / "state"
    written = harness(classpath, "bulk", root, rows=2000, pad=20, versions=3, seeds=seeds)
    assert written["commits"] == ["ok"] * 3 and written["restored_rows"] == 3 * 2000 - 1
    before = _restores_served(ring3)
    r = harness(classpath, "restore", root, version=3, seeds=seeds, restorePlan=plan)
    assert r.get("restore_error") is None, r
    assert (r["restored_rows"], r["restored_sum"]) == (3 * 2000 - 1, written["restored_sum"])
    served = {k: v - before[k] for k, v in _restores_served(ring3).items()}
    if plan in ("star", "auto"):
        assert served == {"state": 0, "relay": 0}, served
    else:
        assert served["state"] == 1 and served["relay"] >= 1, served


def test_restore_plan_that_is_not_a_plan_is_refused(tmp_path: Path, classpath: str) -> None:
    r = harness(
        classpath,
        "restore",
        tmp_path / "ckpt" / "state",
        version=1,
        seeds="127.0.0.1:1",
        restorePlan="spiral",
    )
    assert "is not a plan name: star, line, tree or auto" in r["restore_error"], r
    with pytest.raises(SparkConnectorError, match="not a plan name"):
        ring_conf(["127.0.0.1:1"], restore_plan="spiral")


def _restore_past_a_fault(
    tmp_path: Path,
    proxied: tuple[list[FaultProxy], FaultPlan],
    classpath: str,
    fault: str,
    conf: dict[str, Any],
    timeout: float = 120,
    restore_classpath: str | None = None,
    jvm: tuple[str, ...] = (),
) -> FaultPlan:
    """3,000 rows written through the proxies, then version 1 restored (direct path, whole)
    with ``fault`` on the first chunk read: exact, read from another member after the
    faulty one. The plan, for what each test checks of it."""
    proxies, plan = proxied
    conf = {"seeds": ",".join(p.address for p in proxies), **conf}
    root = tmp_path / "ckpt" / "state"
    r = harness(classpath, "bulk", root, rows=3000, pad=20, **conf)
    assert r["restored_rows"] == 3000
    plan.faults["state"] = [fault]
    plan.agents.clear()
    cp = restore_classpath or classpath
    r = harness(cp, "restore", root, version=1, timeout=timeout, jvm=jvm, **conf)
    assert r.get("restore_error") is None, r
    assert r["restored_rows"] == 3000 and r["restored_sum"] == sum(range(3000))
    assert plan.seen["state"] >= 2  # the faulty attempt, then another member
    return plan


@pytest.mark.parametrize("fault", ["stall", "cut"])
def test_restore_body_stalled_or_cut_finishes_from_another_member(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str, fault: str
) -> None:
    conf = {"readTimeoutMs": 2000, "restoreTimeoutMs": 60000}
    plan = _restore_past_a_fault(tmp_path, proxied, classpath, fault, conf)
    # the direct path's reads went over the pooled client (RingTransport.get, PooledGets),
    # whose abort ended the stalled read (closing its body would have waited for the rest)
    assert plan.agents["state"] == {"statestore-spark"}, plan.agents


@pytest.mark.parametrize("fault", ["trickle", "bloat"])
def test_a_read_that_trickles_or_overruns_is_cut_and_read_elsewhere(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str, fault: str
) -> None:
    """A holder that keeps sending header lines (each socket read gets a byte in time) is cut
    at ``requestTimeoutMs``; one whose body runs past the size the manifest gives is refused
    at that size, the rest unread (closing a pooled body would read it to its end first).
    The restore finishes from another member; the proxy keeps at it for 120 s, past the
    harness's time limit."""
    conf = {"restoreTimeoutMs": 90000, "readTimeoutMs": 60000}
    # the trickle is cut by the answer's time limit; the bloated body by its size alone
    conf["requestTimeoutMs"] = 3000 if fault == "trickle" else 60000
    _restore_past_a_fault(tmp_path, proxied, classpath, fault, conf, timeout=50)


def test_direct_reads_without_apache_httpclient_on_the_classpath(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str
) -> None:
    """Where Spark's jars lack Apache HttpClient, the direct path reads through java.net.http
    (the pooled client is never linked), stalls still cut."""
    parts = []
    for part in classpath.split(":"):
        if part.endswith("/*"):  # pyspark's jars: each but httpclient's
            jars = sorted(Path(part[:-2]).glob("*.jar"))
            parts += [str(j) for j in jars if not j.name.startswith("httpclient-")]
        else:
            parts.append(part)
    assert len(parts) > 3 and not any(Path(p).name.startswith("httpclient-") for p in parts)
    conf = {"readTimeoutMs": 2000, "restoreTimeoutMs": 60000}
    plan = _restore_past_a_fault(
        tmp_path, proxied, classpath, "stall", conf, restore_classpath=":".join(parts)
    )
    agents = plan.agents["state"]
    assert agents and all(a.startswith("Java-http-client") for a in agents), agents


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize("client", ["pooled", "jdk"])
@pytest.mark.parametrize("san", [True, False], ids=["san", "cn-only"])
def test_direct_reads_check_the_nodes_name_as_java_net_http_does(
    tmp_path: Path, classpath: str, san: bool, client: str
) -> None:
    """Both clients of the direct path's reads trust the ring's CA and check the node's
    address against its certificate's subject alternative names: a certificate that names
    127.0.0.1 only as its common name is refused (Apache's own verifier alone would take it)."""
    tls = make_tls(tmp_path / "tls", san=san)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        jvm = ("-Dstatestore.spark.httpClient=jdk",) if client == "jdk" else ()
        r = harness(classpath, "get", tmp_path, jvm=jvm, address=address, tlsCa=tls.ca)
        r_other = harness(classpath, "get", tmp_path, jvm=jvm, address=address, tlsCa=tls.other_ca)
    finally:
        server.shutdown()
        server.server_close()
    if san:
        assert r == {"status": 200}, r
    else:
        assert "No subject alternative names" in r.get("error", ""), r
    assert "SSLHandshakeException" in r_other.get("error", ""), r_other  # not the ring's CA


@pytest.mark.parametrize("client", ["pooled", "jdk"])
def test_a_read_from_a_silent_node_ends_when_its_task_is_interrupted(
    tmp_path: Path, classpath: str, client: str
) -> None:
    """Spark kills a task by interrupting its thread: a direct-path read waiting on a node
    that accepted and never answers ends with InterruptedException, within a minute, not
    at its 10-minute socket timeout (a blocking socket read ignores interrupts; the watchdog
    aborts the exchange)."""
    held: list[Any] = []
    silent = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                held.append(silent.accept()[0])  # never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        jvm = ("-Dstatestore.spark.httpClient=jdk",) if client == "jdk" else ()
        r = harness(classpath, "interrupted-get", tmp_path, jvm=jvm, address=address)
    finally:
        silent.close()
        for c in held:
            c.close()
    assert r.get("ended") is True and r.get("error") == "InterruptedException", r


def test_reads_run_together_keep_their_order_and_fail_with_their_own_error(
    tmp_path: Path, classpath: str
) -> None:
    """A lazy load's chains and indexes are read at once (RingDirect.together), up to 8 at a
    time on threads shared by every caller: results in the calls' order whatever order they
    finish in; the first call to fail fails them all at
    once with its own error (a call hanging past the harness's timeout is not waited for);
    when the deadline passes first, a call failing just after it is the error's cause."""
    r = harness(classpath, "together", tmp_path)
    assert r["order"] == [0, 1, 2, 3, 4, 5], r
    # 20 calls a round, up to 8 at once, on the JVM's shared threads (a pool a call before:
    # 8 new threads a round, so a read-ahead window started 8 threads)
    assert r["rounds"] == [list(range(20))] * 3, r
    assert 1 < r["most_at_once"] <= 8, r
    assert r["threads"] < 24, r
    assert r["failed"] == "chunk x could not be read", r
    assert r["late"] == "late: the restore deadline passed", r
    assert r["late_cause"] == "node y: read cut", r


def test_a_byte_bounded_lru_drops_the_least_recently_used_and_counts_what_it_holds(
    tmp_path: Path, classpath: str
) -> None:
    """The LRU a lazy base keeps its decoded blocks, looked-up rows and parsed indexes in
    (ByteLru: one class for the three, which were written out three times): under a 100-byte
    limit the least recently used entry goes first, the entry just put stays whatever it
    costs (its caller is about to use it), a replaced entry counts its new bytes once, and
    the executor's count (StateBudget) moves with the bytes held; from 4 threads at once the
    bytes held stay their entries' sum, within the limit but for the newest entry."""
    r = harness(classpath, "byte-lru", tmp_path)
    assert r["dropped"] == ["b"] and r["held"] == 80, r
    assert r["has"] == [True, False, True], r
    assert r["big_held"] == 250 and r["big_size"] == 1, r
    assert r["replaced_held"] == 10 and r["counted"] == 10, r
    assert r["consistent"] is True and r["all_dropped"] == ["b", "a", "c"], r
    # x replaced after y: y, older, goes before it
    assert r["replaced_order"] == [False, False, True, True], r
    assert r["replaced_order_held"] == 80, r
    assert r["removed"] == 1 and r["removed_dropped"] == ["x"], r
    assert r["removed_held"] == 40 and r["removed_counted"] == -40, r
    assert r["refused"] == [False, False, 40], r
    assert r["threads_consistent"] is True and r["threads_counted"] is True, r
    assert 0 < r["threads_most"] <= 200 + 30, r


def test_a_read_ahead_reaches_the_lazy_version_when_another_provider_of_its_store_closed(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """Spark's state reader opens a second provider of a store in the task's JVM and closes
    it: the batch's read-ahead still finds the task's lazily loaded version (it found none
    once the second provider closed, when one provider a store was registered) and brings
    the keys' values in lookups; the version then answers them exactly. A few keys of a
    chunk are read from their blocks in the read-ahead, in no lookup. Once no provider of
    the store holds the version lazily, a batch's rows are no longer windowed and copied
    for a read-ahead (`RingStateStoreProvider.readsAhead`: a build's batches)."""
    seeds = ",".join(ring3.seeds)
    conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0"}
    r = harness(classpath, "read-ahead", tmp_path / "ckpt" / "state", seeds=seeds, **conf)
    assert r["lazy"] is True, r
    assert 90 <= r["brought"] <= 100 and r["failed"] == 0, r  # a key whose block is held: none
    assert r["values"] == list(range(0, 2000, 20)), r
    # 5 keys of one chunk: fewer than LazyBase.LOOKUP_MIN_KEYS, read from their blocks in the
    # read-ahead (the build before left them to the task's reads: none brought)
    assert r["few_brought"] == r["few_from_blocks"] == 5 and r["few_lookups"] == 0, r
    assert r["few_values"] == list(range(1, 2000, 400)), r
    # windows are copied and read ahead while the version is lazy, or not yet known; once
    # every provider of the store holds it whole, the rows go through as they come
    assert r["reads_ahead_lazy"] is True and r["reads_ahead_other"] is True, r
    assert r["reads_ahead_whole"] is False, r
    assert r["reads_ahead_first"] is False, r  # version 0: the empty state a query starts from


def test_a_lazy_load_reads_no_index_and_a_read_ahead_reads_none_either(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """A version loaded lazily over a base of several chunks reads at most the first chunk's
    index (the first row's format check), where the build before read every chunk's index at
    the load: a restart's cost grew with the state. A read-ahead of keys spread over every
    chunk goes to the nodes, which hold the indexes, a lookup a chunk, and reads none; a
    read-ahead of a few keys a chunk reads their chunks' indexes and blocks, and sends no
    lookup; keys asked for without a read-ahead read their chunks' indexes, once each, and a
    block a key.
    Every value is exact, and keys the base lacks are answered absent."""
    seeds = ",".join(ring3.seeds)
    conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0"}
    r = harness(classpath, "lazy-indexes", tmp_path / "ckpt" / "state", seeds=seeds, **conf)
    assert r["lazy"] is True and r["chunks"] >= 3, r
    assert r["loaded_indexes"] <= 1 and r["ahead_indexes"] <= 1 and r["failed"] == 0, r
    assert r["values"] == [*range(3, 40_000, 400), *[None] * 200], r
    # a lookup a chunk: a key of a group split over two chunks is asked of both chunks' (a
    # first draft sent such keys in lookups of their own: 7 here); the first chunk's index
    # was read (the format check), so its keys go in a lookup of their own, and those it
    # shares with the next in that one's and in another of the first chunk
    assert r["ahead_lookups"] <= r["chunks"] + 1, str({k: v for k, v in r.items() if k != "values"})
    # 3 keys of 3 chunks while other tasks' read-aheads hold all the room for indexes (the
    # LRU, shared: each took half of it, however many ran, before): no index read, a lookup
    # a chunk
    # whose index is not held (keys of chunks whose indexes are held, as the first chunk's
    # is, are read from their blocks, or found in a block held)
    assert r["crowded_indexed_before"] < r["chunks"], r
    assert r["crowded_indexes"] == 0 and r["crowded_lookups"] >= 1, r
    assert r["crowded_values"] == [6, 20_006, 39_006], r
    # 3 keys, fewer than readAheadMinKeys of any chunk: read from their blocks, their chunks'
    # indexes read first, and no lookup (the build before sent a lookup a chunk)
    assert r["sparse_lookups"] == 0 and r["sparse_from_blocks"] == 3, r
    assert r["sparse_values"] == [5, 20_005, 39_005], r
    assert r["later"] == list(range(1, 40_000, 800)), r
    assert r["later_indexes"] == r["chunks"], str({k: v for k, v in r.items() if k != "values"})


def test_what_the_jvm_holds_of_a_lazy_base_goes_when_no_version_reads_it(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """A lazy base's indexes, decoded blocks and memo rows, counted in the cache, stay while a
    version reads the base (a version made whole while its copy still reads it keeps them)
    and go when none does: once the copy is whole too (but the blocks, which another
    provider's lazy load of the same version shares), and when a provider whose version
    reads the base is closed; when a copy no store holds is collected (its Cleaner); and a
    version made whole after it was retired holds and counts nothing. The build before kept
    them until newer entries pushed them out: after the prefetch made every version whole,
    up to 7/16 of the cache for nothing."""
    seeds = ",".join(ring3.seeds)
    conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0"}
    r = harness(classpath, "forget", tmp_path / "ckpt" / "state", seeds=seeds, **conf)
    want = list(range(1, 40_000, 800))
    assert r["lazy"] is True and r["values"] == want and r["values_whole"] == want, r
    indexes, blocks, memo = r["read"]
    assert indexes > 0 and blocks > 0 and memo > 0, r
    assert r["one_whole"] == r["read"], r  # the copy reads the base still
    # the copy whole: no version reads the first base, whose indexes and memo rows go; the
    # other provider's base (the index its load read) shares its blocks, which stay
    assert r["other_lazy"] is True and r["with_other"] > indexes, r
    assert r["both_whole"] == [r["with_other"] - indexes, blocks, 0], r
    assert r["first_indexed"] == 0 and r["consistent"] is True, r
    assert r["late_read"] is True and r["after_late"] == r["both_whole"], r
    assert r["other_values"] == want and r["other_indexes"] > 0, r
    assert r["closed"] == [0, 0, 0] and r["closed_consistent"] is True, r
    # a copy let go without being retired: its Cleaner lets the base go once it is collected
    assert r["last_values"] == want and all(b > 0 for b in r["orphan_reads"]), r
    assert r["collected"] == [0, 0, 0], r
    # a version retired, then made whole (a prefetch's merge that lost the race): nothing
    # more is held or counted
    assert r["again_values"] == want and r["retired_held"] == [0, 0, 0], r
    assert r["retired_whole"] == "ok" and r["retired_after"] == [[0, 0, 0], 0, 0], r


def test_a_read_ahead_asks_a_split_group_key_only_of_the_chunk_a_held_index_leaves(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """Keys of a key group split over two chunks, A and B, all of them in B, read ahead with
    A's index held and B's not: A's index rules them out, so they are asked of B alone, in
    one lookup (asked of both, as when neither index is held, they cost two), B's index is
    left to its node, and every value is exact."""
    seeds = ",".join(ring3.seeds)
    # version 1 a snapshot: its chunks carry Bloom filters (a delta's index cannot rule out a
    # key its chunk's blocks span)
    conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0", "snapshotInterval": "1"}
    r = harness(classpath, "split-group", tmp_path / "ckpt" / "state", seeds=seeds, **conf)
    assert r["lazy"] is True and r["split"] is True, r
    assert r["in_b"] >= 8 and r["b_indexed"] is False, r  # at least readAheadMinKeys: a lookup
    assert r["split_lookups"] == 1 and r["split_indexes"] == 0, r
    assert r["split_brought"] == r["in_b"], r
    assert r["split_values"] == r["split_want"], r


def test_the_indexes_a_lazy_base_reads_are_bounded_by_a_quarter_of_the_cache(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """Under a 100 KB cache, whose quarter (the LRU of indexes, counted in the cache) holds
    one of the base's four ~15 KB chunk indexes, keys read alone from every chunk read
    each chunk's index, and the JVM holds no more index bytes than the LRU's (the build
    before kept every index it read as long as the version lived: they grew with the chunks
    its batches touched, outside the cache): a dropped index is read again when a key
    needs it. Every value is exact, and again from the memo of rows, and from 4 threads
    reading at once, after which the LRU's bytes are its entries' sum."""
    seeds = ",".join(ring3.seeds)
    conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0", "cacheBytes": "100000"}
    r = harness(classpath, "index-bound", tmp_path / "ckpt" / "state", seeds=seeds, **conf)
    want = list(range(1, 40_000, 800))
    assert r["lazy"] is True and r["chunks"] >= 3, r
    assert r["values"] == want and r["again"] == want, r
    # one index held at a time: a key of another chunk drops it, and reads its own
    assert r["indexes_read"] > r["chunks"], r
    assert 0 < r["held"] <= r["limit"] and 0 < r["held_again"] <= r["limit"], r
    assert r["chunks_indexed"] < r["chunks"], r
    # 4 threads at once, each dropping the others' indexes: exact, and the LRU's bytes agree
    assert r["threads_wrong"] == [] and r["consistent"] is True, r
    assert 0 < r["threads_held"] <= r["limit"], r
    # the 4 providers closed: their bases' indexes go (the first provider's version reads on)
    assert r["closed_held"] < r["threads_held"] and r["closed_consistent"] is True, r


def test_a_lazy_version_past_the_horizon_stays_lazy_while_its_base_starts_its_chains(
    tmp_path: Path, ring3: LocalRing, classpath: str
) -> None:
    """A version loaded lazily and committed 6 versions on (no newer snapshot: the nodes fold
    every 10 deltas) reads its chains again at the horizon (5 versions) and, still starting at
    its base, stays lazy: one load missed the cache, the version holds what it wrote (not the
    base's 2,000 rows of ~100 bytes), and every read through it is exact."""
    seeds = ",".join(ring3.seeds)
    conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0"}
    r = harness(classpath, "horizon", tmp_path / "ckpt" / "state", seeds=seeds, **conf)
    assert r["misses"] == [1, 0, 0, 0, 0, 0, 0], r
    assert r["base"] == [1500] * 7, r
    assert r["last"] == [0] + [1000 * v for v in range(1, 7)], r
    assert max(r["held"]) < 20_000, r  # 7 rows of ~300 bytes counted; whole: 608,000


@pytest.mark.timeout(600)
def test_a_lazy_version_whose_base_the_ring_dropped_reads_the_newer_one(
    tmp_path: Path, classpath: str
) -> None:
    """Nodes folding a snapshot every delta (``--snapshot-every 1``, below the 4 the horizon
    assumes) thin the lazy version's base (version 3, folded) away 2 versions after it was
    loaded: a read of a key only that base held, which failed on the build before (no live
    holder of the chunk, after every retry, and in every retry of the task alike), reads the
    snapshot the version's chains start at now, and every answer, and the next version
    committed through it, is exact."""
    ring = LocalRing(
        str(tmp_path / "ring"), 1, args=[*FAST, "--replicas", "1", "--snapshot-every", "1"]
    ).start()
    try:
        conf = {"lazyRestore": "true", "prefetchBytesPerSec": "0"}
        root = tmp_path / "ckpt" / "state"
        r = harness(classpath, "vanished", root, timeout=400, seeds=ring.seeds[0], **conf)
    finally:
        ring.stop()
    assert r["lazy"] and r["base"] == 3 and r["gone"], r
    assert r["read"] == [1500, 1999, 3000, 4000, 1, None], r
    assert r["rebased"] and r["new_base"] > 3, r
    # the old base, read by no version since the rebase, holds no index (they went with it)
    assert r["first_indexed"] == 0 and r["consistent"] is True, r
    assert r["commit"] == "ok", r
    assert r["after"] == [1500, 3000, 6000, None], r


def test_direct_reads_go_through_java_net_http_when_told(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str
) -> None:
    """``-Dstatestore.spark.httpClient=jdk`` (docs/spark.md): the escape hatch from the pooled
    client sends the direct path's reads through java.net.http, stalls still cut."""
    conf = {"readTimeoutMs": 2000, "restoreTimeoutMs": 60000}
    jdk = ("-Dstatestore.spark.httpClient=jdk",)
    plan = _restore_past_a_fault(tmp_path, proxied, classpath, "stall", conf, jvm=jdk)
    agents = plan.agents["state"]
    assert agents and all(a.startswith("Java-http-client") for a in agents), agents


def test_restore_is_bounded_by_its_deadline(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str
) -> None:
    proxies, plan = proxied
    seeds = ",".join(p.address for p in proxies)
    root = tmp_path / "ckpt" / "state"
    conf = {"seeds": seeds, "readTimeoutMs": 60000, "restoreTimeoutMs": 4000}
    harness(classpath, "bulk", root, rows=500, pad=20, **conf)
    plan.faults["state"] = ["stall"] * 50  # every member stalls mid-body
    r = harness(classpath, "restore", root, version=1, timeout=120, **conf)
    assert "cannot load version 1" in r["restore_error"]


def test_ring_outage_of_a_few_seconds_is_ridden_out(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str
) -> None:
    proxies, plan = proxied
    seeds = ",".join(p.address for p in proxies)
    root = tmp_path / "ckpt" / "state"
    plan.down_until = time.monotonic() + 4.0  # every member answers 503 for 4 s
    r = harness(classpath, "bulk", root, rows=200, versions=3, seeds=seeds, retryBudgetMs=30000)
    assert r["commits"] == ["ok", "ok", "ok"]
    assert r["restored_rows"] == 3 * 200 - 1


def test_member_that_accepts_and_hangs_costs_one_attempt_timeout(
    tmp_path: Path, proxied: tuple[list[FaultProxy], FaultPlan], classpath: str
) -> None:
    proxies, plan = proxied
    seeds = ",".join(p.address for p in proxies)
    plan.faults["commit"] = ["hang"]
    r = harness(
        classpath,
        "bulk",
        tmp_path / "ckpt" / "state",
        rows=100,
        seeds=seeds,
        requestTimeoutMs=2000,
        retryBudgetMs=30000,
    )
    assert r["commits"] == ["ok"]
    assert plan.seen["commit"] >= 2
    assert r["restored_rows"] == 100
