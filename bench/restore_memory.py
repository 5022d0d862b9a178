"""What restores a node builds for its callers hold of its memory: peak RSS growth of a node
process under eight restores at once, with ``--memory-budget`` and without it, at several
state sizes.

A node restoring for a caller (``GET .../state``) reserves its fold (the chain's raw bytes
plus 200 bytes a row) before it reads a chunk, and a tree hop (``POST /v1/relay`` with a
folding plan) takes its chunks' rows before it decodes them (docs/security.md, "Memory"):
under a budget the restores take turns, and a node's memory grows with the budget, not with
the restores in flight. Per size, two node processes in turn hold the same state: one with
``--budget`` MiB (default 64), one whose budget is past anything they hold (``--free``,
default 8 GiB: the budget never makes a restore wait, as before restores were charged). The
figure is the growth of each process's peak resident set (VmHWM, started afresh before each
phase) over eight restores at once, then over eight tree folds at once, and their ratio.

    .venv/bin/python bench/restore_memory.py [--sizes 16,48] [--budget 64]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
from pathlib import Path

import aiohttp
from _common import MiB, machine, table

from statestore.cli.local import NodeProcess
from statestore.core.ids import StoreId, chunk_key
from statestore.core.plan import ChunkTask, Hop
from statestore.wire.frames import encode_hop
from statestore.wire.manifest import decode_chain
from statestore.wire.rows import encode_puts

STORE = "q/0/0/s"
ROW = 4000  # bytes of a value: a version of 4,096 rows is ~16 MiB
KEYS = 4096


def reset_peak(pid: int) -> None:
    """Start ``pid``'s peak resident set (VmHWM) afresh at its current one (clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for {pid}")


async def measure(work: Path, size: int, budget: int) -> tuple[int, int]:
    """Peak RSS growth of a node holding ``size`` MiB of state under eight restores, then
    eight tree folds, with a budget of ``budget`` bytes."""
    node = NodeProcess(
        str(work / f"n-{size}-{budget}"),
        0,
        ["--no-dht", "--storage", "memory://", "--replicas", "1", "--write-quorum", "1",
         "--max-body", str(16 * MiB), "--max-commit", str(16 * MiB),
         "--memory-budget", str(budget)],
    )  # fmt: skip
    node.start([])
    try:
        assert node.proc is not None
        versions = max(1, size // 16)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            for v in range(1, versions + 1):  # distinct keys a version: 16 MiB each
                keys = [b"k%d-%07d" % (v, i) for i in range(KEYS)]
                values = [b"%d-%07d" % (v, i) + bytes(ROW - 10) for i in range(KEYS)]
                url = f"http://{node.address}/v1/stores/{STORE}/commit?version={v}&epoch=1"
                async with s.post(url, data=io.BytesIO(encode_puts(keys, values))) as r:
                    assert r.status == 201, await r.text()
            reset_peak(node.proc.pid)
            before = peak(node.proc.pid)

            async def restore() -> int:
                url = f"http://{node.address}/v1/stores/{STORE}/state?plan=star"
                async with s.get(url) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(restore() for _ in range(8)))
            assert set(statuses) == {200}, statuses
            restores = peak(node.proc.pid) - before
            store = StoreId.parse(STORE)
            url = f"http://{node.address}/v1/stores/{STORE}/chain?version={versions}"
            async with s.get(url) as r:
                chain = decode_chain(await r.read())
            tasks = tuple(
                ChunkTask(chunk_key(store, m.version, c.name), pos, m.version, c.name,
                          c.checksum, c.size, c.raw_size, c.rows, (node.address,), c.lo, c.hi)
                for pos, m in enumerate(chain)
                for c in m.chunks
            )  # fmt: skip
            plan = encode_hop(store, Hop(node.address, tasks), True, 0, chain[-1].key_groups)
            reset_peak(node.proc.pid)
            before = peak(node.proc.pid)

            async def fold() -> int:
                url = f"http://{node.address}/v1/relay?store={STORE}"
                async with s.post(url, data=plan) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(fold() for _ in range(8)))
            assert set(statuses) == {200}, statuses
            return restores, peak(node.proc.pid) - before
    finally:
        node.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,48", help="MiB of state, comma-separated")
    p.add_argument("--budget", type=int, default=64, help="MiB of --memory-budget")
    p.add_argument("--free", type=int, default=8192, help="MiB of the unbounded node's budget")
    args = p.parse_args()
    print(machine(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="statestore-bench-restore-memory-") as tmp:
        for size in [int(x) for x in args.sizes.split(",")]:
            got = {}
            for name, budget in (("budget", args.budget), ("free", args.free)):
                got[name] = asyncio.run(measure(Path(tmp), size, budget * MiB))
                print(f"{size} MiB, {name}: {[round(x / MiB) for x in got[name]]} MiB", flush=True)
            (rb, fb), (rf, ff) = got["budget"], got["free"]
            rows.append(
                [size, args.budget, round(rb / MiB), round(rf / MiB), f"{rb / max(rf, 1):.2f}x",
                 round(fb / MiB), round(ff / MiB), f"{fb / max(ff, 1):.2f}x"]
            )  # fmt: skip
    heads = [
        "state MiB", "budget MiB", "8 restores: RSS growth MiB", f"with a {args.free} MiB budget",
        "ratio", "8 tree folds: RSS growth MiB", f"with a {args.free} MiB budget", "ratio",
    ]  # fmt: skip
    print("\n" + table(heads, rows))


if __name__ == "__main__":
    main()
