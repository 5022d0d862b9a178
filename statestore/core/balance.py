"""Load-aware balancing (pure): which token counts bring the ring's load within a bound.

Borealis' BPM moves load from the more loaded nodes to the less loaded ones, a unit at a
time, while that helps. Here the unit is a virtual node's token: every node reports its load
(bytes held, requests or bytes served per second, :class:`NodeLoad`), and :func:`plan` takes,
step by step, tokens from a node above the mean load and gives tokens to one below it (or
does one of the two), each step the one that evens the predicted loads out most (least
squared spread around the mean; max/mean alone gets stuck when the top two are close),
until max/mean is within ``bound`` or no step helps, and keeps the counts with the lowest
max/mean seen.

For bytes held, each node also reports where its chunks lie on the ring (:func:`histogram`:
bytes by the top 12 bits of their token), so a planned ring's loads are predicted bucket by
bucket from where the data is, not assumed uniform (chunks are few and large: a 1 GiB ring
holds a few hundred). For request rates a node's predicted load is its measured load scaled
by how much of the token space it holds a replica of (``Ring.coverage``) on the planned ring
against the current one, a first-order guess (a hot store moves with its range; running the
command again corrects). Tokens are coarse when nodes own few of them: below about 16 per
node a plan may stop short of the bound.

The moves are carried out (node/moves/rebalance.py) one node at a time, through the same hand-over
as a join (a node gaining tokens pulls what it will own) or a leave (a node losing tokens
pushes what others will own); :meth:`Plan.steps` gives the order: gaining nodes first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statestore.core.placement import Member, Ring, item_token

__all__ = [
    "METRICS",
    "DecayingRate",
    "NodeLoad",
    "Plan",
    "ServedMeter",
    "histogram",
    "imbalance",
    "plan",
]

METRICS = ("bytes", "requests", "served")
DEFAULT_BOUND = 1.15
MAX_MOVES = 400  # moves one plan takes at most
MAX_TRIALS = 4000  # rings one plan builds at most (bounds its work: about a ms each)
HIST_BITS = 12  # a load report's histogram: bytes held by item token, in 4096 buckets
BUCKETS = 1 << HIST_BITS
MIN_VNODES = 1
MAX_VNODES = 4096  # core/view.MAX_VIEW_VNODES


class DecayingRate:
    """A per-second rate whose past fades over ``window`` seconds (an exponentially decaying
    count divided by the window); time is passed in."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._value = 0.0
        self._at: float | None = None

    def _decay(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._value *= math.exp(-(now - self._at) / self.window)
        self._at = now if self._at is None else max(self._at, now)

    def add(self, n: float, now: float) -> None:
        self._decay(now)
        self._value += n

    def rate(self, now: float) -> float:
        self._decay(now)
        return self._value / self.window


class ServedMeter:
    """Requests and body bytes a node served, as decaying per-second rates."""

    def __init__(self, window: float = 60.0) -> None:
        self.requests = DecayingRate(window)
        self.bytes = DecayingRate(window)

    def add(self, nbytes: int, now: float) -> None:
        self.requests.add(1, now)
        self.bytes.add(nbytes, now)


@dataclass(frozen=True)
class NodeLoad:
    """One node's report (``GET /v1/load``): ``vnodes`` it owns (resolved: never 0), bytes
    it holds, and the requests and body bytes it served per second lately."""

    id: str
    vnodes: int
    bytes_held: int
    requests_per_s: float = 0.0
    bytes_served_per_s: float = 0.0
    zone: str = ""
    # (bucket, bytes): the bytes of the chunks held, by the top HIST_BITS of their token
    histogram: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_report(cls, answer: Any) -> NodeLoad:
        """A ``GET /v1/load`` answer; raises ValueError when it is malformed."""
        try:
            load = cls(
                str(answer["id"]),
                int(answer["vnodes"]),
                int(answer["bytes_held"]),
                float(answer["requests_per_s"]),
                float(answer["bytes_served_per_s"]),
                str(answer.get("zone", "")),
                _histogram(answer.get("histogram", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(f"load report is malformed ({exc!r})") from exc
        rates = (load.requests_per_s, load.bytes_served_per_s)
        if not (
            MIN_VNODES <= load.vnodes <= MAX_VNODES
            and load.bytes_held >= 0
            and all(0 <= x < math.inf for x in rates)
        ):
            raise ValueError(f"load report of {load.id!r:.80} is out of range")
        return load

    def value(self, metric: str) -> float:
        if metric == "bytes":
            return float(self.bytes_held)
        if metric == "requests":
            return self.requests_per_s
        if metric == "served":
            return self.bytes_served_per_s
        raise ValueError(f"no load metric {metric!r}: one of {', '.join(METRICS)}")


def histogram(sizes: Iterable[tuple[str, int]]) -> tuple[tuple[int, int], ...]:
    """``(bucket, bytes)`` of items given as ``(key, size)``, by the top bits of their token."""
    out: dict[int, int] = {}
    shift = 64 - HIST_BITS
    for key, n in sizes:
        b = item_token(key) >> shift
        out[b] = out.get(b, 0) + n
    return tuple(sorted(out.items()))


def _histogram(obj: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(obj, list) or len(obj) > BUCKETS:
        raise ValueError(f"a histogram is a list of at most {BUCKETS} [bucket, bytes] pairs")
    out = []
    for pair in obj:
        b, n = pair
        if type(b) is not int or type(n) is not int or not (0 <= b < BUCKETS and n >= 0):
            raise ValueError(f"histogram pair {pair!r:.60} is out of range")
        out.append((b, n))
    return tuple(out)


def imbalance(loads: Mapping[str, float]) -> float:
    """max/mean of ``loads`` (1.0 for an empty or idle ring)."""
    if not loads:
        return 1.0
    mean = sum(loads.values()) / len(loads)
    return max(loads.values()) / mean if mean > 0 else 1.0


def _spread(loads: Mapping[str, float]) -> float:
    """Sum of squared relative deviations from the mean load."""
    mean = sum(loads.values()) / len(loads)
    if mean <= 0:
        return 0.0
    return sum((v / mean - 1.0) ** 2 for v in loads.values())


@dataclass(frozen=True)
class Plan:
    """Token counts now and planned, loads measured and predicted, and the moves that lead
    from one to the other (``(from, to, tokens)``, in the order they were chosen)."""

    metric: str
    bound: float
    vnodes_before: dict[str, int]
    vnodes_after: dict[str, int]
    load_before: dict[str, float]
    load_after: dict[str, float]
    moves: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def ratio_before(self) -> float:
        return imbalance(self.load_before)

    @property
    def ratio_after(self) -> float:
        return imbalance(self.load_after)

    @property
    def needed(self) -> bool:
        """Whether the ring is past the bound now."""
        return self.ratio_before > self.bound

    def steps(self) -> list[tuple[str, int]]:
        """``(node, new token count)`` for every node whose count changes: the ones that
        gain first (largest gain first), then the ones that lose."""
        changed = [
            (n, self.vnodes_after[n] - self.vnodes_before[n])
            for n in sorted(self.vnodes_after)
            if self.vnodes_after[n] != self.vnodes_before[n]
        ]
        gains = sorted((c for c in changed if c[1] > 0), key=lambda c: (-c[1], c[0]))
        losses = sorted((c for c in changed if c[1] < 0), key=lambda c: (c[1], c[0]))
        return [(n, self.vnodes_after[n]) for n, _ in gains + losses]


def _coverage(nodes: Sequence[NodeLoad], weights: Mapping[str, int], r: int) -> dict[str, float]:
    ring = Ring((Member(n.id, n.zone, weights[n.id]) for n in nodes), MIN_VNODES)
    return ring.coverage(r)


def plan(
    nodes: Sequence[NodeLoad],
    replicas: int,
    metric: str = "bytes",
    bound: float = DEFAULT_BOUND,
    max_moves: int = MAX_MOVES,
) -> Plan:
    """The token counts that bring max/mean ``metric`` load within ``bound`` (module
    docstring); the current counts when the ring already is, or when no move helps.

    Raises ValueError for fewer than two nodes, a bound below 1, or an unknown metric."""
    if len(nodes) < 2:
        raise ValueError("a rebalance needs at least two nodes that own tokens")
    if not bound >= 1.0:
        raise ValueError(f"the bound is max/mean load, 1.0 or more, not {bound}")
    if len({n.id for n in nodes}) != len(nodes):
        raise ValueError("a node reported twice")
    before = {n.id: n.vnodes for n in nodes}
    measured = {n.id: n.value(metric) for n in nodes}
    cov = _coverage(nodes, before, replicas)
    total = sum(measured.values())
    mean_density = total / max(sum(cov.values()), 1e-12)
    # a node holding nothing yet (its density unknown) is taken at the ring's mean density
    density = {
        i: measured[i] / cov[i] if cov[i] > 0 and measured[i] > 0 else mean_density for i in before
    }

    # bytes: where the ring's data lies, from the nodes' histograms (each item counted once)
    spread_of: dict[int, float] = {}
    if metric == "bytes":
        copies = min(replicas, len(nodes))
        for n in nodes:
            for b, size in n.histogram:
                spread_of[b] = spread_of.get(b, 0.0) + size / copies
    shift, half = 64 - HIST_BITS, 1 << (63 - HIST_BITS)

    def predict(weights: Mapping[str, int]) -> dict[str, float]:
        if spread_of:  # what each node would hold, bucket by bucket
            ring = Ring((Member(n.id, n.zone, weights[n.id]) for n in nodes), MIN_VNODES)
            out = dict.fromkeys(weights, 0.0)
            for b, size in spread_of.items():
                for node in ring.token_replicas((b << shift) + half, replicas):
                    out[node] += size
            return out
        c = _coverage(nodes, weights, replicas)
        return {i: density[i] * c[i] for i in weights}

    weights = dict(before)
    moves: list[tuple[str, str, int]] = []
    predicted = predict(weights) if spread_of else dict(measured)
    ratio = imbalance(predicted)
    if total <= 0:
        return Plan(metric, bound, before, weights, measured, predicted, moves)
    spread = _spread(predicted)
    best = (ratio, dict(weights), dict(predicted), len(moves))
    trials = 0
    for _ in range(max_moves):
        if ratio <= bound or trials >= MAX_TRIALS:
            break
        # every step of a few sizes from a node above the mean to one below it; the one
        # that evens the loads out most (least squared spread: max/mean alone gets stuck
        # when the top two are close) is taken
        mean = sum(predicted.values()) / len(predicted)
        above = sorted(i for i in predicted if predicted[i] > mean)
        below = sorted(i for i in predicted if predicted[i] < mean)
        step: tuple[float, dict[str, int], dict[str, float], tuple[str, str, int]] | None = None
        for src in [*above, ""]:
            for dst in [*below, ""]:
                if not (src or dst):
                    continue
                # steps up to half the smaller count involved: a node is not swapped for
                # another (that would move its data twice)
                base = min(weights[i] for i in (src, dst) if i)
                for k in sorted({1, *(max(1, base // d) for d in (8, 4, 2))}):
                    trial = dict(weights)
                    if src:
                        trial[src] -= k
                    if dst:
                        trial[dst] += k
                    if any(not MIN_VNODES <= trial[i] <= MAX_VNODES for i in (src, dst) if i):
                        continue
                    loads = predict(trial)
                    trials += 1
                    s = _spread(loads)
                    if s < spread - 1e-12 and (step is None or s < step[0]):
                        step = (s, trial, loads, (src, dst, k))
        if step is None:
            break
        spread, weights, predicted, move = step
        moves.append(move)
        ratio = imbalance(predicted)
        if ratio < best[0] - 1e-12:
            best = (ratio, dict(weights), dict(predicted), len(moves))
    ratio, weights, predicted, kept = best
    moves = moves[:kept]
    return Plan(metric, bound, before, weights, measured, predicted, moves)
