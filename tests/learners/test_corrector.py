"""The River corrector: learns residuals and lengths online, clamps, detects drift."""

from __future__ import annotations

import math
import pickle
import random

import pytest

from steersman.learners.corrector import LengthCorrector
from steersman.learners.metrics import ProgressiveScore


def _stream(n: int, rng: random.Random, bias: float):
    """Requests whose length depends on a feature; the base model is off by factor ``bias``."""
    for _ in range(n):
        brief = float(rng.random() < 0.5)
        actual = rng.uniform(20, 40) if brief else rng.uniform(200, 400)
        x = {
            "brief": brief,
            "request_class": "chat",
            "base_tokens": actual * bias,
            "sm_activity_mean": rng.random(),
        }
        yield x, actual


def test_corrects_a_biased_base_model():
    rng = random.Random(0)
    corrector = LengthCorrector(lr=0.05)
    for x, y in _stream(3000, rng, bias=2.0):
        corrector.learn_one(x, y)
    errors_base, errors_corrected = [], []
    for x, y in _stream(300, rng, bias=2.0):
        errors_base.append(abs(x["base_tokens"] - y))
        errors_corrected.append(abs(corrector.predict_one(x) - y))
    assert sum(errors_corrected) < 0.3 * sum(errors_base)
    snap = corrector.score.snapshot()
    assert snap["within_30"] > 0.7 and snap["kendall_tau"] > 0.5


def test_without_a_base_it_is_the_fast_predictor():
    rng = random.Random(1)
    corrector = LengthCorrector(lr=0.05)
    assert corrector.predict_one({"brief": 1.0}) == pytest.approx(128.0)  # the prior
    for x, y in _stream(3000, rng, bias=1.0):
        corrector.learn_one({k: v for k, v in x.items() if k != "base_tokens"}, y)
    assert corrector.predict_one({"brief": 1.0}) < 60 < 150 < corrector.predict_one({"brief": 0.0})


def test_drift_is_detected_when_the_world_changes():
    rng = random.Random(2)
    corrector = LengthCorrector(lr=0.05)
    for x, y in _stream(1500, rng, bias=1.0):
        corrector.learn_one(x, y)
    before = len(corrector.drifts)
    for x, y in _stream(1500, rng, bias=6.0):
        corrector.learn_one(x, y)
    assert len(corrector.drifts) > before
    assert corrector.drifts[-1] > 1500


@pytest.mark.parametrize("base", [math.nan, math.inf, -math.inf, -5.0, 1e300])
def test_odd_values_are_clamped_not_raised(base):
    corrector = LengthCorrector()
    value = corrector.predict_one(
        {
            "base_tokens": base,
            "max_tokens": 512,
            "weird": math.nan,
            "huge": 10**400,
            "text": "ignored",
        }
    )
    assert 1.0 <= value <= 512.0
    corrector.learn_one({"base_tokens": base}, math.nan)  # an unusable outcome: ignored
    corrector.learn_one({"base_tokens": base}, 40)
    assert corrector.learned == 1


def test_state_pickles_and_reset_forgets():
    rng = random.Random(3)
    corrector = LengthCorrector(lr=0.05)
    for x, y in _stream(500, rng, bias=2.0):
        corrector.learn_one(x, y)
    x = {"brief": 1.0, "base_tokens": 60.0, "request_class": "chat"}
    restored = pickle.loads(pickle.dumps(corrector))
    assert restored.predict_one(x) == corrector.predict_one(x)
    corrector.reset()
    assert corrector.predict_one(x) == pytest.approx(60.0)


def test_progressive_score_window():
    score = ProgressiveScore(window=3)
    for predicted, actual in [(100, 100), (50, 100), (130, 100), (200, 100)]:
        score.update(predicted, actual)
    snap = score.snapshot()
    assert snap["n"] == 4
    assert snap["mae"] == pytest.approx((50 + 30 + 100) / 3)
    assert snap["within_30"] == pytest.approx(1 / 3)


def _noisy(n: int, rng: random.Random, sigma: float, cls: str = "chat"):
    """Lengths around the base prediction with a log-normal error of ``sigma``."""
    for _ in range(n):
        base = rng.uniform(50, 500)
        yield {"request_class": cls, "base_tokens": base}, base * math.exp(rng.gauss(0, sigma))


def _coverage(corrector: LengthCorrector, stream) -> float:
    inside = []
    for x, y in stream:
        band = corrector.predict_band(x)
        inside.append(band.lo <= y <= band.hi)
        corrector.learn_one(x, y)
    return sum(inside) / len(inside)


