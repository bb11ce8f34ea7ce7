"""NvmlSource against simulated GPUs at the pynvml function boundary, and against this machine."""

from __future__ import annotations

import itertools

import pynvml
import pytest

from steersman.telemetry.nvml import NvmlSource
from tests.telemetry.fake_nvml import FakeClock, FakeGpu, FakeNvml

TICK = 0.05


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _source(monkeypatch, clock, gpus, **kw) -> tuple[NvmlSource, FakeNvml]:
    fake = FakeNvml(gpus, clock).install(monkeypatch)
    source = NvmlSource(clock=clock, **kw)
    status = source.open()
    assert status.available and status.gpus == len(gpus)
    return source, fake


def _run(source: NvmlSource, clock: FakeClock, ticks: int):
    out = []
    for _ in range(ticks):
        out.append(source.sample(clock(), clock() + 1.7e9))
        clock.advance(TICK)
    return out


def test_gpm_readings_pair_samples_at_least_100ms_apart(monkeypatch, clock):
    gpu = FakeGpu(0, gpm=True)
    source, fake = _source(monkeypatch, clock, [gpu])
    ticks = _run(source, clock, 40)
    # Until a sample is more than 100 ms old (with a 1 ms margin) there is no reading; then
    # every tick has one.
    assert [t[0].sm_activity for t in ticks[:3]] == [None, None, None]
    for k, (reading,) in enumerate(ticks[3:], start=3):
        taken_at = 1000.0 + k * TICK
        assert reading.method == "gpm" and reading.errors == ()
        assert reading.sm_activity == pytest.approx(gpu.activity(taken_at) / 100)
        assert reading.sm_occupancy == pytest.approx(gpu.activity(taken_at) / 200)
    # A ring of four sample buffers, allocated once and reused.
    assert fake.calls["nvmlGpmSampleAlloc"] == 4
    assert fake.calls["nvmlGpmSampleGet"] == 40


def test_the_other_fields_of_a_reading(monkeypatch, clock):
    gpu = FakeGpu(0, temperature=77, sm_clock=1410, power_mw=280_500, reasons=0x4)
    source, _ = _source(monkeypatch, clock, [gpu])
    (reading,) = _run(source, clock, 1)[0]
    assert reading.uuid == "GPU-fake-0000"
    assert (reading.temperature_c, reading.sm_clock_mhz) == (77.0, 1410.0)
    assert reading.power_w == pytest.approx(280.5)
    assert reading.throttle_reasons == 0x4
    assert reading.memory_total_bytes == gpu.total and reading.memory_used_bytes == gpu.used
    assert reading.memory_reserved_bytes == gpu.reserved  # the v2 struct
    assert reading.processes == 2


def test_older_gpus_use_utilization_samples(monkeypatch, clock):
    gpu = FakeGpu(0, gpm=False)
    source, fake = _source(monkeypatch, clock, [gpu])
    ticks = _run(source, clock, 10)
    assert {t[0].method for t in ticks} == {"samples"}
    assert ticks[5][0].sm_occupancy is None
    # Each call asks for the samples after the newest one already seen, and the reading is
    # the mean of what came back.
    since = [since_us for since_us, _ in fake.samples_returned]
    assert since[0] == 0 and all(b > a for a, b in itertools.pairwise(since[1:]))
    _, values = fake.samples_returned[5]
    assert values and ticks[5][0].sm_activity == pytest.approx(sum(values) / len(values) / 100)
    assert fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_can_be_switched_off(monkeypatch, clock):
    source, _ = _source(monkeypatch, clock, [FakeGpu(0, gpm=True)], gpm="off")
    assert _run(source, clock, 1)[0][0].method == "samples"


