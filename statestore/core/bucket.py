"""A token bucket (pure, time passed in): the restorer's ingress cap."""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` bytes per second with a burst of ``burst`` bytes; it starts with ``tokens``
    (None: full)."""

    def __init__(self, rate: float, burst: float, now: float, tokens: float | None = None) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._tokens = burst if tokens is None else min(burst, tokens)
        self._at = now

    def reserve(self, amount: int, now: float) -> float:
        """Take ``amount`` tokens; returns how long to wait before using them."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
