"""Point reads per second on one node, against a bare aiohttp handler that returns a constant.

Both are driven by the same asyncio load generator (``--concurrency`` workers in one process,
``--seconds`` per phase, phases interleaved over ``--rounds``). A point read is
``AsyncRingClient.get(store, key)``: the head, the chain of manifests, then of each chunk
covering the key along the chain its index and the one block that can hold it. It is
measured on a store written with the default 4 MiB chunks and on one written with 256 KiB
chunks (the ``chunk_size`` option of the client). ``AsyncRingClient.open(store)`` is
measured too: the head and chain are read once when it opens, a read fetches as ``get``
does; ``warm`` reads through one opened store whose cache (64 MiB: the rows its reads
answered, indexes and decoded blocks, a quarter each) holds the keys it reads
(``--warm-keys``, default 100,000: the whole store at the default size) once each was read,
``cold`` through one opened with
``cache_bytes=0``: nothing is cached by the client, and reads go in ``POST .../lookup``
requests to the node (the workers' reads asked at once share one; a reader finding none
under way sends its own: ``--concurrency 1`` measures a lone reader), which reads, of each
chunk covering the key along the chain, the index and the one block that can hold it from
its own storage and keeps them in its cache (node/lookup.py; blocked chunks, the layout
since 0.3.0; the 256 KiB store too). The constant handler runs in its own process, like
the node. Ratios are taken per round (each phase against the constant
handler's rate of the same round) and printed as the median with its range. Each phase's
CPU a read is printed too (the client process's and the server's: the node, or the
constant handler's process), the medians over rounds: a figure this machine's load swings
less than rates.

    .venv/bin/python bench/point_reads.py [--seconds 10] [--rounds 2] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

from _common import MiB, local_ring, machine, median, pct, rows, table

from client import AsyncLazyState, AsyncRingClient, StoreId
from statestore.net.http import HttpTransport


def constant_server() -> None:
    """``--constant-server``: an aiohttp app answering ``GET /const`` with 5 bytes."""
    from aiohttp import web

    async def const(request: web.Request) -> web.Response:
        return web.Response(body=b"value", content_type="application/octet-stream")

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/const", const)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(f"listening on 127.0.0.1:{runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


async def drive(op: Callable[[], Awaitable[object]], concurrency: int, seconds: float) -> list:
    """Run ``op`` from ``concurrency`` workers for ``seconds``; returns the latencies."""
    lat: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline:
                return
            await op()
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat


def cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used (user and system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench(
    a: argparse.Namespace, seeds: list[str], const_addr: str, pids: dict[str, int]
) -> None:
    rng = random.Random(3)
    stores = {
        "default": (StoreId("bench", 0, 0, "points-4m"), 4 * MiB),
        "small": (StoreId("bench", 0, 0, "points-256k"), 256 * 1024),
    }
    snapshot = rows(a.keys, rng)
    deltas = [rows(1000, rng, key_space=10**9) for _ in range(a.deltas)]
    keys = list(snapshot)
    wanted = {"const", *a.phases.split(",")}
    if not wanted & {"small", "open-cold-small"}:
        del stores["small"]  # not read: not written
    for sid, chunk_size in stores.values():
        async with AsyncRingClient(seeds, chunk_size=chunk_size) as w:
            await w.commit(sid, 1, snapshot, [], {"src": 1}, epoch=1, snapshot=True)
            for i, d in enumerate(deltas):
                await w.commit(sid, i + 2, d, [], {"src": i + 2}, epoch=1)
    print(
        f"stores: snapshot of {a.keys} rows ({a.keys * 100 / MiB:.0f} MiB raw) + {a.deltas} "
        f"deltas of 1000 rows; {a.concurrency} concurrent workers, {a.seconds:.0f}s per phase\n",
        flush=True,
    )

    transport = HttpTransport(timeout=30.0, connections=a.concurrency * 2)
    await transport.start()
    client = AsyncRingClient(seeds, timeout=30.0)
    await client.connect()
    try:
        expect = {k: snapshot[k] for k in keys}

        async def const() -> None:
            resp = await transport.request("GET", const_addr, "/const")
            assert resp.body == b"value"

        def point(sid: StoreId) -> Callable[[], Awaitable[None]]:
            async def op() -> None:
                k = rng.choice(keys)
                got = await client.get(sid, k)
                assert got is not None and (got == expect[k] or any(k in d for d in deltas))

            return op

        def lazy_point(view: AsyncLazyState, among: list[bytes]) -> Callable[[], Awaitable[None]]:
            async def op() -> None:
                k = rng.choice(among)
                got = await view.get(k)
                assert got is not None and (got == expect[k] or any(k in d for d in deltas))

            return op

        warm = await client.open(stores["default"][0])
        hot = keys[: a.warm_keys]
        for k in hot if "open-warm" in wanted else ():
            await warm.get(k)  # every key it reads read once, so its index and blocks are cached
        cold = await client.open(stores["default"][0], cache_bytes=0)
        phases: dict[str, Callable[[], Awaitable[None]]] = {
            "const": const,
            "default": point(stores["default"][0]),
            "open-warm": lazy_point(warm, hot),
            "open-cold": lazy_point(cold, keys),
        }
        if "small" in stores:
            cold_small = await client.open(stores["small"][0], cache_bytes=0)
            phases["small"] = point(stores["small"][0])
            phases["open-cold-small"] = lazy_point(cold_small, keys)
        unknown = wanted - set(phases)
        if unknown:
            raise SystemExit(f"--phases: no phase {', '.join(sorted(unknown))}")
        phases = {name: op for name, op in phases.items() if name in wanted}
        # the reference rows and the warm cache are the harness's, not a reader's: out of
        # the collector's way, so that a phase that allocates more does not pay for scanning them
        gc.collect()
        gc.freeze()
        results: dict[str, list[float]] = {p: [] for p in phases}
        rates: dict[str, list[float]] = {p: [] for p in phases}
        cpu: dict[str, list[tuple[float, float]]] = {p: [] for p in phases}  # us a read
        for r in range(a.rounds):
            order = list(phases) if r % 2 == 0 else list(reversed(phases))
            for name in order:
                await drive(phases[name], a.concurrency, 1.0)  # warm the pools and caches
                server = pids["const" if name == "const" else "node"]
                t0, c0, s0 = time.perf_counter(), time.process_time(), cpu_seconds(server)
                lat = await drive(phases[name], a.concurrency, a.seconds)
                rate = len(lat) / (time.perf_counter() - t0)
                c1, s1 = time.process_time(), cpu_seconds(server)
                cpu[name].append((1e6 * (c1 - c0) / len(lat), 1e6 * (s1 - s0) / len(lat)))
                results[name] += lat
                rates[name].append(rate)
                print(f"round {r + 1} {name}: {rate:.0f}/s", flush=True)
    finally:
        await client.close()
        await transport.close()

    labels = {
        "const": "bare aiohttp handler, constant body",
        "default": "RingClient.get, 4 MiB chunks (default)",
        "small": "RingClient.get, 256 KiB chunks",
        "open-warm": "open() warm (rows, indexes and blocks cached), 4 MiB chunks",
        "open-cold": "open() cold (cache_bytes=0: lookups), 4 MiB chunks",
        "open-cold-small": "open() cold (cache_bytes=0: lookups), 256 KiB chunks",
    }
    body = []
    for name, label in labels.items():
        if name not in phases:
            continue
        lat = results[name]
        body.append(
            [
                label,
                f"{median(rates[name]):.0f}",
                f"{median(lat) * 1000:.1f}",
                f"{pct(lat, 99) * 1000:.1f}",
                f"{median([c for c, _ in cpu[name]]):.0f}",
                f"{median([s for _, s in cpu[name]]):.0f}",
            ]
        )
    print()
    print(table(["path", "reads/s", "p50 ms", "p99 ms", "client CPU us", "server CPU us"], body))
    print()
    for name in [p for p in phases if p != "const"]:
        shares = [r / c for r, c in zip(rates[name], rates["const"], strict=True)]
        share = median(shares)
        print(
            f"{labels[name]}: {share:.3f}x the constant handler's rate "
            f"({min(shares):.3f}-{max(shares):.3f} over {len(shares)} rounds)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--keys", type=int, default=100_000, help="rows in the snapshot")
    ap.add_argument("--deltas", type=int, default=5)
    ap.add_argument(
        "--warm-keys",
        type=int,
        default=100_000,
        help="the keys the warm reader reads (each once before): a working set its cache holds",
    )
    ap.add_argument(
        "--phases",
        default="const,default,small,open-warm,open-cold,open-cold-small",
        help="the phases to measure, comma-separated (const, the baseline, always runs)",
    )
    ap.add_argument("--constant-server", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.constant_server:
        constant_server()
        return
    print(machine())
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--constant-server"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        const_addr = proc.stdout.readline().split()[-1]
        with local_ring(1, ["--replicas", "1", "--write-quorum", "1"]) as ring:
            node = ring.procs[0].proc
            assert node is not None
            asyncio.run(bench(a, ring.seeds, const_addr, {"const": proc.pid, "node": node.pid}))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
