"""Token buckets (pure): how fast one client token may send requests and bytes.

A bucket holds up to ``burst`` units and refills at ``rate`` units per second. A request is
admitted when its bucket holds at least one unit (requests) or anything at all (bytes: a body
larger than the burst is admitted once and leaves the bucket in debt, so big chunks are not
refused for ever); otherwise the caller is told how long to wait. Time is passed in, so the
rules are tested without a clock.

Answers are charged when they are known, after the request, so requests sent in parallel
would all be admitted on one bucket's credit: a limited token may have at most
``max_in_flight`` requests in flight on a node (default :data:`MAX_IN_FLIGHT`), which bounds
what it gets past its byte rate to that many answers before its debt makes it wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from statestore.core.errors import RateLimited

__all__ = ["MAX_IN_FLIGHT", "Bucket", "Limiter", "Limits"]

MAX_IN_FLIGHT = 16  # a limited token's requests in flight on one node


@dataclass(frozen=True)
class Limits:
    """A token's rates (None: unlimited); the burst is ``burst_seconds`` of each rate."""

    requests_per_second: float | None = None
    bytes_per_second: float | None = None
    burst_seconds: float = 2.0
    max_in_flight: int = MAX_IN_FLIGHT

    @property
    def limited(self) -> bool:
        return self.requests_per_second is not None or self.bytes_per_second is not None


class Bucket:
    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.level = self.burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait(self, need: float, now: float) -> float:
        """Seconds until the bucket holds ``need`` units (0: it does now)."""
        self._refill(now)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, cost: float, now: float) -> None:
        """Take ``cost`` units (the level may go below zero: debt paid back by waiting)."""
        self._refill(now)
        self.level -= cost


class Limiter:
    """The buckets of every limited token, by the token's key (its digest)."""

    def __init__(self) -> None:
        self._buckets: dict[bytes, tuple[Limits, Bucket | None, Bucket | None]] = {}
        self._in_flight: dict[bytes, int] = {}

    def _of(self, key: bytes, limits: Limits, now: float) -> tuple[Bucket | None, Bucket | None]:
        cur = self._buckets.get(key)
        if cur is None or cur[0] != limits:  # new token, or its rates changed in the file
            req = byt = None
            if limits.requests_per_second is not None:
                rate = limits.requests_per_second
                req = Bucket(rate, rate * limits.burst_seconds, now)
            if limits.bytes_per_second is not None:
                rate = limits.bytes_per_second
                byt = Bucket(rate, rate * limits.burst_seconds, now)
            cur = (limits, req, byt)
            self._buckets[key] = cur
        return cur[1], cur[2]

    def admit(self, key: bytes, limits: Limits, body_bytes: int, now: float) -> None:
        """Take one request and ``body_bytes`` from the token's buckets and count it in
        flight (:meth:`done` when it ends), or raise RateLimited (taking nothing) saying how
        long to wait."""
        req, byt = self._of(key, limits, now)
        wait = max(
            req.wait(1.0, now) if req is not None else 0.0,
            byt.wait(1e-9, now) if byt is not None else 0.0,
        )
        busy = self._in_flight.get(key, 0)
        if wait <= 0 and busy >= limits.max_in_flight:
            raise RateLimited(
                f"this token has {busy} requests in flight on this node, its limit: retry in "
                "a moment, or send fewer at once",
                retry_after=0.1,
            )
        if wait > 0:
            raise RateLimited(
                f"this token is over its rate ({_describe(limits)}): retry in {wait:.2f}s, "
                "or ask for a token with a higher rate",
                retry_after=wait,
            )
        if req is not None:
            req.take(1.0, now)
        if byt is not None:
            byt.take(body_bytes, now)
        self._in_flight[key] = busy + 1

    def done(self, key: bytes) -> None:
        """A request :meth:`admit` let in has ended (answered or failed)."""
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)

    def charge(self, key: bytes, limits: Limits, nbytes: int, now: float) -> None:
        """Charge bytes sent back to the token (answers, restores) once they are known."""
        _, byt = self._of(key, limits, now)
        if byt is not None and nbytes > 0:
            byt.take(nbytes, now)

    def forget_except(self, keys: set[bytes]) -> None:
        """Drop the buckets of tokens no longer in the file."""
        for key in [k for k in self._buckets if k not in keys]:
            del self._buckets[key]


def _describe(limits: Limits) -> str:
    parts = []
    if limits.requests_per_second is not None:
        parts.append(f"{limits.requests_per_second:g} requests/s")
    if limits.bytes_per_second is not None:
        parts.append(f"{limits.bytes_per_second:g} bytes/s")
    return ", ".join(parts)
