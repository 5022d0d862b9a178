"""Range digests (core/digest.py, wire/digest.py, node/digests.py): a peer is never taken to
hold what it lacks, only the items of differing leaves are listed, hostile bodies are refused,
and on real node processes a repair after a node lost a few chunks lists a few items, not all
it holds."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from client import RingClient, StoreId
from statestore.cli.local import http_json
from statestore.core.digest import (
    LEAVES,
    MAX_DIGEST_RANGES,
    MAX_LEAF_RANGES,
    TOKEN_MAX,
    Digest,
    answer,
    fold,
    group,
    narrow,
    segments,
)
from statestore.core.errors import InvalidRequest, MalformedData
from statestore.node.backends import LmdbBackend
from tests.ringkit import chunk_keys, local_ring, post, workload


def _items(rng: random.Random, n: int) -> list[str]:
    out = [f"c:q/0/{rng.randrange(9)}/default/{rng.randrange(50)}/d{i}-{i:016x}" for i in range(n)]
    out += [f"m:q/0/{rng.randrange(9)}/default/{v}/delta/{rng.randrange(3)}" for v in range(n // 8)]
    return out


def _exchange(
    mine: list[str], theirs: list[str], cuts: list[int], seed: int
) -> tuple[list[str], list[str]]:
    ranges = segments(cuts)
    grouped = group(mine, ranges)
    indices = sorted(grouped)
    asked = [(*ranges[j], fold(grouped[j], seed)) for j in indices]
    differ = answer(theirs, asked, seed)
    return narrow({k: grouped[j] for k, j in enumerate(indices)}, dict(differ), seed)


def test_segments_cover_the_token_space() -> None:
    assert segments([5, 10]) == [(0, 5), (6, 10), (11, TOKEN_MAX)]
    assert segments([10, 5, 10]) == [(0, 5), (6, 10), (11, TOKEN_MAX)]
    assert segments([TOKEN_MAX]) == [(0, TOKEN_MAX)]
    assert segments([]) == [(0, TOKEN_MAX)]


@pytest.mark.parametrize("trial", range(40))
def test_a_peer_is_never_taken_to_hold_what_it_lacks(trial: int) -> None:
    rng = random.Random(trial)
    universe = _items(rng, rng.choice([0, 1, 50, 2000]))
    mine = [it for it in universe if rng.random() < 0.9]
    lost = {it for it in mine if rng.random() < rng.choice([0.0, 0.002, 0.05, 1.0])}
    extra = [f"c:other/{i}" for i in range(rng.choice([0, 3, 300]))]
    theirs = [it for it in universe if it not in lost] + extra
    cuts = sorted(rng.getrandbits(64) for _ in range(rng.choice([1, 12, 768])))
    held, ask = _exchange(mine, theirs, cuts, rng.getrandbits(64))
    assert sorted(held + ask) == sorted(mine)  # every item answered one way or the other
    assert not set(held) & lost  # never taken as held when lost
    assert lost <= set(ask)
    if not lost and not extra and set(theirs) == set(mine):
        assert ask == []  # in sync: nothing listed


def test_a_few_lost_items_cost_a_few_listed() -> None:
    rng = random.Random(7)
    mine = _items(rng, 20_000)
    lost = set(rng.sample(mine, 5))
    theirs = [it for it in mine if it not in lost]
    cuts = sorted(rng.getrandbits(64) for _ in range(768))
    _, ask = _exchange(mine, theirs, cuts, 99)
    assert lost <= set(ask)
    # each lost item costs the items of its leaf (about n / ranges / LEAVES), not the range
    assert len(ask) < 5 * (1 + 4 * len(mine) // (768 * LEAVES)) + 20, len(ask)


def test_differing_ranges_past_the_leaf_limit_are_listed_whole() -> None:
    cuts = list(range(10, 10 * (MAX_LEAF_RANGES + 40), 10))
    ranges = segments(cuts)
    asked = [(lo, hi, Digest(1, 1)) for lo, hi in ranges]  # differs from an empty peer
    differ = answer([], asked, 3)
    assert len(differ) == len(ranges)
    assert sum(ls is not None for _, ls in differ) == MAX_LEAF_RANGES
    grouped = {i: [f"c:x{i}"] for i in range(len(ranges))}
    held, ask = narrow(grouped, dict(differ), 3)
    assert held == [] and len(ask) == len(ranges)


def test_the_wire_refuses_hostile_bodies() -> None:
    from statestore.wire.digest import decode_answer, decode_request

    def req(ranges: object, seed: object = 1) -> bytes:
        return json.dumps({"seed": seed, "ranges": ranges}).encode()

    assert decode_request(req([[0, 5, 1, "ff"], [6, 9, 0, "0"]]))[1][0] == (0, 5, Digest(1, 255))
    unordered = [[6, 9, 1, "1"], [0, 5, 1, "1"]]
    for bad in ([[5, 0, 1, "ff"]], [[0, 5, 1, "ff"], [5, 9, 1, "ff"]], unordered):
        with pytest.raises(InvalidRequest):
            decode_request(req(bad))
    with pytest.raises(InvalidRequest):  # over the limit: split it
        decode_request(req([[i, i, 0, "0"] for i in range(MAX_DIGEST_RANGES + 1)]))
    for body in (
        req([[0, 5, 1, "xyz"]]),
        req([[0, 5, 1, "f" * 33]]),
        req([[-1, 5, 1, "f"]]),
        req([[0, 2**64, 1, "f"]]),
        req([[0, 5, 1, "f"]], seed=-1),
        req([[0, 5, 1]]),
        b"{",
        b"[]",
    ):
        with pytest.raises((MalformedData, InvalidRequest)):  # both are a 400
            decode_request(body)
    ok = {"id": "n1", "differ": [[0, None], [1, [[0, "0"]] * LEAVES]]}
    assert set(decode_answer(json.dumps(ok).encode(), 2)) == {0, 1}
    for bad_answer in (
        {"id": "n1", "differ": [[2, None]]},  # a range not asked
        {"id": "n1", "differ": [[0, [[0, "0"]] * (LEAVES + 1)]]},
        {"id": "n1", "differ": [[0, [[0, "g"]]]]},
    ):
        with pytest.raises((MalformedData, InvalidRequest)):
            decode_answer(json.dumps(bad_answer).encode(), 2)


def _stats(address: str) -> dict[str, int]:
    health = http_json(address, "/v1/health")
    assert isinstance(health, dict)
    return {k: int(v) for k, v in health["stats"].items()}


def test_repair_after_a_few_lost_chunks_lists_a_few_items(tmp_path: Path) -> None:
    """Real processes: node 2 loses five chunks while stopped; when it is back, the other
    nodes' repair finds them by range digests and lists far fewer items than they hold, and
    node 2 holds every chunk again. Without digests (the flag) every item is listed."""
    with local_ring(tmp_path, 3) as ring:
        sid = StoreId("digests", 0, 0)
        with RingClient(ring.seeds, chunk_size=512) as client:
            expected = workload(sid, client, 10, seed=3)
            keys = chunk_keys(client, sid, list(expected))
        assert len(keys) > 200
        victim = ring.procs[2]
        held = post(victim.address, "/v1/sync/have", {"chunks": keys})
        assert all(held["chunks"])  # type: ignore[index]
        victim.stop(signal.SIGTERM)
        lost = random.Random(5).sample(keys, 5)
        backend = LmdbBackend(os.path.join(victim.data_dir, "db"))
        backend.write({}, [f"c:{k}".encode() for k in lost])
        backend.close()
        ring.wait_ring(2)
        before = [_stats(p.address) for p in ring.procs[:2]]
        ring.restart(2)
        ring.wait_ring(3)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            answer = post(victim.address, "/v1/sync/have", {"chunks": keys})
            if all(answer["chunks"]):  # type: ignore[index]
                break
            time.sleep(0.5)
        else:
            pytest.fail("node 2 did not get its lost chunks back")
        time.sleep(2)  # let the pass that pushed them end
        after = [_stats(p.address) for p in ring.procs[:2]]
        pairs = list(zip(after, before, strict=True))
        listed = sum(a["have_asked"] - b["have_asked"] for a, b in pairs)
        confirmed = sum(a["digest_confirmed"] - b["digest_confirmed"] for a, b in pairs)
        assert confirmed >= len(keys), (confirmed, len(keys))
        assert listed < len(keys) // 4, (listed, len(keys))
