"""Recovery plans on real node processes: every shape restores exactly, and survives a hop
killed mid-transfer, a corrupted replica and a slow node by rerouting only what is missing."""

from __future__ import annotations

import random
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from client import RingClient, StoreId
from statestore.cli.local import LocalRing
from tests.ringkit import FAST, local_ring

Ref = dict[bytes, bytes]


def counts_workload(client: RingClient, sid: StoreId, versions: int, keys: int, seed: int) -> Ref:
    """An aggregation-like chain: each delta overwrites counts of existing keys, adds a few
    new ones and deletes some, so folding shrinks it."""
    rng = random.Random(seed)
    state: Ref = {}
    for v in range(1, versions + 1):
        n = keys if v == 1 else keys // 4
        puts = {
            f"key-{rng.randrange(keys + v * 20):07d}".encode(): rng.randbytes(60) for _ in range(n)
        }
        dels = [k for k in rng.sample(sorted(state), min(10, len(state))) if k not in puts]
        client.commit(sid, v, puts, dels, {"offset": v}, epoch=1)
        state.update(puts)
        for k in dels:
            del state[k]
    return state


@pytest.fixture(scope="module")
def ring5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRing]:
    base = tmp_path_factory.mktemp("ring5")
    with local_ring(base, 5, [*FAST, "--snapshot-every", "1000"]) as ring:
        yield ring


def test_every_plan_restores_exactly(ring5: LocalRing) -> None:
    sid = StoreId("plans", 0, 0)
    with RingClient(ring5.seeds, chunk_size=32 * 1024) as client:
        state = counts_workload(client, sid, 12, 4000, seed=1)
        seen = {}
        for plan in ("star", "line", "tree", "auto"):
            st = client.restore(sid, plan=plan)
            assert dict(st) == state, plan
            assert st.positions == {"offset": 12}
            assert st.stats["rerouted"] == 0 and not st.stats["failed_hops"]
            seen[plan] = st
        assert seen["auto"].plan in ("star", "line", "tree")
        assert "auto: predicted" in seen["auto"].stats["reason"]
        # line: one stream through every source; tree: folding cut the bytes into the restorer
        assert len(seen["line"].stats["hops"]) == len(ring5.seeds)
        assert seen["tree"].stats["bytes_in"] < seen["star"].stats["bytes_in"] / 2
        assert seen["line"].stats["bytes_in"] == seen["star"].stats["bytes_in"]
        # the same for an older version, and for several stores at once
        older = client.restore(sid, 5, plan="tree")
        assert dict(older) == dict(client.restore(sid, 5, plan="star"))


def test_root_killed_mid_stream_reroutes_only_the_rest(tmp_path: Path) -> None:
    with local_ring(tmp_path, 4) as ring:
        sid = StoreId("midkill", 0, 0)
        with RingClient(ring.seeds, chunk_size=256 * 1024) as writer:
            state = counts_workload(writer, sid, 4, 300_000, seed=2)
        # A slow restorer (8 MB/s against ~20-30 MB to move, more than the socket buffers on
        # the way can hold) guarantees the stream is still running when we kill its root.
        with RingClient(ring.seeds, ingress=8e6) as client:
            for plan_kind in ("line", "tree"):
                plan = client.explain(sid, plan=plan_kind)
                assert plan.root is not None
                victim = next(i for i, p in enumerate(ring.procs) if p.address == plan.root.address)
                killed: list[int] = []

                def kill_once(n: int, victim: int = victim, killed: list[int] = killed) -> None:
                    if not killed:
                        killed.append(n)
                        ring.kill(victim)

                # run the very plan whose root is killed (a fresh ``restore`` plans again, and
                # may pick another root from what it learned since)
                restorer = client._async._restorer
                chain = client._call(restorer.plan(client.ring(), sid, 4, plan_kind))[0]
                result = client._call(
                    restorer.run(client.ring(), sid, chain, plan, progress=kill_once)
                )
                assert killed, "the restore never received a byte"
                assert result.state == state
                assert any(f["hop"] == plan.root.address for f in result.stats["failed_hops"])
                # what had arrived was kept: only the rest came from other replicas
                assert 0 < result.stats["rerouted"] < result.stats["chunks"], result.stats
                ring.restart(victim)
                ring.wait_ring(4)


def test_dead_relay_in_the_plan_is_routed_around(tmp_path: Path) -> None:
    with local_ring(tmp_path, 5) as ring:
        sid = StoreId("deadhop", 0, 0)
        with RingClient(ring.seeds, chunk_size=16 * 1024) as client:
            state = counts_workload(client, sid, 6, 3000, seed=3)
            for plan_kind in ("line", "tree"):
                plan = client.explain(sid, plan=plan_kind)
                assert plan.root is not None and plan.root.children
                child = plan.root.children[0].address  # a relay, not the root
                victim = next(i for i, p in enumerate(ring.procs) if p.address == child)
                ring.kill(victim)
                # run the plan made while it was alive: its stream fails, the rest goes on
                from statestore.net.restorer import Restorer

                restorer = Restorer(client._async._transport)
                view = client.ring()
                chain = client._call(restorer.plan(view, sid, 6, plan_kind))[0]
                result = client._call(restorer.run(view, sid, chain, plan))
                assert result.state == state
                assert any(f["hop"] == child for f in result.stats["failed_hops"])
                assert 0 < result.stats["rerouted"] < result.stats["chunks"]
                ring.restart(victim)
                ring.wait_ring(5)


