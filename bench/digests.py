"""What range digests save a repair pass (docs/operations.md, Range digests): the same pass of
the same node with digests and without, alternated round by round on one ring, as the data
grows.

Three in-process nodes (real HTTP on loopback, in-memory storage, R = 3 so each holds every
item) are filled with ``--items`` chunks (and a manifest per 100), at each size given. Per
round, one node loses ``--lost`` chunks; then node 0 runs one repair pass with digests and,
after the loss is made again, one without (the order alternates). Reported per size: the
items listed to peers (``/v1/sync/have``) per pass, the pass's wall time, and their ratios
(digests / listing), median over the rounds with the spread.

    PYTHONPATH=. .venv/bin/python bench/digests.py --items 2000 10000 50000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import xxhash

from bench._common import table
from statestore.core.chunk import encode_chunks
from statestore.core.ids import StoreId
from statestore.core.manifest import ChunkRef, Manifest
from statestore.node.daemon import Node, NodeConfig
from statestore.node.repair import repair_pass
from statestore.node.server import start_node, stop_node


def _config(tmp: str, name: str, seeds: list[str]) -> NodeConfig:
    return NodeConfig(
        port=0,
        data_dir=f"{tmp}/{name}",
        storage="memory://",
        dht=False,
        seeds=seeds,
        gossip_interval=0.2,
        repair_interval=3600.0,  # the background loop stays out of the measured passes
    )


def _fill(nodes: list[Node], items: int) -> list[str]:
    chunk = encode_chunks({b"k": b"v" * 40}, [], groups=128)[0]
    h = xxhash.xxh3_64_intdigest(chunk.data)
    keys = []
    for i in range(items):
        sid = StoreId("bench", 0, i % 50)
        keys.append(f"{sid.path}/{1 + i // 5000}/d{i}-{h:016x}")
    for node in nodes:
        for key in keys:
            node.store.put_chunk(key, chunk.data)
        for i in range(0, items, 100):
            sid = StoreId("bench", 0, i % 50)
            m = Manifest(sid, 1 + i, "delta", 1, 128, (ChunkRef.of(chunk),), {"p": i})
            node.store.put_manifest(m)
    return keys


async def _pass(node: Node, victim: Node, lost: list[str], digests: bool) -> tuple[int, float]:
    victim.store.delete_chunks(lost)
    node.config.repair_digests = digests
    before = node.stats["have_asked"]
    t0 = time.perf_counter()
    await repair_pass(node, node.view(), allow_handoff=True)
    elapsed = time.perf_counter() - t0
    missing = [k for k, held in zip(lost, victim.store.has_chunks(lost), strict=True) if not held]
    if missing:
        raise SystemExit(f"the pass left {len(missing)} lost chunks unrepaired (digests={digests})")
    return node.stats["have_asked"] - before, elapsed


async def _size(items: int, lost: int, rounds: int) -> list[object]:
    with tempfile.TemporaryDirectory(prefix="statestore-digests-") as tmp:
        first, r0 = await start_node(_config(tmp, "n0", []))
        started = [(first, r0)]
        for name in ("n1", "n2"):
            started.append(await start_node(_config(tmp, name, [first.address])))
        nodes = [n for n, _ in started]
        try:
            for _ in range(600):
                if all(len(n.view().ring) == 3 for n in nodes):
                    break
                await asyncio.sleep(0.1)
            keys = _fill(nodes, items)
            listed: dict[bool, list[int]] = {True: [], False: []}
            secs: dict[bool, list[float]] = {True: [], False: []}
            for r in range(rounds):
                gone = keys[r * lost : (r + 1) * lost]
                order = (True, False) if r % 2 == 0 else (False, True)
                for digests in order:
                    n, s = await _pass(nodes[0], nodes[2], gone, digests)
                    listed[digests].append(n)
                    secs[digests].append(s)
            time_ratios = [a / b for a, b in zip(secs[True], secs[False], strict=True)]
            med = statistics.median(time_ratios)
            spread = (max(time_ratios) - min(time_ratios)) / 2
            total = len(keys) + len(range(0, items, 100))
            return [
                total,
                statistics.median(listed[False]),
                statistics.median(listed[True]),
                f"{statistics.median(secs[False]) * 1000:.0f}",
                f"{statistics.median(secs[True]) * 1000:.0f}",
                f"{med:.2f}x ±{spread:.2f}",
            ]
        finally:
            for node, runner in reversed(started):
                await stop_node(node, runner)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, nargs="+", default=[2000, 10000, 50000])
    ap.add_argument("--lost", type=int, default=5, help="chunks one node loses per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    out = []
    for items in args.items:
        out.append(asyncio.run(_size(items, args.lost, args.rounds)))
    print(
        table(
            [
                "items held",
                "listed (no digests)",
                "listed (digests)",
                "pass ms (no digests)",
                "pass ms (digests)",
                "time digests / listing",
            ],
            out,
        )
    )


if __name__ == "__main__":
    main()
