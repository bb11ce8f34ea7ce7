"""The controller on simulated instances: quiet while the predictor is good, FALLBACK soon after
it breaks, NORMAL again once it is mended, no flapping, and bands that follow a shift."""

from __future__ import annotations

import pytest

from steersman.control.harness.controller_scenarios import run


def test_a_stationary_workload_with_a_good_predictor_stays_normal():
    got = run("stationary", seed=0)
    assert got["fallback_share"] <= 0.05
    assert abs(got["coverage_overall"] - got["coverage_target"]) <= 0.07


@pytest.mark.parametrize(
    ("broken", "within"), [("other-model", 60), ("shuffled", 150), ("constant", 150)]
)
def test_a_broken_predictor_falls_back_once_and_recovers_when_mended(broken, within):
    got = run(broken, seed=0)
    assert got["detected_after"] is not None and got["detected_after"] <= within, got
    assert got["entries_in_break"] == 1, got  # no flapping
    assert got["normal_after_mend"] is not None and got["normal_after_mend"] <= 300, got


def test_a_model_that_knows_nothing_is_caught_by_its_ranking_not_its_band():
    """A constant model: the corrector turns it into per-class means, bands calibrate around
    those, and misses stay rare; its predictions no longer order anything."""
    got = run("constant", seed=2)
    assert got["coverage_overall"] >= 0.75  # the bands hold...
    assert got["fallback_reasons"][0].startswith("predictions no longer rank"), got


def test_bands_follow_an_abrupt_shift_from_chat_to_code():
    got = run("shift", seed=0)
    assert got["shift_coverage_by_300"] is not None and got["shift_coverage_by_300"] <= 300
    assert got["entries_in_shift"] <= 1
