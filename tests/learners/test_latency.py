import logging
import math

import pytest

from steersman.learners.latency import LatencyModel, StepCoefficients

PRIOR = StepCoefficients(0.01, 0.001, 0.0001)


def model(**kwargs) -> LatencyModel:
    return LatencyModel(PRIOR, reference_clock_mhz=1000.0, **kwargs)


def test_a_lower_clock_slows_every_coefficient_before_any_outcome():
    m = model()
    c = m.coefficients({"sm_clock_mhz_mean": 600.0})  # a sampler window's mean
    assert c.base_s == pytest.approx(PRIOR.base_s / 0.6)
    assert c.per_seq_s == pytest.approx(PRIOR.per_seq_s / 0.6)
    assert c.prefill_s_per_token == pytest.approx(PRIOR.prefill_s_per_token / 0.6)
    assert m.learned == 0 and m.status == "telemetry"


def test_outcomes_teach_what_the_clock_does_not_show():
    m = model()
    truth = 1.5 * PRIOR.step(8)  # a noisy neighbour: the clock looks fine
    seen = []
    for _ in range(100):
        m.learn_one({"running": 8, "sm_clock_mhz": 1000.0}, truth)
        seen.append(m.predict_one({"running": 8, "sm_clock_mhz": 1000.0}))
    first_within = next(i for i, p in enumerate(seen) if abs(p / truth - 1) < 0.1)
    assert first_within < 60  # tracked within tens of requests, not hundreds
    assert seen[-1] == pytest.approx(truth, rel=0.01)
    assert m.state()["learned_factor"] == pytest.approx(1.5, rel=0.01)


@pytest.mark.parametrize("clock", [math.nan, math.inf, -5.0, 0.0, 50.0, 99_999.0, "fast", True])
def test_unusable_telemetry_is_ignored_counted_and_said_once(clock, caplog):
    m = model()
    with caplog.at_level(logging.WARNING, logger="steersman.learners.latency"):
        first = m.coefficients({"sm_clock_mhz": clock})
        m.coefficients({"sm_clock_mhz": clock})
        m.learn_one({"running": 2, "sm_clock_mhz": clock}, PRIOR.step(2))
    assert first == PRIOR  # the profiled clock
    assert m.telemetry_ignored == 3
    assert m.status.startswith("prior: clock reading")
    assert len([r for r in caplog.records if "latency model" in r.message]) == 1
    m.coefficients({"sm_clock_mhz": 1000.0})
    assert m.status == "telemetry"


def test_missing_telemetry_falls_back_to_the_prior_clock():
    m = model()
    assert m.coefficients({}) == PRIOR
    assert m.status == "prior: no clock reading" and m.telemetry_ignored == 1


def test_without_a_reference_clock_telemetry_is_not_asked_for():
    m = LatencyModel(PRIOR)
    assert m.coefficients({"sm_clock_mhz": 500.0}) == PRIOR
    assert m.status == "prior" and m.telemetry_ignored == 0


@pytest.mark.parametrize("tpot", [None, math.nan, -0.01, 0.0, 1e9, "x", True])
def test_odd_outcomes_teach_nothing(tpot):
    m = model(warmup=0)
    m.learn_one({"running": 2, "sm_clock_mhz": 1000.0}, tpot)
    m.learn_one({"running": "many", "sm_clock_mhz": 1000.0}, None)
    assert m.learned == 0
    assert m.coefficients({"sm_clock_mhz": 1000.0}) == PRIOR


def test_a_checkpointed_model_hands_over_what_it_learned_not_its_settings():
    saved = model()
    for _ in range(50):
        saved.learn_one({"running": 1, "sm_clock_mhz": 1000.0}, 2 * PRIOR.step(1))
    fresh = LatencyModel(StepCoefficients(0.02, 0.002, 0.0002), reference_clock_mhz=1500.0)
    assert fresh.adopt(saved)
    assert fresh.learned == 50 and fresh.prior.base_s == 0.02  # its own prior and clock
    assert fresh.factor({"sm_clock_mhz": 1500.0}) == pytest.approx(2.0, rel=0.01)


class _OlderModel:  # what an earlier release pickled: other attributes
    decode_learned = 40


@pytest.mark.parametrize("saved", [_OlderModel(), None, {"residual": 1.0}])
def test_a_checkpoint_of_another_kind_is_not_adopted(saved):
    fresh = model()
    assert not fresh.adopt(saved)
    assert fresh.learned == 0 and fresh.coefficients({"sm_clock_mhz": 1000.0}) == PRIOR
