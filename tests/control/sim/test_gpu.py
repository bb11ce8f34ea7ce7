import math

import pytest

from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.gpu import GPU_SPECS, GpuEvent, SimGpu, SimGpuSource, spec_for
from steersman.control.sim.profiles import load_profile
from steersman.telemetry.sampler import Sampler

A100 = GPU_SPECS["a100"]


def run_for(gpu: SimGpu, start: float, seconds: float, activity: float, busy: float) -> float:
    """Advance second by second at ``activity``; returns the busy seconds so far."""
    for t in range(1, int(seconds) + 1):
        busy += activity
        gpu.advance(start + t, busy)
    return busy


def test_temperature_rises_under_load_and_falls_when_idle():
    gpu = SimGpu(A100)
    busy = run_for(gpu, 0, 300, 1.0, 0.0)
    hot = gpu.temperature_c
    assert hot == pytest.approx(A100.settle_c, abs=1.0)  # settles where a busy board does
    assert not gpu.throttled and gpu.slowdown == 1.0
    run_for(gpu, 300, 300, 0.0, busy)
    idle = A100.ambient_c + A100.r_c_per_w * A100.idle_w
    assert gpu.temperature_c == pytest.approx(idle, abs=1.0)
    assert gpu.temperature_c < hot - 20


def test_poor_cooling_throttles_the_clock_and_reports_it():
    gpu = SimGpu(A100, [GpuEvent(0.0, cooling=1 / 3)])
    run_for(gpu, 0, 600, 1.0, 0.0)
    assert gpu.temperature_c > A100.slowdown_c  # it settles in the slowdown range
    assert A100.min_clock * A100.boost_mhz <= gpu.clock_mhz < A100.boost_mhz
    assert gpu.slowdown == pytest.approx(A100.boost_mhz / gpu.clock_mhz)
    reading = gpu.reading(123.0)
    assert reading.throttle_reasons & 0x20 and reading.sm_clock_mhz == round(gpu.clock_mhz, 1)
    assert reading.ts == 123.0 and reading.sm_activity == 1.0


@pytest.mark.parametrize(
    "events, at, slowdown, activity",
    [
        ([GpuEvent(10.0, clock_cap=0.5)], 20.0, 2.0, 0.5),
        ([GpuEvent(10.0, clock_cap=0.5), GpuEvent(15.0, clock_cap=1.0)], 20.0, 1.0, 0.5),
        ([GpuEvent(10.0, contention=0.5)], 20.0, 1.5, 1.0),  # the neighbour's activity shows
        ([GpuEvent(30.0, clock_cap=0.5)], 20.0, 1.0, 0.5),  # not yet
    ],
)
def test_commanded_changes_apply_at_their_time(events, at, slowdown, activity):
    gpu = SimGpu(A100, events)
    gpu.advance(at, at * 0.5)
    assert gpu.slowdown == pytest.approx(slowdown)
    assert gpu.sm_activity == pytest.approx(activity)


def test_spec_follows_the_profile_name():
    assert spec_for("a30-llama2-7b").name == "a30"
    assert spec_for("cpu-tiny").name == "a100"


def test_engine_steps_take_the_gpu_slowdown_longer():
    profile = load_profile("a100-llama2-7b")
    plain = SimEngine(profile)
    slowed = SimEngine(profile, gpu=SimGpu(A100, [GpuEvent(0.0, clock_cap=0.6)]))
    for engine in (plain, slowed):
        engine.add(SimRequest("r", 0.0, 100, 10))
    a, b = plain.plan(1.0), slowed.plan(1.0)
    assert a is not None and b is not None
    assert b.duration == pytest.approx(a.duration / 0.6)
    for engine, plan in ((plain, a), (slowed, b)):
        engine.finish(plan, plan.duration)
    ra, rb = plain.plan_decode_run(math.inf, 2.0), slowed.plan_decode_run(math.inf, 2.0)
    assert ra is not None and rb is not None and ra.steps == rb.steps
    assert rb.duration == pytest.approx(ra.duration / 0.6)


def test_the_sampler_reads_simulated_gpus_through_its_source_protocol():
    profile = load_profile("a30-llama2-7b")
    engines = [
        SimEngine(profile, gpu=SimGpu(spec_for(profile.name), [], index=k)) for k in range(2)
    ]
    engines[1].gpu.events.append(GpuEvent(0.0, clock_cap=0.5))  # type: ignore[union-attr]
    source = SimGpuSource(engines)
    assert source.open().gpus == 2
    sampler = Sampler(source, host="sim", clock=lambda: 0.0, wall=lambda: 0.0)
    for k in range(1, 21):
        sampler.tick(k * 0.05, k * 0.05)
    full, capped = sampler.features(0, 1.0), sampler.features(1, 1.0)
    assert full["sm_clock_mhz_mean"] == pytest.approx(1440.0)
    assert capped["sm_clock_mhz_mean"] == pytest.approx(720.0)
    assert capped["throttled"] and not full["throttled"]
    source.close()
    assert not source.status.available


def test_a_span_of_readings_gives_the_clock_a_request_ran_at():
    profile = load_profile("a100-llama2-7b")
    engine = SimEngine(profile, gpu=SimGpu(A100, [GpuEvent(1.0, clock_cap=0.5)]))
    source = SimGpuSource([engine])
    source.open()
    sampler = Sampler(source, host="sim", clock=lambda: 0.0, wall=lambda: 0.0)
    for k in range(1, 41):  # 2 s: full clock for the first, half for the second
        sampler.tick(k * 0.05, k * 0.05)
    whole = sampler.features(0, 2.0, since=0.0)["sm_clock_mhz_mean"]
    assert whole == pytest.approx((19 * 1410 + 21 * 705) / 40)
    assert sampler.features(0, 2.0, since=1.99)["sm_clock_mhz_mean"] == pytest.approx(705)
    # A span shorter than a period still has the reading in force at its start.
    assert sampler.features(0, 0.99, since=0.98)["sm_clock_mhz_mean"] == pytest.approx(1410)


def test_readings_that_stopped_say_nothing_of_a_later_span():
    engine = SimEngine(load_profile("a100-llama2-7b"), gpu=SimGpu(A100))
    source = SimGpuSource([engine])
    source.open()
    sampler = Sampler(source, host="sim", clock=lambda: 0.0, wall=lambda: 0.0)
    for k in range(1, 11):
        sampler.tick(k * 0.05, k * 0.05)  # then the source goes quiet
    assert sampler.features(0, 0.6, since=0.55)["sm_clock_mhz_mean"] == pytest.approx(1410)
    stale = sampler.features(0, 30.0, since=20.0)
    assert stale["sm_clock_mhz_mean"] is None and stale["samples"] == 0
