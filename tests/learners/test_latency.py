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


def test_a_checkpoint_hands_over_the_interference_and_an_older_one_starts_it_fresh():
    saved = model()
    for _ in range(50):
        # 110 prefill tokens a step at 0.1 ms: as long as the step itself
        x = {"running": 1, "sm_clock_mhz": 1000.0, "prefill_tokens": 1100, "decode_steps": 10}
        saved.learn_one(x, 2 * PRIOR.step(1))
    fresh = model()
    assert fresh.adopt(saved)
    assert fresh.factor({"sm_clock_mhz": 1000.0}) == pytest.approx(2.0, rel=0.01)
    assert fresh.speed({"sm_clock_mhz": 1000.0}) == pytest.approx(1.0)
    del saved.interference  # a checkpoint written before the interference was learned
    older = model()
    assert older.adopt(saved)
    assert older.interference.get() == 0.0 and older.learned == 50


class _OlderModel:  # what an earlier release pickled: other attributes
    decode_learned = 40


@pytest.mark.parametrize("saved", [_OlderModel(), None, {"residual": 1.0}])
def test_a_checkpoint_of_another_kind_is_not_adopted(saved):
    fresh = model()
    assert not fresh.adopt(saved)
    assert fresh.learned == 0 and fresh.coefficients({"sm_clock_mhz": 1000.0}) == PRIOR


def slowed(now: float | None = None, outcomes: int = 50) -> LatencyModel:
    """A model that learned its instance runs twice as slow as profiled, last at ``now``."""
    m = model()
    for _ in range(outcomes):
        m.learn_one({"running": 1, "sm_clock_mhz": 1000.0}, 2 * PRIOR.step(1), now=now)
    return m


@pytest.mark.parametrize(
    ("idle_s", "trust"),
    [(0.0, 1.0), (30.0, 1.0), (45.0, 0.5), (60.0, 0.25), (330.0, 0.5**20)],
)
def test_what_was_learned_fades_once_the_instance_finishes_nothing(idle_s, trust):
    m = slowed(now=100.0)
    assert m.trust(100.0 + idle_s) == pytest.approx(trust)
    assert m.factor({}, 100.0 + idle_s) == pytest.approx(2.0**trust, rel=0.01)
    assert m.state(100.0 + idle_s)["trust"] == pytest.approx(trust, abs=1e-4)


def test_an_instance_that_keeps_finishing_requests_never_forgets():
    m = model()
    for k in range(600):  # one outcome every 20 s for 200 minutes
        m.learn_one({"running": 1}, 2 * PRIOR.step(1), now=20.0 * k)
    assert m.trust(20.0 * 600) == 1.0
    assert m.factor({}, 20.0 * 600) == pytest.approx(2.0, rel=0.01)


def test_learning_after_a_fade_starts_from_what_is_still_believed():
    m = slowed(now=0.0)
    m.learn_one({"running": 1}, PRIOR.step(1), now=60.0)  # at the profile's speed again
    # 0.25 of log 2 still believed, as much as 0.25 / alpha = 5 outcomes, then one at log 1
    believed = 0.25 * math.log(2)
    assert m.factor({}, 60.0) == pytest.approx(math.exp(5 * believed / 6), rel=1e-6)
    assert m.factor({}, 60.0) < 2.0**0.25  # what it saw moved it toward what it saw
    assert m.trust(60.0) == 1.0  # fresh evidence, trusted again


def test_after_a_long_silence_one_outcome_says_most_of_what_is_known():
    m = slowed(now=0.0)  # twice as slow, then silent long enough to forget it
    m.learn_one({"running": 1}, 1.5 * PRIOR.step(1), now=600.0)
    assert m.factor({}, 600.0) == pytest.approx(1.5, rel=1e-3)


def test_without_times_nothing_fades():
    m = slowed(now=None)
    assert m.trust(1e9) == 1.0 and m.factor({}, 1e9) == pytest.approx(2.0, rel=0.01)


def test_an_adopted_model_counts_its_idle_time_from_the_adoption():
    fresh = model()
    assert fresh.adopt(slowed(now=5.0), now=1000.0)  # the old process's clock means nothing here
    assert fresh.trust(1020.0) == 1.0 and fresh.trust(1045.0) == pytest.approx(0.5)


def _interfered(rng, speed: float, n: int = 4) -> tuple[dict, float]:
    """An outcome whose decode shared its steps with a random amount of prefill."""
    steps = int(rng.integers(10, 200))
    prefill = int(rng.integers(0, 150 * steps))
    tpot = speed * (PRIOR.step(n) + prefill * PRIOR.prefill_s_per_token / steps)
    return {"running": n, "prefill_tokens": prefill, "decode_steps": steps}, tpot


@pytest.mark.parametrize("speed", [1.0, 1.5, 0.8])
def test_prefill_beside_a_request_is_not_taken_for_a_slower_gpu(speed):
    import numpy as np

    told, untold = LatencyModel(PRIOR), LatencyModel(PRIOR)
    rng = np.random.default_rng(0)
    seen_told, seen_untold = [], []
    for _ in range(300):
        x, tpot = _interfered(rng, speed)
        told.learn_one(x, tpot)
        untold.learn_one({"running": x["running"]}, tpot)
        seen_told.append(told.speed({}))
        seen_untold.append(untold.speed({}))
    last = seen_told[-100:]
    assert max(last) == pytest.approx(speed, rel=1e-9) and min(last) == pytest.approx(speed)
    assert max(seen_untold[-100:]) / min(seen_untold[-100:]) > 1.05  # one noisy mean
    # What it plans with still carries the interference, averaged slowly.
    assert told.factor({}) / told.speed({}) == pytest.approx(untold.speed({}) / speed, rel=0.1)
    assert told.state()["interference_factor"] > 1.0


@pytest.mark.parametrize(
    "odd",
    [
        {"prefill_tokens": math.nan, "decode_steps": 10},
        {"prefill_tokens": -5, "decode_steps": 10},
        {"prefill_tokens": 100, "decode_steps": 0},
        {"prefill_tokens": True, "decode_steps": 10},
        {"prefill_tokens": "many", "decode_steps": None},
    ],
)
def test_odd_prefill_counts_are_ignored_and_the_outcome_still_teaches(odd):
    m = LatencyModel(PRIOR, warmup=0)
    m.learn_one({"running": 2, **odd}, 2 * PRIOR.step(2))
    assert m.learned == 1
    assert m.speed({}) == pytest.approx(2.0) and m.factor({}) == pytest.approx(2.0)
