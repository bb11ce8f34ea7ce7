"""Instances built from settings: the latency model follows the GPU an instance names."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from steersman.control.backends.base import GenerationResult
from steersman.control.serve.instances import make_instance
from steersman.control.serve.sections import GatewaySettings, InstanceSettings
from steersman.control.sim.profiles import load_profile
from steersman.telemetry.nvml import NvmlSource
from steersman.telemetry.sampler import Sampler
from tests.telemetry.fake_nvml import FakeClock, FakeGpu, FakeNvml

A100 = load_profile("a100-llama2-7b")


def build(gpu_features, **spec):
    settings = InstanceSettings(url="http://127.0.0.1:9", **spec)
    return make_instance(settings, GatewaySettings(), None, gpu_features)


def test_an_instance_on_a_named_gpu_plans_with_its_clock():
    clocks = {0: 1410.0, 1: 705.0}  # the A100's boost clock, and half of it
    seen = []

    def features(index, since):
        seen.append(index)
        return {"sm_clock_mhz_mean": clocks[index], "samples": 20}

    full, half = build(features, gpu=0), build(features, gpu=1)
    full.refresh()
    half.refresh()
    assert set(seen) == {0, 1}
    assert full.coefficients == A100.coefficients()
    assert half.coefficients.base_s == pytest.approx(2 * A100.coefficients().base_s)
    steps = half.step_times()
    assert steps["step_s"] == pytest.approx(2 * steps["profiled_step_s"])
    assert half.latency.state()["status"] == "telemetry"


def test_a_profile_calibrated_at_a_busy_clock_plans_that_clock_as_healthy(tmp_path):
    """A busy GPU holds below boost: read at the clock its profile was measured at, the
    instance plans the profile's step times; the same reading against a profile that knows no
    clock (the boost clock) plans a slowed GPU."""
    busy = 0.8 * 1410
    path = tmp_path / "a100-busy.json"
    replace(A100, clock_mhz=busy).save(path)

    def features(index, since):
        return {"sm_clock_mhz_mean": busy, "samples": 20}

    calibrated, derived = build(features, gpu=0, profile=str(path)), build(features, gpu=0)
    calibrated.refresh()
    derived.refresh()
    assert calibrated.coefficients.base_s == pytest.approx(A100.coefficients().base_s)
    assert derived.coefficients.base_s == pytest.approx(1.25 * A100.coefficients().base_s)


def test_without_a_gpu_the_instance_learns_from_outcomes_alone():
    inst = build(lambda index, since: {"sm_clock_mhz_mean": 1.0})  # a reading it must not use
    inst.refresh()
    assert inst.coefficients == A100.coefficients()
    assert inst.latency.state()["status"] == "prior"
    assert inst.latency.telemetry_ignored == 0


@pytest.mark.parametrize("reading", [{}, {"sm_clock_mhz_mean": math.nan}, None])
def test_telemetry_that_stops_or_breaks_falls_back_to_the_profile(reading):
    def features(index, since):
        if reading is None:
            raise RuntimeError("NVML went away")
        return reading

    inst = build(features, gpu=0)
    inst.refresh()
    inst.latency.learn_one({"running": 2, **inst.gpu()}, 0.02)  # an outcome still teaches
    assert inst.coefficients == A100.coefficients()
    assert inst.latency.status.startswith("prior: ")
    assert inst.latency.telemetry_ignored == 2
    assert inst.latency.learned == 1


def test_a_negative_gpu_index_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="gpu"):
        InstanceSettings(url="http://127.0.0.1:9", gpu=-1)


def test_through_nvml_a_throttled_gpu_slows_its_instance_and_a_request_learns_its_clock(
    monkeypatch,
):
    """The real NVML source and sampler over pynvml's functions: GPU 1 drops to half the A100's
    boost clock; its instance plans with twice the step time at once, and a request that
    decoded across the drop is learned against the clock it ran at, not the last reading."""
    clock = FakeClock()
    gpus = [FakeGpu(0, sm_clock=1410), FakeGpu(1, sm_clock=1410)]
    FakeNvml(gpus, clock).install(monkeypatch)
    source = NvmlSource(clock=clock)
    assert source.open().available
    sampler = Sampler(source, clock=clock, wall=clock, host="test")

    def features(index, since):
        return sampler.features(index, since=since)

    fast, slow = build(features, gpu=0), build(features, gpu=1)
    first_token = clock()
    for k in range(40):  # 2 s: full clock, then half for the last second
        if k == 20:
            gpus[1].sm_clock = 705
        sampler.tick(clock(), clock())
        clock.advance(0.05)
    fast.refresh()
    slow.refresh()
    assert slow.coefficients.base_s == pytest.approx(2 * fast.coefficients.base_s)
    during = slow.gpu(first_token)["sm_clock_mhz_mean"]
    assert during == pytest.approx((1410 + 705) / 2)
    prior = slow.latency.prior.step(4)
    slow.latency.learn_one({"running": 4, **slow.gpu(first_token)}, prior * 1410 / during)
    assert slow.latency.residual.get() == pytest.approx(0.0, abs=1e-9)  # explained by the clock


@pytest.mark.parametrize(
    ("prompt", "cached", "counted"),
    [
        (120, 40, 80),  # as vLLM reported: its prompt less its cached tokens
        (120, None, 100),  # no cache report: less what steersman expected cached (20)
        (None, None, 80),  # no usage yet: steersman's own count (100) less 20
        ("many", 40, 60),  # odd usage from upstream: steersman's count, vLLM's cache
        (10, 40, 0),  # more cached than prompt: nothing to prefill, never negative
    ],
)
def test_a_first_token_counts_its_uncached_prompt_as_prefill_done(prompt, cached, counted):
    inst = build(None)
    inst.prefilled = 1000
    result = GenerationResult("r", inst.name, 0.0, prompt_tokens=prompt, cached_tokens=cached)
    job = SimpleNamespace(
        arrival=SimpleNamespace(prompt_tokens=100), assignment=SimpleNamespace(cached_tokens=20)
    )
    assert inst.prefill_done(job, result) == 1000 + counted == inst.prefilled
