"""Deterministic simulation: seeded fault schedules run the real node code on simulated time
over the in-memory network, and a checker judges the history of what clients saw
(docs/reliability.md). The same checker judges partition schedules on real node processes
(:mod:`statestore.testing.partition`, over :mod:`statestore.testing.netns`), which tests/ and
bench/ import from here."""

from statestore.testing.history import History, Violation, check
from statestore.testing.schedule import Outcome, run_schedule

__all__ = ["History", "Outcome", "Violation", "check", "run_schedule"]
