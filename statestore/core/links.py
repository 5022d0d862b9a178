"""Link statistics (pure): what the restorer learned of each source from its own transfers.

The planner's cost model (core/plan.py) predicts a plan's time from these figures; they are
exponentially weighted moving averages of throughput (transfers of 64 KiB or more) and of
latency (smaller ones), so that a link's recent behaviour counts most.
"""

from __future__ import annotations

from statestore.core.plan import LinkStats

__all__ = ["LinkTable"]


class LinkTable:
    """Per-source EWMA of throughput and latency, from the restorer's own transfers."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._links: dict[str, LinkStats] = {}

    def observe(self, address: str, nbytes: int, seconds: float) -> None:
        seconds = max(seconds, 1e-6)
        cur = self._links.get(address)
        tput = nbytes / seconds if nbytes >= 64 * 1024 else None
        lat = seconds if nbytes < 64 * 1024 else None
        base = cur or LinkStats()
        a = self.alpha
        self._links[address] = LinkStats(
            base.throughput
            if tput is None
            else (tput if cur is None else (1 - a) * base.throughput + a * tput),
            base.latency
            if lat is None
            else (lat if cur is None else (1 - a) * base.latency + a * lat),
        )

    def snapshot(self) -> dict[str, LinkStats]:
        return dict(self._links)
