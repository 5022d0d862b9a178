"""Tentative commits under a real partition (docs/reliability.md, "Tentative commits").

Usage (root: network namespaces and iptables, statestore/testing/netns.py)::

    python bench/tentative.py --rounds 5 --commits 40 --bound 0.1

Three node processes in their own network namespaces (R=3, W=2), the writer on the bridge.
Each round runs, one after the other (the order swapped every round):

- **baseline**: ``--commits`` commits with ``delay_bound=--bound, allow_tentative=True`` and
  nothing cut (each acknowledged stable, by W replicas);
- **partition**: the writer and node 0 cut off from nodes 1 and 2 (iptables DROP, silence),
  the same commits: acknowledged tentative by node 0, the one replica the writer reaches.

Printed per round: p50 and p99 of each, the ratio of the p99s, and how long after the heal
every hint was handed back (every node's ``hints`` at 0) and every tentative commit decided.
Then one **competing writer** schedule: the writer commits tentatively behind the cut, a
second writer (epoch + 1) takes over on the other side from the last stable version, and
after the heal the share of the first writer's tentative commits confirmed vs rolled back;
and the same schedule without the second writer. The medians over rounds and the goal
(partition p99 <= bound + 20 ms) end the output.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from client import AsyncRingClient, StoreId
from statestore.cli.local import http_json
from statestore.testing.netns import unavailable_reason
from statestore.testing.partition import PartitionRing


def _rows(v: int, who: str) -> dict[bytes, bytes]:
    return {f"{who}-{v}-{i}".encode(): f"{who}{v}".encode() * 16 for i in range(20)}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _cut_writer_with_node0(ring: PartitionRing) -> None:
    ips, client = ring.net.ips, ring.net.client_ip
    ring.net.apply([(ips[0], ips[1]), (ips[0], ips[2]), (client, ips[1]), (client, ips[2])])


def _cut_writer_with_others(ring: PartitionRing) -> None:
    """The other side: node 0 cut off from everyone, the writers see nodes 1 and 2."""
    ips, client = ring.net.ips, ring.net.client_ip
    ring.net.apply([(ips[0], ips[1]), (ips[0], ips[2]), (client, ips[0])])


def _hints(ring: PartitionRing) -> int:
    return sum(int(http_json(a, "/v1/health")["stats"]["hints"]) for a in ring.addresses)


async def _commits(
    c: AsyncRingClient, sid: StoreId, first: int, n: int, bound: float, epoch: int
) -> tuple[list[float], int]:
    lat, tentative = [], 0
    for v in range(first, first + n):
        t = time.perf_counter()
        r = await c.commit(sid, v, _rows(v, "w"), epoch=epoch, delay_bound=bound,
                           allow_tentative=True)  # fmt: skip
        lat.append(time.perf_counter() - t)
        tentative += r.tentative
    return lat, tentative


async def _wait_decided(
    c: AsyncRingClient, sid: StoreId, n: int, timeout: float = 120
) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = [o.outcome for o in await c.outcomes(sid)]
        except Exception:
            got = []
        if len(got) >= n:
            return got
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{sid}: tentative commits not decided within {timeout} s")


async def _heal_and_time(
    ring: PartitionRing, c: AsyncRingClient, sid: StoreId, n: int
) -> tuple[float, float]:
    t = time.monotonic()
    ring.net.heal()
    decided = hints_gone = None
    while decided is None or hints_gone is None:
        if decided is None:
            try:
                if len(await c.outcomes(sid)) >= n:
                    decided = time.monotonic() - t
            except Exception:
                pass
        if hints_gone is None and await asyncio.to_thread(_hints, ring) == 0:
            hints_gone = time.monotonic() - t
        if time.monotonic() - t > 120:
            raise TimeoutError("hints not handed back within 120 s of the heal")
        await asyncio.sleep(0.05)
    return decided, hints_gone


async def run(ring: PartitionRing, rounds: int, n: int, bound: float) -> None:
    base_p99, part_p99, ratios, heal_hints, heal_decided = [], [], [], [], []
    async with AsyncRingClient(ring.addresses, timeout=1.0) as c:
        for r in range(rounds):
            for phase in ("baseline", "partition") if r % 2 == 0 else ("partition", "baseline"):
                sid = StoreId("tentbench", r, 0 if phase == "baseline" else 1)
                await c.commit(sid, 1, _rows(0, "w"), epoch=1)
                if phase == "partition":
                    _cut_writer_with_node0(ring)
                lat, tentative = await _commits(c, sid, 2, n, bound, 1)
                if phase == "partition":
                    decided, gone = await _heal_and_time(ring, c, sid, tentative)
                    ring.local.wait_ring(3)
                    heal_hints.append(gone)
                    heal_decided.append(decided)
                    part_p99.append(_pct(lat, 0.99))
                    print(
                        f"round {r} partition: {tentative}/{n} tentative, p50 "
                        f"{_pct(lat, 0.5) * 1000:.1f} ms, p99 {_pct(lat, 0.99) * 1000:.1f} ms; "
                        f"heal -> all decided {decided:.2f} s, hints handed back {gone:.2f} s"
                    )
                else:
                    base_p99.append(_pct(lat, 0.99))
                    print(
                        f"round {r} baseline:  {tentative}/{n} tentative, p50 "
                        f"{_pct(lat, 0.5) * 1000:.1f} ms, p99 {_pct(lat, 0.99) * 1000:.1f} ms"
                    )
            ratios.append(part_p99[-1] / base_p99[-1])

        shares = {}
        for competing in (False, True):
            sid = StoreId("tentbench", 99, int(competing))
            await c.commit(sid, 1, _rows(0, "w"), epoch=1)
            _cut_writer_with_node0(ring)
            _, tentative = await _commits(c, sid, 2, n, bound, 1)
            if competing:
                _cut_writer_with_others(ring)
                async with AsyncRingClient(ring.addresses[1:], timeout=1.0) as w2:
                    st = await w2.restore(sid)
                    await w2.commit(sid, st.version + 1, _rows(1, "w2"), epoch=2,
                                    base_epoch=st.epoch)  # fmt: skip
            ring.net.heal()
            got = await _wait_decided(c, sid, tentative)
            ring.local.wait_ring(3)
            shares[competing] = (got.count("confirmed"), got.count("rolled_back"), tentative)
            fixes = await c.corrections(sid)
            print(f"{'with' if competing else 'without'} a competing writer: {tentative} tentative "
                  f"-> {got.count('confirmed')} confirmed, {got.count('rolled_back')} rolled back"
                  + (f"; correction: versions {fixes[0].versions[0]}-{fixes[0].versions[-1]}, "
                     f"replay from v{fixes[0].replay_from}" if fixes else ""))  # fmt: skip

    q = statistics.quantiles
    print(
        f"\n{rounds} rounds x {n} commits, delay bound {bound * 1000:.0f} ms:\n"
        f"  baseline p99 median {statistics.median(base_p99) * 1000:.1f} ms; partition p99 median "
        f"{statistics.median(part_p99) * 1000:.1f} ms (max {max(part_p99) * 1000:.1f} ms); "
        f"goal <= {bound * 1000 + 20:.0f} ms: "
        f"{'met' if statistics.median(part_p99) <= bound + 0.020 else 'MISSED'}\n"
        f"  p99 ratio partition/baseline median {statistics.median(ratios):.2f}x"
        + (f" (quartiles {q(ratios)[0]:.2f}-{q(ratios)[2]:.2f})" if len(ratios) > 1 else "")
        + f"\n  heal -> hints handed back: median {statistics.median(heal_hints):.2f} s "
        f"(max {max(heal_hints):.2f}); heal -> every tentative commit decided: median "
        f"{statistics.median(heal_decided):.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commits", type=int, default=40)
    ap.add_argument("--bound", type=float, default=0.1)
    args = ap.parse_args()
    reason = unavailable_reason()
    if reason:
        sys.exit(f"needs network namespaces: {reason}")
    with tempfile.TemporaryDirectory() as d:
        ring = PartitionRing(d, 3)
        ring.start()
        try:
            asyncio.run(run(ring, args.rounds, args.commits, args.bound))
        finally:
            ring.stop()


if __name__ == "__main__":
    main()
