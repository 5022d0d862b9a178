"""``statestore-fuzz``: fuzz every wire decoder and every endpoint of a node, and report.

::

    statestore-fuzz --inputs 1000000 --requests 200000 --seed 1 --jobs 2
    statestore-fuzz --replay manifest:129 --seed 1      # one decoder input, shown and run

Decoder inputs are split evenly over the targets of ``testing/fuzz.py`` (``--targets`` picks
some); endpoint requests go to one node (``testing/fuzz_api.py``). The exit status is 1 when
anything was found: a crash, a broken contract, a slow or memory-hungry input, a hang, a 500,
a 5xx on a committed store, or a change to committed state.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from statestore.core.errors import StateStoreError
from statestore.testing.fuzz import TARGETS, TargetReport, fuzz_target, one_input
from statestore.testing.fuzz_api import ApiReport, fuzz_endpoints

__all__ = ["main", "run_endpoints"]

SLICE = 20_000  # decoder inputs per job


def run_endpoints(seed: int, count: int) -> ApiReport:
    """``count`` endpoint requests against a fresh node in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="statestore-fuzz-") as root:
        return asyncio.run(fuzz_endpoints(root, seed, count))


def _replay(spec: str, seed: int) -> int:
    name, _, index = spec.partition(":")
    if name not in TARGETS or not index.isdigit():
        print(f"--replay takes TARGET:INDEX, TARGET one of {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    data = one_input(name, seed, int(index))
    print(f"input ({len(data)} bytes): {data.hex()}")
    try:
        result = TARGETS[name].decode(data)
    except StateStoreError as exc:
        print(f"refused: {type(exc).__name__}: {exc}")
        return 0
    print(f"accepted: {result!r:.2000}")
    TARGETS[name].check(result)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="statestore-fuzz",
        description="Fuzz every wire decoder and every node endpoint (docs/reliability.md).",
    )
    parser.add_argument("--inputs", type=int, default=100_000, help="decoder inputs in all")
    parser.add_argument("--requests", type=int, default=10_000, help="endpoint requests")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--targets", default="", help="comma-separated decoder targets")
    parser.add_argument("--replay", help="TARGET:INDEX: run one decoder input and show it")
    args = parser.parse_args(argv)
    logging.getLogger("statestore").setLevel(logging.CRITICAL)
    if args.replay:
        return _replay(args.replay, args.seed)
    names = [t for t in args.targets.split(",") if t] or list(TARGETS)
    unknown = [t for t in names if t not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    per = args.inputs // len(names) if args.inputs else 0
    started = time.perf_counter()
    reports = {n: TargetReport(n) for n in names}
    api: ApiReport | None = None
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        api_job = pool.submit(run_endpoints, args.seed, args.requests) if args.requests else None
        jobs: list[tuple[str, Future[TargetReport]]] = [
            (n, pool.submit(fuzz_target, n, args.seed, start, min(SLICE, per - start)))
            for n in names
            for start in range(0, per, SLICE)
        ]
        for n, job in jobs:
            reports[n].merge(job.result())
        if api_job is not None:
            api = api_job.result()
    seconds = time.perf_counter() - started
    return _print(reports, api, args.seed, seconds)


def _print(reports: dict[str, TargetReport], api: ApiReport | None, seed: int, took: float) -> int:
    bad = False
    total = 0
    print(f"{'target':18} {'inputs':>9} {'accepted':>9} {'refused':>9} {'crash':>6} "
          f"{'contract':>8} {'slow':>5} {'memory':>6} {'max ms':>7} {'peak KiB':>9}")  # fmt: skip
    for r in reports.values():
        total += r.inputs
        print(
            f"{r.target:18} {r.inputs:9} {r.accepted:9} {sum(r.refused.values()):9} "
            f"{r.crashes:6} {r.contract:8} {r.slow:5} {r.memory:6} "
            f"{r.max_seconds * 1000:7.1f} {r.max_peak / 1024:9.0f}"
        )
        for f in r.findings:
            bad = True
            print("  FOUND", f.line(seed))
    print(f"decoders: {total} inputs")
    if api is not None:
        print(
            f"endpoints: {api.requests} requests ({api.unparsable} refused by any HTTP parser "
            f"before the application), by status {dict(sorted(api.by_status.items()))}; "
            f"5xx {api.five_xx} {api.five_xx_codes} (500: {api.internal}, on committed "
            f"stores: {api.five_xx_committed}), escaped {api.escaped}, hangs {api.hangs}, "
            f"slowest {api.max_seconds * 1000:.0f} ms; committed state: "
            f"{len(api.committed_changed)} change(s), {api.restores_checked} restores compared"
        )
        for line in api.server_errors[:8]:
            print("  5xx/hang:", line[:400])
        for line in api.committed_changed:
            print("  CHANGED:", line)
        bad = bad or bool(
            api.internal
            or api.five_xx_committed
            or api.escaped
            or api.hangs
            or api.committed_changed
        )
    print(f"took {took:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