def test_the_band_holds_its_coverage_and_follows_the_errors():
    rng = random.Random(3)
    corrector = LengthCorrector(coverage=0.6, band_window=200)
    assert abs(_coverage(corrector, _noisy(1500, rng, 0.3)) - 0.6) < 0.05
    narrow = corrector.predict_band({"request_class": "chat", "base_tokens": 200.0})
    # The predictor gets worse: the band widens until it covers 60% again.
    _coverage(corrector, _noisy(400, rng, 1.0))
    assert abs(_coverage(corrector, _noisy(600, rng, 1.0)) - 0.6) < 0.05
    wide = corrector.predict_band({"request_class": "chat", "base_tokens": 200.0})
    assert wide.hi / wide.lo > 2 * (narrow.hi / narrow.lo)
    assert narrow.lo < narrow.mid < narrow.hi


def test_a_band_that_comes_out_nan_or_inverted_is_reset_and_counted_not_used():
    corrector = LengthCorrector(band_min=1)
    for x, y in _noisy(50, random.Random(4), 0.3):
        corrector.learn_one(x, y)
    high = corrector.bands["chat"][1]
    for _ in range(corrector.band_window):  # poisoned: the upper quantile falls below the lower
        high.update(-50.0)
    band = corrector.predict_band({"request_class": "chat", "base_tokens": 100.0})
    assert corrector.band_resets == 1 and "chat" not in corrector.bands
    assert band.lo < band.mid < band.hi and all(math.isfinite(v) for v in vars(band).values())


def test_the_fast_path_still_ranks_by_class_and_features():
    rng = random.Random(5)
    corrector = LengthCorrector(lr=0.05)
    for _ in range(2000):
        cls = rng.choice(["chat", "code"])
        brief = float(rng.random() < 0.5)
        length = (300 if cls == "chat" else 40) * (0.3 if brief else 1.0) * rng.uniform(0.8, 1.2)
        corrector.learn_one({"request_class": cls, "brief": brief}, length)
    got = {
        (cls, brief): corrector.predict_one({"request_class": cls, "brief": brief})
        for cls in ("chat", "code")
        for brief in (0.0, 1.0)
    }
    assert got[("code", 1.0)] < got[("code", 0.0)] < got[("chat", 1.0)] < got[("chat", 0.0)]


DECILES = [-1.5, -0.8, -0.4, -0.1, 0.0, 0.1, 0.4, 0.9, 2.0]  # cut points of 10 equal parts


@pytest.mark.parametrize(
    ("quantiles", "coverage", "spread"),
    [
        (DECILES, 0.8, (-1.5, 2.0)),  # the 0.1 and 0.9 cut points
        (DECILES, 0.6, (-0.8, 0.9)),
        (DECILES, 0.7, (-1.15, 1.45)),  # between cut points: interpolated
        (DECILES, 0.95, (-1.5, 2.0)),  # beyond the outer cut points: those
        ([0.2, 0.5, 0.9], 0.5, (0.0, 0.9)),  # a model always too short: the band holds the point
        (None, 0.8, None),
        ([0.5], 0.8, None),  # too few to say anything
        ([0.5, -0.5], 0.8, None),  # not increasing
        ([-1.0, float("nan"), 1.0], 0.8, None),
        ([-1.0, "x", 1.0], 0.8, None),
    ],
)
def test_the_initial_band_comes_from_the_models_validation_errors(quantiles, coverage, spread):
    corrector = LengthCorrector(coverage=coverage)
    corrector.adopt_errors(quantiles)
    assert corrector.base_spread == (spread and pytest.approx(spread))


def test_an_adopted_band_serves_until_the_class_has_outcomes_and_outlives_a_reset():
    corrector = LengthCorrector(band_min=20)
    corrector.adopt_errors(DECILES)
    x = {"request_class": "chat", "base_tokens": 100.0}
    band = corrector.predict_band(x)
    assert band.lo == pytest.approx(101 * math.exp(-1.5) - 1)
    assert band.hi == pytest.approx(101 * math.exp(2.0) - 1)
    # The fast path has no validation behind it: a factor of 2 each way.
    fast = corrector.predict_band({"request_class": "chat"})
    assert fast.hi == pytest.approx(2 * (fast.mid + 1) - 1)
    # Twenty outcomes of a far better predictor: the class's own band takes over.
    for x_, y in _noisy(20, random.Random(5), 0.05):
        corrector.learn_one(x_, y)
    learned = corrector.predict_band(x)
    assert learned.hi / learned.lo < 1.5 < band.hi / band.lo
    # A hot update forgets the learned bands, not what the model's validation said.
    corrector.reset()
    assert corrector.predict_band(x) == band
    corrector.adopt_errors(None)  # a new model that measured none
    assert corrector.predict_band(x).hi == pytest.approx(2 * 101 - 1)
