"""A node under a load meant to exhaust it (issue: the second hostile round, outage): the
memory budget over concurrent commits, on a real node process."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import aiohttp

from statestore.cli.local import NodeProcess
from statestore.wire.rows import encode_puts

MIB = 1 << 20


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


async def test_concurrent_commits_are_held_to_the_memory_budget(tmp_path: Path) -> None:
    """Eight 16 MiB coordinator commits at once used to be chunked side by side (about 3.3x
    their bodies each, ~420 MiB); under a 64 MiB budget they take turns and all land."""
    node = NodeProcess(
        str(tmp_path / "n"),
        0,
        ["--no-dht", "--storage", "memory://", "--replicas", "1", "--write-quorum", "1",
         "--max-body", str(16 * MIB), "--max-commit", str(16 * MIB),
         "--memory-budget", str(64 * MIB)],
    )  # fmt: skip
    node.start([])
    try:
        assert node.proc is not None
        # 16 MiB of rows that compress to almost nothing: memory:// holds little afterwards
        keys = [b"k%07d" % i for i in range(4096)]
        body = encode_puts(keys, [b"v" * (4 * 1024 - 64)] * len(keys))
        assert 15 * MIB < len(body) <= 16 * MIB
        async with aiohttp.ClientSession() as s:
            before = peak_rss(node.proc.pid)

            async def commit(p: int) -> int:
                url = f"http://{node.address}/v1/stores/q/0/{p}/s/commit?version=1&epoch=1"
                async with s.post(url, data=io.BytesIO(body)) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(commit(p) for p in range(8)))
            grew = peak_rss(node.proc.pid) - before
            assert statuses == [201] * 8
            # one commit at a time (3 x 16 MiB taken of 64): its body, rows and chunks
            assert grew < 160 * MIB, f"peak RSS grew {grew / MIB:.0f} MiB"
    finally:
        node.stop()
