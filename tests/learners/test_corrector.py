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
