"""Deterministic simulation: seeded fault schedules run the real node code on simulated time
over the in-memory network, and a checker judges the history of what clients saw
(docs/reliability.md)."""

from statestore.sim.history import History, Violation, check
from statestore.sim.schedule import Outcome, run_schedule

__all__ = ["History", "Outcome", "Violation", "check", "run_schedule"]
