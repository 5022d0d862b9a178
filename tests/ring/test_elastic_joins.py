"""Joins the issue also asks about, with real node processes (the elastic load of
tests/ringkit.py): two nodes joining a loaded ring at once under a writer and a reader, and
a join whose source is killed mid-stream. A low ``--stream-mbps`` keeps the moves going long
enough to overlap (or be cut); nothing here asserts a duration."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from client import RingClient, StoreId
from statestore.cli.local import LocalRing, NodeProcess, http_json
from statestore.core.placement import DEFAULT_VNODES, Member, Ring
from tests.ringkit import (
    ARGS,
    Copies,
    R,
    Ref,
    Writer,
    check_restores,
    load,
    local_ring,
    post,
    sample,
    stop_load,
    under_load,
    wait_exact,
    wait_state,
)


class Reader(threading.Thread):
    """Restores versions the writer had acknowledged (and the loaded ones) until stopped;
    every failure or wrong state is a finding."""

    def __init__(self, seeds: list[str], writer: Writer, states: dict[StoreId, Ref]) -> None:
        super().__init__(daemon=True)
        self.seeds = seeds
        self.writer = writer
        self.states = states
        self.reads = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        rng = random.Random(11)
        with RingClient(self.seeds) as client:
            while not self.halt.is_set():
                try:
                    acked = list(self.writer.acked.items())
                except RuntimeError:  # the writer added one meanwhile
                    continue
                if acked and rng.random() < 0.7:
                    (sid, v), want = rng.choice(acked)
                else:
                    sid = rng.choice(sorted(self.states, key=lambda s: s.path))
                    v, want = 6, self.states[sid]
                try:
                    got = dict(client.restore(sid, v))
                except Exception as exc:  # every failure is a finding
                    self.failures.append(f"{sid} v{v}: {type(exc).__name__}: {exc}")
                    continue
                if got != want:
                    self.failures.append(f"{sid} v{v}: restored state differs")
                self.reads += 1

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


def _start_both(ring: LocalRing, args: list[str]) -> tuple[NodeProcess, NodeProcess]:
    """Start two joining nodes at the same time (each start waits for its node to listen)."""
    base = len(ring.procs)
    procs = [
        NodeProcess(f"{ring.base_dir}/node-{base + i}", 0, [*ring.args, *args]) for i in range(2)
    ]
    errors: list[BaseException] = []

    def start(p: NodeProcess) -> None:
        try:
            p.start(ring.seeds[:1])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ring.procs += procs
    assert not errors, errors
    return procs[0], procs[1]


def test_two_nodes_join_at_once_under_a_writer_and_a_reader(tmp_path: Path) -> None:
    with local_ring(tmp_path, 3, ARGS) as ring:
        stores = [StoreId("twojoin", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states, writer, copies = under_load(ring, client, stores, 8, ring.seeds)
            reader = Reader(ring.seeds, writer, states)
            reader.start()
            a, b = _start_both(ring, ["--join", "--stream-mbps", "0.05"])
            # both are moving at once: each one's listing places on a future ring with both
            deadline = time.monotonic() + 30
            while True:
                seen = [http_json(p.address, "/v1/handover") for p in (a, b)]
                if all(s["state"] == "joining" for s in seen):  # type: ignore[index]
                    break
                assert time.monotonic() < deadline, seen
                time.sleep(0.1)
            for p in (a, b):
                move = wait_state(p, "normal", timeout=120)["move"]
                assert isinstance(move, dict) and move["phase"] == "switched"
                assert move["copied"] > 0
            time.sleep(1.0)  # commits and restores on the 5-node ring
            reader.stop()
            stop_load(writer, copies)  # no failed commit, never below R copies
            assert not reader.failures, reader.failures[:5]
            assert reader.reads > 0
            ring.wait_ring(5)
            check_restores(client, writer, states, 6)
            wait_exact(copies, ring.seeds, R)


def test_a_source_killed_mid_stream_the_join_finishes_from_the_others(tmp_path: Path) -> None:
    with local_ring(tmp_path, 4, ARGS) as ring:
        stores = [StoreId("cutsource", 0, p) for p in range(3)]
        with RingClient(ring.seeds, chunk_size=4096) as client:
            states = load(client, stores, 6, seed=9)
            keys, manifests = sample(client, stores, 6)
            writer = Writer(ring.seeds, states, 7)
            writer.start()
            newcomer = ring.add_node(["--join", "--stream-mbps", "0.1"])
            deadline = time.monotonic() + 30
            while True:  # mid-stream: some items fetched, others not yet
                move = http_json(newcomer.address, "/v1/handover")["move"]  # type: ignore[index]
                if move and 0 < move["round_done"] < move["round_total"]:
                    break
                assert time.monotonic() < deadline, move
                time.sleep(0.1)
            ids = [p.id for p in ring.procs]
            ring.kill(1)  # a source: every node holds part of what the newcomer will own
            done = wait_state(newcomer, "normal", timeout=120)["move"]
            assert isinstance(done, dict) and done["phase"] == "switched"
            # what it owns on the ring it joined (the killed source still in it) it holds:
            # its items came from the other holders
            future = Ring([Member(i) for i in ids], DEFAULT_VNODES)
            mine = [k for k in keys if newcomer.id in future.replicas(k, R)]
            owned = [m for m in manifests if newcomer.id in future.replicas(m[0], R)]
            held = post(newcomer.address, "/v1/sync/have", {"chunks": mine, "manifests": owned})
            assert mine and all(held["chunks"]) and all(held["manifests"])  # type: ignore[index]
            writer.stop()
            assert not writer.failures, writer.failures[:5]
            ring.wait_ring(4)
            check_restores(client, writer, states, 6)
            # the killed source's copies are made again: R on the live nodes
            wait_exact(Copies(ring, keys, manifests), ring.seeds, R, timeout=60)
