"""What is left of a request while it decodes, learned from how actual lengths compared with
scheduled ones."""

from __future__ import annotations

import math
import random

import numpy as np

from steersman.learners.remaining import GRID, RemainingLength, mean_residual, remaining


def test_mean_residual_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    ratios = np.exp(rng.normal(0, 0.7, 5000))
    table = mean_residual(ratios)
    for u in (0.0, 0.5, 1.0, 2.0):
        beyond = ratios[ratios > u]
        expected = beyond.mean() - u
        assert math.isclose(np.interp(u, GRID, table), expected, rel_tol=0.02)


def test_a_heavy_tail_leaves_more_to_go_the_further_a_request_went():
    learned = RemainingLength(window=2000, refresh_every=100)
    rng = random.Random(1)
    for _ in range(2000):  # Pareto-like lengths around what was scheduled
        learned.learn_one({"request_class": "chat", "scheduled": 100.0}, 100 * rng.paretovariate(2))
    at = [learned.predict_one({"request_class": "chat", "scheduled": 100.0, "produced": k})
          for k in (100, 200, 400)]  # fmt: skip
    assert at[0] < at[1] < at[2]  # past its prediction, a request is not almost done


def test_without_data_the_rule_is_the_prediction_less_what_was_produced():
    got = remaining(np.array([100.0, 100.0, 10.0]), np.array([30.0, 250.0, 0.0]), None)
    assert got.tolist() == [70.0, 10.0, 10.0]


def test_odd_outcomes_are_ignored():
    learned = RemainingLength(min_samples=1)
    for y in (math.nan, -1.0, math.inf):
        learned.learn_one({"request_class": "chat", "scheduled": 100.0}, y)
    learned.learn_one({"request_class": "chat", "scheduled": 0.0}, 50)
    assert learned.table("chat") is None
