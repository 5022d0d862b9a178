"""Restore of a 256 MiB store (a snapshot + 20 deltas) from a local 3-node ring.

Baseline, in the same run and interleaved round by round: the same chunks read from local
files, decompressed and decoded (``decode_chunk``) and folded into a dict in chain order by
this one process. Target: the ring within 1.5x of the local time.

    .venv/bin/python bench/restore.py [--mib 256] [--deltas 20] [--rounds 3] [--plan auto]

``--secure`` compares instead two rings started side by side: one with auth and TLS on (a
client token, TLS with its own CA, node identity), one with them off, holding the same
commits; restores alternate between them round by round, and the ratio is taken round by
round (goal: on <= 1.1x off).

``--profile`` adds one ring restore under cProfile and prints the top functions: it sees the
client's event loop (run on the main thread there), not the decode worker threads; for those,
run the script under ``py-spy record --format raw`` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import pstats
import random
import resource
import tempfile
import time

from _common import (
    SECURITY,
    MiB,
    local_ring,
    machine,
    median,
    print_security_ratio,
    rows,
    security_pair,
    table,
)

from client import AsyncRingClient, RingClient, StoreId
from client._core import build_commit
from statestore.core.chunk import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_KEY_GROUPS,
    MAX_CHUNK_RAW,
    decode_chunk,
)
from statestore.core.fold import apply as fold

ROW = 104  # raw bytes per row in a chunk: 100 B of key + value, msgpack framing


def build_versions(mib: int, n_deltas: int, delta_mib: int) -> list[dict[bytes, bytes | None]]:
    """Version 1 (snapshot) and ``n_deltas`` deltas; a None value is a delete."""
    rng = random.Random(2)
    snap_rows = (mib - n_deltas * delta_mib) * MiB // ROW
    state = rows(snap_rows, rng)
    keys = list(state)
    out: list[dict[bytes, bytes | None]] = [dict(state)]
    per = delta_mib * MiB // ROW
    for _ in range(n_deltas):
        delta: dict[bytes, bytes | None] = dict.fromkeys(rng.sample(keys, per * 70 // 100), b"")
        for k in delta:
            delta[k] = rng.randbytes(42).hex().encode()
        delta.update(rows(per * 25 // 100, rng))
        for k in rng.sample(keys, per * 5 // 100):
            if k not in delta:
                delta[k] = None
        out.append(delta)
    return out


def split(delta: dict[bytes, bytes | None]) -> tuple[dict[bytes, bytes], list[bytes]]:
    puts = {k: v for k, v in delta.items() if v is not None}
    return puts, [k for k, v in delta.items() if v is None]


def restore_local(directory: str, versions: int) -> dict[bytes, bytes]:
    """Read every chunk file in chain order, decode it and fold it: the one-process baseline."""
    state: dict[bytes, bytes] = {}
    for v in range(1, versions + 1):
        vdir = os.path.join(directory, str(v))
        for name in sorted(os.listdir(vdir), key=lambda n: int(n[1:].split("-")[0])):
            with open(os.path.join(vdir, name), "rb") as f:
                data = f.read()
            fold(state, decode_chunk(data, what=name))
    return state


def profile_ring(seeds: list[str], sid: StoreId, version: int, plan: str) -> str:
    async def run() -> int:
        async with AsyncRingClient(seeds) as c:
            return len(await c.restore(sid, version, plan=plan))

    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(run())
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


NODE_ARGS = ["--snapshot-every", "100000"]  # the chain as committed: no compaction


def compare_security(
    versions: list[dict[bytes, bytes | None]], rounds: int, plan: str, sid: StoreId
) -> None:
    """The same commits on a ring with auth and TLS off and on one with them on; restores
    alternate between them round by round; prints both and their ratio round by round."""
    n = len(versions)
    with security_pair(NODE_ARGS) as clients:
        raw = 0
        for i, delta in enumerate(versions):
            puts, deletes = split(delta)
            for client in clients.values():
                res = client.commit(
                    sid, i + 1, puts, deletes, {"src": i + 1}, epoch=1, snapshot=i == 0
                )
            raw += res.raw_bytes
        versions.clear()
        gc.collect()
        print(f"committed {n} versions ({raw / MiB:.0f} MiB raw) to both rings\n", flush=True)
        times: dict[str, list[float]] = {"off": [], "on": []}
        sizes = set()
        for client in clients.values():  # warm: connections, TLS sessions, link figures
            sizes.add(len(client.restore(sid, n, plan=plan)))
        for r in range(rounds):
            for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                gc.collect()
                t0 = time.perf_counter()
                st = clients[name].restore(sid, n, plan=plan)
                times[name].append(time.perf_counter() - t0)
                sizes.add(len(st))
                print(f"round {r + 1} {name}: {times[name][-1]:.2f}s ({st.plan})", flush=True)
                st = None  # type: ignore[assignment]
    assert len(sizes) == 1, f"the rings disagree on the state: {sizes}"
    body = []
    for name, label in SECURITY.items():
        xs = times[name]
        body.append(
            [
                f"{label} (plan {plan})",
                f"{median(xs):.2f}",
                f"{min(xs):.2f}",
                f"{raw / MiB / median(xs):.0f}",
            ]
        )
    print()
    print(table(["path", "median s", "best s", "MiB/s raw"], body))
    print_security_ratio(times["on"], times["off"], "round by round")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="raw size of the store's chain")
    ap.add_argument("--deltas", type=int, default=20)
    ap.add_argument("--delta-mib", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plan", default="auto", help="star, line, tree or auto (the default)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--secure", action="store_true", help="auth and TLS on vs off, instead of local files"
    )
    a = ap.parse_args()
    print(machine())

    t = time.perf_counter()
    versions = build_versions(a.mib, a.deltas, a.delta_mib)
    sid = StoreId("bench", 0, 0, "restore")
    n = len(versions)
    print(f"generated {n} versions in {time.perf_counter() - t:.1f}s", flush=True)
    if a.secure:
        compare_security(versions, a.rounds, a.plan, sid)
        return
    with (
        local_ring(3, NODE_ARGS) as ring,
        tempfile.TemporaryDirectory(prefix="statestore-bench-files-") as files,
        RingClient(ring.seeds) as client,
    ):
        raw = wire = chunks = 0
        t = time.perf_counter()
        for i, delta in enumerate(versions):
            v = i + 1
            puts, deletes = split(delta)
            snap = v == 1
            _, encoded = build_commit(
                sid,
                v,
                puts,
                deletes,
                {"src": v},
                1,
                snap,
                key_groups=DEFAULT_KEY_GROUPS,
                chunk_size=DEFAULT_CHUNK_SIZE,
                max_chunk=MAX_CHUNK_RAW,
            )
            os.makedirs(os.path.join(files, str(v)))
            for c in encoded:
                with open(os.path.join(files, str(v), c.name), "wb") as f:
                    f.write(c.data)
            res = client.commit(sid, v, puts, deletes, {"src": v}, epoch=1, snapshot=snap)
            assert res.bytes == sum(len(c.data) for c in encoded), "ring and files differ"
            raw += res.raw_bytes
            wire += res.bytes
            chunks += res.chunks
        del versions, puts, deletes, encoded
        gc.collect()
        print(
            f"committed v1 snapshot + {a.deltas} deltas in {time.perf_counter() - t:.1f}s: "
            f"{raw / MiB:.0f} MiB raw, {wire / MiB:.0f} MiB compressed, {chunks} chunks\n",
            flush=True,
        )

        times: dict[str, list[float]] = {"ring": [], "local": []}
        sizes = set()
        stats: dict[str, object] = {}
        for r in range(a.rounds):
            for path in ("local", "ring") if r % 2 == 0 else ("ring", "local"):
                gc.collect()
                t0 = time.perf_counter()
                if path == "ring":
                    st = client.restore(sid, n, plan=a.plan)
                    stats = st.stats
                    size = len(st)
                else:
                    size = len(restore_local(files, n))
                times[path].append(time.perf_counter() - t0)
                st = None  # type: ignore[assignment]
                sizes.add(size)
                print(f"round {r + 1} {path}: {times[path][-1]:.2f}s", flush=True)
        assert len(sizes) == 1, f"ring and local disagree on the state: {sizes}"
        print(f"\nrestored state: {sizes.pop()} keys; ring stats: {stats}\n")
        body = []
        for path, label in (
            ("ring", f"ring: RingClient.restore (3 nodes, plan {a.plan} -> {stats.get('plan')})"),
            ("local", "local files: read + decode_chunk + fold, 1 process"),
        ):
            xs = times[path]
            body.append(
                [
                    label,
                    f"{median(xs):.2f}",
                    f"{min(xs):.2f}",
                    f"{raw / MiB / median(xs):.0f}",
                ]
            )
        print(table(["path", "median s", "best s", "MiB/s raw"], body))
        ratio = median(times["ring"]) / median(times["local"])
        verdict = "within" if ratio <= 1.5 else "NOT within"
        print(f"\nring / local (medians): {ratio:.2f}x ({verdict} the 1.5x target)")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process (client + baseline): {rss:.0f} MiB")
        if a.profile:
            print("\ncProfile of one ring restore (event loop thread; decode runs on workers):")
            print(profile_ring(ring.seeds, sid, n, a.plan))


if __name__ == "__main__":
    main()
