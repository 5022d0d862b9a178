"""The planner's calibration (pure): robust to one outlier, fading back to the model."""

from __future__ import annotations

import math
from typing import cast

import pytest

from statestore.core.calibration import HALF_LIFE, HIGH, LOW, SAMPLES, Calibration
from statestore.core.plan import build
from statestore.net.restorer import Restorer
from statestore.net.transport import Transport
from tests.corekit import tasks


def test_a_shape_never_measured_keeps_the_models_prediction() -> None:
    cal = Calibration()
    assert cal.factor("star") == 1.0
    assert cal.factors() == {}


def test_one_outlier_does_not_move_the_factor() -> None:
    cal = Calibration()
    for ratio in (0.8, 0.8, 0.8, 0.8, 12.0):  # one restore caught in a collector pause
        cal.learn("star", ratio)
    assert cal.factor("star") == pytest.approx(0.8)


def test_the_factor_is_the_median_of_the_last_samples_only() -> None:
    cal = Calibration(samples=3)
    for ratio in (5.0, 5.0, 5.0, 0.5, 0.5):
        cal.learn("line", ratio)
    assert cal.factor("line") == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        (0, 4.0),
        (HALF_LIFE, 2.0),  # its log halves each half-life: 4 -> 2 -> sqrt(2)
        (2 * HALF_LIFE, math.sqrt(2)),
        (20 * HALF_LIFE, 1.0),
    ],
)
def test_a_factor_fades_back_to_the_model_as_other_shapes_run(others: int, expected: float) -> None:
    cal = Calibration()
    cal.learn("star", 4.0)
    for _ in range(others):
        cal.learn("line", 0.5)
    assert cal.age("star") == others
    assert cal.factor("star") == pytest.approx(expected, rel=1e-3)
    assert cal.factors()["star"] == pytest.approx(expected, rel=1e-3)
    assert cal.factor("line") == pytest.approx(0.5 if others else 1.0)


def test_a_fresh_sample_restarts_the_fade() -> None:
    cal = Calibration()
    cal.learn("star", 0.5)
    for _ in range(50):
        cal.learn("line", 1.0)
    cal.learn("star", 0.5)
    assert cal.age("star") == 0
    assert cal.factor("star") == pytest.approx(0.5)


def test_time_alone_does_not_fade_a_factor() -> None:
    """A client that restores once an hour keeps what it learned."""
    cal = Calibration()
    cal.learn("tree", 3.0)
    assert cal.factor("tree") == pytest.approx(3.0)
    assert cal.age("never run") == 0


@pytest.mark.parametrize("ratio", [0.0, -1.0, math.nan, math.inf])
def test_a_ratio_that_is_not_a_positive_number_is_ignored(ratio: float) -> None:
    cal = Calibration()
    cal.learn("star", ratio)
    assert cal.factors() == {}
    assert cal.measured == 0


def test_one_ratio_is_clamped() -> None:
    cal = Calibration(samples=1)
    cal.learn("tree", 1e9)
    assert cal.factor("tree") == pytest.approx(HIGH)
    cal.learn("tree", 1e-9)
    assert cal.factor("tree") == pytest.approx(LOW)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Calibration(half_life=0)
    with pytest.raises(ValueError):
        Calibration(samples=0)


def test_auto_tries_a_shape_again_once_a_slow_spell_has_faded() -> None:
    """The measured failure: a few slow star restores sent auto to another shape, and star,
    no longer run, kept its bad factor for good."""
    ts = tasks(1, 32)  # a snapshot, ingress free: star is the model's pick
    assert build("auto", ts).kind == "star"
    cal = Calibration()
    for _ in range(3):  # a slow spell (4x): a majority of the kept samples
        cal.learn("star", 4.0)
    runs = []
    for _ in range(10 * HALF_LIFE):  # what auto picks, restore after restore
        plan = build("auto", ts, calibration=cal.factors())
        runs.append(plan.kind)
        if plan.kind == "star":
            break
        cal.learn(plan.kind, 1.5)  # the other shape ran slower than predicted
    assert runs[0] != "star"
    assert runs[-1] == "star"  # star is tried again ...
    assert len(runs) <= 3 * HALF_LIFE  # ... within a few half-lives


def test_a_restore_learns_from_the_factor_its_plan_was_built_with() -> None:
    """Restores that finish while this one runs move the factor. The sample divides the plan's
    prediction by the factor the plan was built with (kept on the plan), not by the moved
    one: dividing by the moved one fed every move back into the next sample."""
    ts = tasks(1, 8)
    plan = build("star", ts, calibration={"star": 2.0})  # built while star ran 2x its model
    assert plan.calibration == {"star": 2.0}
    raw = plan.predictions["star"] / 2.0
    restorer = Restorer(cast(Transport, object()))  # the transport is not used to learn
    for _ in range(SAMPLES - 1):  # meanwhile, other star restores ran at 4x ...
        restorer.calibration.learn("star", 4.0)
    assert restorer.calibration.factor("star") == pytest.approx(4.0)  # ... and moved it
    restorer._calibrate(plan, 3.0 * raw, rerouted=0)  # this one ran at 3x its raw prediction
    restorer.calibration.learn("star", 1.0)
    restorer.calibration.learn("star", 1.0)  # kept: 4, 4, 3, 1, 1: the median is its sample
    assert restorer.calibration.factor("star") == pytest.approx(3.0)
