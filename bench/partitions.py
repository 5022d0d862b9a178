"""Partition schedules on real node processes (tests/partition/, docs/reliability.md).

Usage (root: network namespaces and iptables)::

    python bench/partitions.py --schedules 200 --seed 1            # findings and a summary
    python bench/partitions.py --replay 8417395 --log               # one schedule, with its log

One ring of ``--nodes`` processes (each in its own network namespace, the clients on a bridge)
serves every schedule; each schedule uses stores of its own and ends with everything healed.
Schedule ``i`` uses the seed ``derive(seed, i)`` (printed with each finding). The exit status
is 1 when the checker found anything.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statestore.testing.cli import derive
from statestore.testing.netns import unavailable_reason
from statestore.testing.partition import PartitionRing, ScheduleOutcome, run_schedule


def _summary(outcomes: list[ScheduleOutcome], seconds: float) -> str:
    found = sum(len(o.violations) for o in outcomes)
    bad = sum(1 for o in outcomes if o.violations)
    trouble = sum(1 for o in outcomes if o.trouble)
    return (
        f"{len(outcomes)} schedules ({trouble} with trouble: ring unsettled or past deadline): "
        f"{sum(o.commits for o in outcomes)} commit attempts "
        f"({sum(o.acks for o in outcomes)} acknowledged, {sum(o.refused for o in outcomes)} "
        f"fenced, {sum(o.tentative for o in outcomes)} tentative of which "
        f"{sum(o.rolled_back for o in outcomes)} rolled back), "
        f"{sum(o.reads for o in outcomes)} reads, {sum(o.faults for o in outcomes)} "
        f"faults; {found} violation(s) in {bad} schedule(s); {seconds:.0f} s "
        f"({seconds / max(1, len(outcomes)):.1f} s per schedule)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--schedules", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--replay", type=int, default=None, help="one schedule by its own seed")
    p.add_argument("--log", action="store_true", help="print each schedule's log")
    p.add_argument(
        "--tentative",
        type=float,
        default=0.0,
        help="share of commits allowed to be tentative (a 1 s delay bound); default 0",
    )
    args = p.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    logging.getLogger("statestore").setLevel(logging.CRITICAL)
    seeds = (
        [args.replay]
        if args.replay is not None
        else [derive(args.seed, i) for i in range(args.schedules)]
    )
    outcomes: list[ScheduleOutcome] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="statestore-partitions-") as root:
        ring = PartitionRing(root, args.nodes)
        ring.start()
        try:
            for i, seed in enumerate(seeds):
                o = run_schedule(ring, seed, label=f"r{args.seed}i{i}", tentative=args.tentative)
                outcomes.append(o)
                if args.log or o.violations:  # a finding always comes with its log
                    print("\n".join(o.log))
                for v in o.violations:
                    print(f"FOUND schedule {i} seed {seed}: {v}", flush=True)
                if o.trouble:
                    print(f"TROUBLE schedule {i} seed {seed}: {o.trouble[:3000]}", flush=True)
                    ring.stop()  # a fresh ring for the next schedule
                    ring = PartitionRing(f"{root}/ring{i}", args.nodes)
                    ring.start()
                print(
                    f"schedule {i} seed {seed}: {o.commits} commits ({o.acks} acked, "
                    f"{o.refused} fenced, {o.tentative} tentative), {o.reads} reads, "
                    f"{o.faults} faults, "
                    f"{len(o.violations)} violation(s), {o.seconds:.1f} s",
                    flush=True,
                )
        finally:
            ring.stop()
    print(_summary(outcomes, time.monotonic() - started), flush=True)
    return 1 if any(o.violations for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
