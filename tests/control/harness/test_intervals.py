"""Bootstrap intervals of the bench's comparisons: they hold the figure, widen with the spread
and say nothing where there is nothing to resample."""

from __future__ import annotations

import random

import pytest

from steersman.control.harness.bench_report import ratios
from steersman.control.harness.intervals import mean_tau_interval, ratio_interval


def _runs(spread: float, n: int = 12, seed: int = 0) -> tuple[list[float], list[float]]:
    draw = random.Random(seed)
    base = [draw.uniform(0.03, 0.08) for _ in range(n)]
    return [b * 0.9 * (1 + draw.gauss(0, spread)) for b in base], base


@pytest.mark.parametrize("spread", [0.01, 0.05, 0.2])
def test_the_interval_holds_the_ratio_of_the_means(spread):
    a, b = _runs(spread)
    point, lo, hi = ratio_interval(a, b)
    assert point == pytest.approx(sum(a) / sum(b))
    assert lo < point < hi


def test_a_wider_spread_between_runs_gives_a_wider_interval():
    widths = []
    for spread in (0.01, 0.05, 0.2):
        _, lo, hi = ratio_interval(*_runs(spread))
        widths.append(hi - lo)
    assert widths == sorted(widths)
    assert widths[0] < 0.02 < widths[-1]


def test_the_interval_is_the_same_every_time():
    a, b = _runs(0.1)
    assert ratio_interval(a, b) == ratio_interval(list(a), list(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1.0], [1.0]),  # one run: nothing to resample
        ([1.0, 2.0], [1.0, 2.0, 3.0]),  # not paired
        ([1.0, 2.0], [0.0, 0.0]),  # no yardstick
        ([1.0, float("nan")], [1.0, 1.0]),  # a run that did not finish
        ([], []),
    ],
)
def test_runs_that_cannot_be_compared_give_no_interval(a, b):
    assert ratio_interval(a, b) is None


def test_the_mean_tau_interval_holds_the_mean_and_knows_a_ranking_from_noise():
    draw = random.Random(3)
    predicted = [draw.random() for _ in range(150)]
    ranks = [p + draw.gauss(0, 0.3) for p in predicted]  # tau about 0.5
    noise = [draw.random() for _ in predicted]
    lo, hi = mean_tau_interval([(predicted, ranks)])
    assert 0.3 < lo < hi < 0.7
    lo, hi = mean_tau_interval([(predicted, noise)])
    assert lo < 0 < hi
    assert mean_tau_interval([(predicted, ranks), (predicted[:-1], noise[:-1])]) is None


def test_a_gain_over_a_baseline_is_measured_on_the_same_draws():
    draw = random.Random(4)
    actual = [draw.random() for _ in range(150)]
    weak = [a + draw.gauss(0, 0.6) for a in actual]
    better = [w + 0.3 * (a - w) for a, w in zip(actual, weak, strict=True)]  # a bit closer
    lo, hi = mean_tau_interval([(better, actual)], baseline=[weak])
    own_lo, own_hi = mean_tau_interval([(better, actual)])
    assert 0 < lo < hi  # the gain holds over every draw of items ...
    assert hi - lo < (own_hi - own_lo) / 2  # ... where either tau alone is far less sure
    assert mean_tau_interval([(better, actual)], baseline=[weak, weak]) is None  # not paired
    assert mean_tau_interval([(better, actual)], baseline=[weak[:-1]]) is None


def test_the_report_gives_steersmans_ratios_with_their_intervals():
    a, b = _runs(0.05)
    by_run = [
        {"policy": "least-load", "norm_mean_s": 1.0, "norm_mean_by_run": b},
        {"policy": "vllm-priority", "norm_mean_s": 0.9, "norm_mean_by_run": b},
        {"policy": "steersman", "norm_mean_s": 0.9, "norm_mean_by_run": a},
    ]
    text = ratios(by_run)
    point, lo, hi = ratio_interval(a, b)
    assert f"steersman to least-load {point:.3f}x ({lo:.3f}-{hi:.3f})" in text
    assert "steersman to vllm-priority" in text
    assert "steersman to oracle" not in text  # no oracle in this run
    single = [dict(r, norm_mean_by_run=r["norm_mean_by_run"][:1]) for r in by_run]
    assert "interval" not in ratios(single)
