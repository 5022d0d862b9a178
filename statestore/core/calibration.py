"""How far off the cost model's predictions ran, per plan shape (pure).

The restorer learns, for each shape (star, line, tree), how long its restores took against
what the model predicted, and ``auto`` scales each shape's prediction by that factor
(core/plan.py ``build``). A factor is only measured by running its shape, so a factor that
stopped being measured would never change again: one unlucky star restore (a collector
pause, a node busy with a move) made it look slow, ``auto`` went to line for good, and the
client's restores stayed 1.4-1.6x slower long after the node was idle again (measured:
docs/benchmarks.md, "The planner's calibration"). Two rules prevent that:

- a factor is the **median of its last** :data:`SAMPLES` **ratios**, so one outlier does not
  move it;
- a factor **fades back to the model** (1.0) as it ages, halving its distance (in log terms)
  every :data:`HALF_LIFE` restores measured in other shapes, so a shape not run lately is
  tried again and re-measured. The cost of that is an occasional restore in a shape that
  really is slower; the slower it is, the more restores pass before it is tried again (a
  shape measured at 4x, against another the model predicts 1.5x slower: 29 restores).

Age counts restores, not seconds: a client that restores once an hour keeps what it learned,
and one that restores ten times a second re-tries a shape within seconds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from statistics import median

__all__ = ["HALF_LIFE", "HIGH", "LOW", "SAMPLES", "Calibration"]

SAMPLES = 5  # ratios kept per shape; the factor is their median
HALF_LIFE = 16  # restores measured in other shapes for a factor's log to halve
LOW, HIGH = 0.2, 20.0  # one ratio is clamped to this range


class Calibration:
    """Per shape: actual / predicted restore time, robust to outliers and fading with age."""

    def __init__(self, half_life: float = HALF_LIFE, samples: int = SAMPLES) -> None:
        if half_life <= 0 or samples < 1:
            raise ValueError("half_life must be positive and samples at least 1")
        self.half_life = half_life
        self.samples = samples
        self.measured = 0  # restores learned from, in every shape
        self._ratios: dict[str, deque[float]] = {}
        self._at: dict[str, int] = {}  # ``measured`` when each shape was last learned from

    def learn(self, kind: str, ratio: float) -> None:
        """Record one restore of shape ``kind`` that took ``ratio`` times its prediction."""
        if not math.isfinite(ratio) or ratio <= 0:
            return
        kept = self._ratios.setdefault(kind, deque(maxlen=self.samples))
        kept.append(min(HIGH, max(LOW, ratio)))
        self.measured += 1
        self._at[kind] = self.measured

    def age(self, kind: str) -> int:
        """Restores measured in other shapes since ``kind`` was last (0: just now or never)."""
        return self.measured - self._at.get(kind, self.measured)

    def factor(self, kind: str) -> float:
        """The factor ``kind``'s predictions are scaled by (1.0: never measured)."""
        kept = self._ratios.get(kind)
        if not kept:
            return 1.0
        weight = 0.5 ** (self.age(kind) / self.half_life)
        return math.exp(math.log(median(kept)) * weight)

    def factors(self) -> Mapping[str, float]:
        """Every measured shape's factor (what ``build(calibration=...)`` takes)."""
        return {kind: self.factor(kind) for kind in self._ratios}
