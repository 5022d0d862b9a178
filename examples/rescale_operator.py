"""A keyed Python stream operator that scales out mid-stream with exact results.

Run it from the repository root (after ``./run demo`` or ``pip install '.[node]'``)::

    .venv/bin/python examples/rescale_operator.py

It starts a local 3-node ring, runs a per-user running total over a stream of events with 2
partitions (each partition commits its delta and source position every batch), rescales the
operator to 5 partitions at a batch boundary (``client.rescale``: each new partition restores
its key-group range from the old stores and commits it as a snapshot under a new epoch), runs
the rest of the stream on 5 partitions, and checks every total against a one-process count.
"""

from __future__ import annotations

import random
import sys
import tempfile

from client import RingClient, StoreId
from client.rescale import partition_of, rescale
from statestore.cli.local import LocalRing

BATCH = 100


def run(
    ring: RingClient,
    query: str,
    parts: int,
    events: list[tuple[bytes, int]],
    start: int,
    version: int,
    epoch: int,
) -> int:
    """Process ``events`` from offset ``start`` on ``parts`` partitions of ``query``, resuming
    from the ring at ``version``; returns the last committed version."""
    stores = [StoreId(query, 0, p, "totals") for p in range(parts)]
    state = [dict(ring.restore(s)) if version else {} for s in stores]
    for offset in range(start, len(events), BATCH):
        version += 1
        delta: list[dict[bytes, bytes]] = [{} for _ in stores]
        for user, amount in events[offset : offset + BATCH]:
            p = partition_of(user, parts)  # route by key group: rescalable
            total = int(state[p].get(user, b"0")) + amount
            state[p][user] = delta[p][user] = str(total).encode()
        for p, sid in enumerate(stores):
            ring.commit(sid, version, delta[p], positions={"events": offset + BATCH}, epoch=epoch)
    return version


def main() -> int:
    rng = random.Random(42)
    users = [f"user-{i:04d}".encode() for i in range(1000)]
    events = [(rng.choice(users), rng.randint(1, 100)) for _ in range(4000)]
    half = 2000

    with tempfile.TemporaryDirectory() as tmp:
        local = LocalRing(tmp, 3).start()
        try:
            with RingClient(local.seeds) as ring:
                run(ring, "totals", 2, events[:half], 0, 0, epoch=1)
                old = [StoreId("totals", 0, p, "totals") for p in range(2)]
                new = [StoreId("totals-x5", 0, p, "totals") for p in range(5)]
                rescale(ring, old, new, epoch=2)
                resume = ring.restore(new[0]).positions["events"]
                print(f"rescaled 2 -> 5 partitions at event {resume}")
                run(ring, "totals-x5", 5, events, resume, 1, epoch=2)
                got: dict[bytes, bytes] = {}
                for sid in new:
                    got.update(ring.restore(sid))
        finally:
            local.stop()

    expected: dict[bytes, int] = {}
    for user, amount in events:
        expected[user] = expected.get(user, 0) + amount
    wrong = [u for u, total in expected.items() if int(got.get(u, b"-1")) != total]
    print(f"{len(expected)} users, {len(wrong)} wrong totals after rescaling mid-stream")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
