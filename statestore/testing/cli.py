"""``statestore-sim``: run seeded fault schedules and report what the history checker found.

::

    statestore-sim --schedules 1000 --seed 1    # progress bar, findings, a summary line
    statestore-sim --replay 8417395             # one schedule by its own seed, with its log
    statestore-sim --schedules 1000 --seed 36 --disk-faults 0.1 --skew 5   # disk faults, skew

Schedule ``i`` of a run uses the seed ``derive(seed, i)``, printed with each finding, so a
finding replays on its own with ``--replay``. The exit status is 1 when anything was found.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from statestore.testing.schedule import DISK_FAULTS, Outcome, run_schedule

__all__ = ["derive", "main"]


def derive(seed: int, index: int) -> int:
    """The seed of schedule ``index`` of a run started with ``seed``."""
    return random.Random(f"{seed}/{index}").getrandbits(48)


def _report(console: Console, outcome: Outcome) -> None:
    for v in outcome.violations:
        console.print(f"[red]FOUND[/red] seed {outcome.seed}: {v}", highlight=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="statestore-sim",
        description="Run random fault schedules against the real node code on a simulated "
        "network and check every client-visible promise (docs/reliability.md).",
    )
    parser.add_argument("--schedules", type=int, default=100, help="how many (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="the run's seed (default 1)")
    parser.add_argument("--replay", type=int, help="run one schedule by its own seed, with log")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--tentative",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of the writers' commits allowed to be tentative (delay bound 1 s); "
        "0 (the default) keeps every seed's schedule as it was before tentative commits",
    )
    parser.add_argument(
        "--disk-faults",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of the steps that also hit one node's disk: lost writes, torn writes, "
        "flipped bits, a wiped data dir (testing/disk.py); 0 (the default) keeps every seed's "
        "schedule",
    )
    parser.add_argument(
        "--skew",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="each node's clock is off by up to this many seconds (and runs up to 0.1%% fast "
        "or slow); 0 (the default): every node reads the simulated time",
    )
    parser.add_argument(
        "--rebase-at",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="the nodes' --rebase-at (a snapshot only once the deltas weigh this share of the "
        "last one), with --snapshot-every 1 and 20 versions retained; 0 (the default): every "
        "seed's schedule as it was",
    )
    parser.add_argument(
        "--thin",
        type=int,
        default=0,
        metavar="N",
        help="the nodes' --thin-snapshots (keep the newest snapshot and those at "
        "multiples of N), with --snapshot-every 1 and 5 versions retained; 0 (the default): "
        "off",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.thin <= 1000:
        parser.error("--thin must be in [0, 1000]")
    for name in ("tentative", "disk_faults"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be a share in [0, 1]")
    if not 0.0 <= args.skew <= 3600.0:
        parser.error("--skew must be in [0, 3600] seconds")
    if not 0.0 <= args.rebase_at <= 1000.0:
        parser.error("--rebase-at must be in [0, 1000]")
    options = {
        "tentative": args.tentative,
        "disk_faults": args.disk_faults,
        "skew": args.skew,
        "rebase_at": args.rebase_at,
        "thin": args.thin,
    }
    # the nodes log what they route around (warnings); the findings are what matters here
    logging.getLogger("statestore").setLevel(logging.CRITICAL)
    console = Console(highlight=False, soft_wrap=True)

    if args.replay is not None:
        outcome = run_schedule(args.replay, **options)
        for line in outcome.log:
            console.print(line, markup=False)
        _report(console, outcome)
        console.print(_summary([outcome], 0.0))
        return 1 if outcome.violations else 0

    if args.schedules < 1:
        parser.error("--schedules must be at least 1")
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with Progress(
        TextColumn("schedules"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[found]} found"),
        TimeElapsedColumn(),
        console=console,
        disable=args.no_progress or not console.is_terminal,
    ) as progress:
        task = progress.add_task("run", total=args.schedules, found=0)
        for i in range(args.schedules):
            outcome = run_schedule(derive(args.seed, i), **options)
            outcomes.append(outcome)
            if outcome.violations:
                progress.console.print(f"schedule {i}:", end=" ")
                _report(progress.console, outcome)
            progress.update(task, advance=1, found=sum(len(o.violations) for o in outcomes))
    console.print(_summary(outcomes, time.perf_counter() - started))
    return 1 if any(o.violations for o in outcomes) else 0


def _summary(outcomes: list[Outcome], seconds: float) -> str:
    found = sum(len(o.violations) for o in outcomes)
    bad = sum(1 for o in outcomes if o.violations)
    rate = f", {len(outcomes) / seconds * 60:.0f} schedules/min" if seconds else ""
    return (
        f"{len(outcomes)} schedules: {sum(o.commits for o in outcomes)} commit attempts "
        f"({sum(o.acks for o in outcomes)} acknowledged, {sum(o.refused for o in outcomes)} "
        f"fenced"
        + (
            f", {sum(o.tentative for o in outcomes)} tentative of which "
            f"{sum(o.rolled_back for o in outcomes)} rolled back"
            if any(o.tentative for o in outcomes)
            else ""
        )
        + f"), {sum(o.reads for o in outcomes)} reads, "
        f"{sum(o.sim_seconds for o in outcomes):.0f} simulated seconds; "
        + _disk(outcomes)
        + f"{found} violation(s) in {bad} schedule(s){rate}"
    )


def _disk(outcomes: list[Outcome]) -> str:
    faults: Counter[str] = Counter()
    scrub: Counter[str] = Counter()
    for o in outcomes:
        faults.update(o.disk_faults)
        scrub.update(o.scrub)
    if not faults:
        return ""
    kinds = ", ".join(f"{faults[k]} {k}" for k in (*DISK_FAULTS, "lost batches"))
    return (
        f"disk faults: {kinds}; scrub: {scrub['scrubbed']} verified, "
        f"{scrub['scrub_corrupt']} corrupt found, {scrub['scrub_replaced']} replaced; "
    )


if __name__ == "__main__":
    sys.exit(main())