def test_corrupted_replica_is_routed_around(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3) as ring:
        sid = StoreId("corrupt", 0, 0)
        with RingClient(ring.seeds, chunk_size=16 * 1024) as client:
            state = counts_workload(client, sid, 3, 2000, seed=4)
        # rot every chunk on node 0's disk while it is stopped
        node = ring.procs[0]
        node.stop(signal.SIGTERM)
        env = lmdb.open(str(Path(node.data_dir) / "db"))
        rotted = []
        with env.begin(write=True) as txn:
            for k, v in list(txn.cursor()):
                if k.startswith(b"c:"):
                    txn.put(k, v[:-1] + bytes([v[-1] ^ 0xFF]))
                    rotted.append(k[2:].decode())
        env.close()
        assert rotted
        ring.restart(0)
        ring.wait_ring(3)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{ring.procs[0].address}/v1/chunks/{rotted[0]}")
        assert err.value.code == 422
        with RingClient(ring.seeds) as client:
            for plan in ("star", "line", "tree"):
                assert dict(client.restore(sid, plan=plan)) == state, plan
            # restore_many's per-source streams leave the rotten chunks out; they are
            # fetched from the other replicas
            (many,) = client.restore_many([sid], plan="star")
            assert dict(many) == state and many.stats["batched"] < many.stats["chunks"]


def test_slow_node_is_routed_around_by_star(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3) as ring:
        slow = ring.add_node(["--inject-delay", "3"])
        ring.wait_ring(4)
        sid = StoreId("slow", 0, 0)
        with RingClient(ring.seeds, chunk_size=16 * 1024, timeout=1.0) as client:
            state = counts_workload(client, sid, 3, 3000, seed=5)
            st = client.restore(sid, plan="star")
            assert dict(st) == state
            assert st.stats["failovers"] > 0
            assert slow.address not in st.stats["bytes_by_node"]
            (many,) = client.restore_many([sid], plan="star")
            assert dict(many) == state and slow.address not in many.stats["bytes_by_node"]


def test_restore_many_spreads_sources(ring5: LocalRing) -> None:
    stores = [StoreId("many", 0, p) for p in range(8)]
    with RingClient(ring5.seeds, chunk_size=16 * 1024) as client:
        states = [
            counts_workload(client, sid, 3, 1500, seed=10 + i) for i, sid in enumerate(stores)
        ]
        results = client.restore_many(stores, plan="star")
        assert [dict(r) for r in results] == states
        # every chunk came in the per-source streams, none by a request of its own
        assert all(r.stats["batched"] == r.stats["chunks"] > 0 for r in results)
        per_node: dict[str, int] = {}
        for r in results:
            for node, n in r.stats["bytes_by_node"].items():
                per_node[node] = per_node.get(node, 0) + n
        mean = sum(per_node.values()) / len(per_node)
        assert len(per_node) == 5 and max(per_node.values()) < 1.5 * mean, per_node
        mixed = client.restore_many([(stores[0], 2), stores[1]], plan="auto")
        assert dict(mixed[1]) == states[1] and mixed[0].version == 2


def test_cli_restore_explain_and_out(ring5: LocalRing, tmp_path: Path) -> None:
    import subprocess
    import sys

    from statestore.wire.rows import decode_rows

    sid = StoreId("cli", 0, 0)
    with RingClient(ring5.seeds, chunk_size=16 * 1024) as client:
        state = counts_workload(client, sid, 4, 2000, seed=7)
    base = [sys.executable, "-m", "statestore", "restore", "--seeds", ring5.seeds[0]]
    explained = subprocess.run(
        [*base, "--store", sid.path, "--plan", "tree", "--explain"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "plan: tree" in explained.stdout and "restorer <-" in explained.stdout
    out = tmp_path / "state.rows"
    done = subprocess.run(
        [*base, "--store", sid.path, "--plan", "line", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "bytes into restorer" in done.stderr and "line" in done.stderr
    puts, deletes = decode_rows(out.read_bytes())
    assert puts == state and deletes == []
    bad = subprocess.run(
        [*base, "--store", "no/such/store/x"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "is not QUERY/OPERATOR/PARTITION/NAME" in bad.stderr or "integers" in bad.stderr
    missing = subprocess.run(
        [*base, "--store", "nothing/0/0/default"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1 and "has no committed version" in missing.stderr


def test_tree_hops_without_memory_fail_and_the_restore_fetches_their_chunks(
    tmp_path: Path,
) -> None:
    """Nodes whose memory budget (2 MiB) cannot hold a tree hop's fold: each hop takes its
    rows from the budget as they come, finds no room and fails with an E frame at once (it
    does not wait, nor garble its stream); the restorer fetches the hops' chunks itself, and
    the state is exact."""
    args = [*FAST, "--snapshot-every", "1000", "--memory-budget", str(2 << 20),
            "--max-body", str(1 << 20)]  # fmt: skip
    with local_ring(tmp_path, 3, args) as ring:
        sid = StoreId("tight", 0, 0)
        with RingClient(ring.seeds, chunk_size=32 * 1024) as client:
            state = counts_workload(client, sid, 3, 40_000, seed=3)
            st = client.restore(sid, plan="tree")
            assert dict(st) == state
            assert st.plan == "tree"
            assert st.stats["failed_hops"], st.stats  # the hops said why: no room
            assert st.stats["rerouted"] > 0