def test_fallbacks_when_newer_calls_are_missing(monkeypatch, clock):
    gpu = FakeGpu(
        0, gpm=False, samples_api=False, power_instant=False, clock_events_api=False, reasons=0x8
    )
    source, fake = _source(monkeypatch, clock, [gpu])
    ticks = _run(source, clock, 3)
    reading = ticks[-1][0]
    assert reading.method == "utilization" and reading.sm_activity is not None
    assert reading.power_w == pytest.approx((gpu.power_mw - 10_000) / 1000)
    assert reading.throttle_reasons == 0x8
    # An unsupported call is tried once, then the fallback is used directly.
    assert fake.calls["nvmlDeviceGetSamples"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1


def test_an_error_mid_run_degrades_one_field_and_is_counted(monkeypatch, clock):
    gpus = [FakeGpu(0), FakeGpu(1)]
    source, _ = _source(monkeypatch, clock, gpus)
    _run(source, clock, 3)
    gpus[1].failing["nvmlDeviceGetTemperature"] = pynvml.NVMLError_Unknown
    broken = _run(source, clock, 2)
    assert all(t[1].temperature_c is None and t[1].sm_activity is not None for t in broken)
    assert all(t[0].temperature_c == 61 for t in broken)
    assert broken[0][1].errors == ("temperature:Unknown",)
    del gpus[1].failing["nvmlDeviceGetTemperature"]
    (healthy,) = [t[1] for t in _run(source, clock, 1)]
    assert healthy.temperature_c == 61 and healthy.errors == ()
    assert source.error_counts() == {0: {}, 1: {"Unknown": 2}}


def test_a_gpu_that_falls_off_the_bus_is_retried_not_fatal(monkeypatch, clock):
    gpus = [FakeGpu(0), FakeGpu(1)]
    source, fake = _source(monkeypatch, clock, gpus)
    _run(source, clock, 3)
    gpus[0].lost = True
    lost = _run(source, clock, 20)  # one second
    assert {t[0].method for t in lost} == {"error"}
    assert all(t[1].method == "gpm" and t[1].sm_activity is not None for t in lost)
    calls_while_lost = fake.calls["nvmlDeviceGetTemperature"]
    _run(source, clock, 20)
    # While lost, GPU 0 is not queried on every tick: only GPU 1 is.
    assert fake.calls["nvmlDeviceGetTemperature"] - calls_while_lost == 20
    gpus[0].lost = False
    back = _run(source, clock, 80)  # past the 5 s retry
    assert back[-1][0].method == "gpm" and back[-1][0].temperature_c == 61


def test_per_process_queries_run_at_most_once_a_second(monkeypatch, clock):
    source, fake = _source(monkeypatch, clock, [FakeGpu(0)])
    _run(source, clock, 60)  # 3 s
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 3
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 1  # handles are cached


def test_no_driver_is_a_status_not_an_error(monkeypatch, clock):
    FakeNvml([], clock, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    source = NvmlSource()
    status = source.open()
    assert not status.available and status.reason == "NVML unavailable: Driver Not Loaded"
    assert source.sample(1.0, 1.0) == []
    source.close()


def test_this_machine_real_nvml():
    """No fake: on a CPU machine NVML is absent and says so; on a GPU host it reads GPUs."""
    source = NvmlSource()
    status = source.open()
    try:
        if status.available:
            assert status.gpus >= 1
            readings = source.sample(0.0, 0.0)
            assert len(readings) == status.gpus and readings[0].temperature_c is not None
        else:
            assert status.reason.startswith("NVML unavailable: ")
            assert source.sample(0.0, 0.0) == []
    finally:
        source.close()


def test_ticks_bunched_after_a_stall_still_pair_gpm_samples_100ms_apart(monkeypatch, clock):
    source, _ = _source(monkeypatch, clock, [FakeGpu(0)])
    _run(source, clock, 6)  # warmed up
    clock.advance(0.09)  # a stall, then four ticks back to back (the loop catching up)
    bunched = []
    for _ in range(4):
        bunched.append(source.sample(clock(), clock())[0])
        clock.advance(0.001)
    assert all(r.sm_activity is not None and r.errors == () for r in bunched)
