"""The sampler: windows, 1 Hz aggregates into the real history, faults, and its thread."""

from __future__ import annotations

import time

import pytest

from steersman.storage import migrate
from steersman.storage.engine import make_engine, make_read_only_engine
from steersman.storage.models import TelemetryRow
from steersman.storage.query import named_sql, run_query
from steersman.storage.writer import HistoryWriter
from steersman.telemetry.nvml import NvmlSource
from steersman.telemetry.readings import GpuReading, SourceStatus
from steersman.telemetry.sampler import Sampler
from tests.conftest import wait_until
from tests.telemetry.fake_nvml import FakeClock, FakeGpu, FakeNvml

TICK = 0.05


def _sampler(monkeypatch, clock, gpus, rows, **kw) -> Sampler:
    FakeNvml(gpus, clock).install(monkeypatch)
    source = NvmlSource(clock=clock)
    assert source.open().available
    return Sampler(source, sink=rows.append, clock=clock, wall=clock, host="test-host", **kw)


def _ticks(sampler: Sampler, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        sampler.tick(clock(), clock())
        clock.advance(TICK)


def test_one_aggregate_row_per_gpu_per_second(monkeypatch):
    clock, rows = FakeClock(), []
    sampler = _sampler(monkeypatch, clock, [FakeGpu(0), FakeGpu(1, gpm=False)], rows)
    _ticks(sampler, clock, 61)  # 3 s
    assert len(rows) == 6
    assert [r["gpu_index"] for r in rows] == [0, 1, 0, 1, 0, 1]
    first = rows[0]
    assert first["samples"] == 20 and first["method"] == "gpm"
    assert rows[1]["method"] == "samples"
    assert first["temperature_c"] == 61.0 and first["host"] == "test-host"
    assert first["sm_activity_max"] >= first["sm_activity"] > 0


def test_aggregate_rows_fit_the_history_table_and_land_there(monkeypatch, tmp_path):
    assert set(next(iter([_one_row(monkeypatch)]))) <= set(TelemetryRow.__table__.columns.keys())

    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    clock = FakeClock(start=1_764_417_600.0)  # 2025-11-29 12:00 UTC, wall and monotonic alike
    with HistoryWriter(engine, tmp_path / "spill", flush_interval_s=0.01) as writer:
        FakeNvml([FakeGpu(0), FakeGpu(1)], clock).install(monkeypatch)
        source = NvmlSource(clock=clock)
        source.open()
        sampler = Sampler(
            source, sink=lambda row: writer.submit("telemetry", row), clock=clock, wall=clock
        )
        _ticks(sampler, clock, 20 * 120 + 1)  # two minutes
        assert writer.flush(timeout=30)
    per_minute = run_query(make_read_only_engine(url), named_sql("telemetry", "sqlite")).records()
    assert {(r["minute"], r["gpu_index"], r["samples"]) for r in per_minute} == {
        ("2025-11-29 12:00", 0, 1200),
        ("2025-11-29 12:00", 1, 1200),
        ("2025-11-29 12:01", 0, 1200),
        ("2025-11-29 12:01", 1, 1200),
    }


def _one_row(monkeypatch) -> dict:
    clock, rows = FakeClock(), []
    sampler = _sampler(monkeypatch, clock, [FakeGpu(0)], rows)
    _ticks(sampler, clock, 21)
    return rows[0]


def test_raw_samples_are_optional(monkeypatch):
    clock, rows = FakeClock(), []
    sampler = _sampler(monkeypatch, clock, [FakeGpu(0)], rows, store_raw=True)
    _ticks(sampler, clock, 41)
    assert len(rows) == 41 and {r["samples"] for r in rows} == {1}


def test_window_features_per_gpu_and_across_gpus(monkeypatch):
    clock, rows = FakeClock(), []
    gpus = [FakeGpu(0, temperature=60), FakeGpu(1, temperature=80, reasons=0x20)]
    sampler = _sampler(monkeypatch, clock, gpus, rows, window_s=1.0)
    _ticks(sampler, clock, 40)
    now = clock() - TICK
    one = sampler.features(gpu_index=1, mono=now)
    assert one["samples"] == 21  # the ticks within the last second, both ends included
    assert one["temperature_c_mean"] == 80 and one["throttled"] is True
    both = sampler.features(mono=now)
    assert both["gpu_available"] is True and both["gpus"] == 2
    assert both["temperature_c_mean"] == 70 and both["temperature_c_max"] == 80
    assert both["throttled"] is True
    assert 0 < both["sm_activity_mean"] <= both["sm_activity_max"] <= 1
    assert both["memory_used_frac"] == pytest.approx(30 / 80)


class _Broken:
    status = SourceStatus(available=True, gpus=1)

    def open(self) -> SourceStatus:
        return self.status

    def sample(self, mono: float, wall: float) -> list[GpuReading]:
        raise RuntimeError("the driver binding exploded")

    def close(self) -> None:
        pass


def test_a_source_that_raises_every_call_does_not_stop_the_loop():
    clock = FakeClock()
    sampler = Sampler(_Broken(), sink=lambda row: None, clock=clock, wall=clock)
    for _ in range(30):
        assert sampler.tick(clock(), clock()) == []
        clock.advance(TICK)
    assert sampler.stats.ticks == 30 and sampler.stats.source_errors == 30
    assert sampler.features(mono=clock()) == {"gpu_available": False}


def test_a_failing_sink_is_counted(monkeypatch):
    clock = FakeClock()

    def sink(row):
        raise OSError("disk full")

    FakeNvml([FakeGpu(0)], clock).install(monkeypatch)
    source = NvmlSource(clock=clock)
    source.open()
    sampler = Sampler(source, sink=sink, clock=clock, wall=clock)
    _ticks(sampler, clock, 41)
    assert sampler.stats.sink_errors == 2 and sampler.stats.ticks == 41


def test_no_gpu_starts_no_thread_and_features_say_so(monkeypatch):
    import pynvml

    clock = FakeClock()
    FakeNvml([], clock, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    sampler = Sampler(NvmlSource(), sink=lambda row: None)
    status = sampler.start()
    assert not status.available and "Not Found" in status.reason
    assert sampler._thread is None
    assert sampler.features() == {"gpu_available": False}
    sampler.stop()


def test_the_thread_ticks_on_deadlines_and_stops_cleanly(monkeypatch):
    rows = []
    FakeNvml([FakeGpu(0)], time.monotonic).install(monkeypatch)
    sampler = Sampler(NvmlSource(), sink=rows.append, period_s=0.01, aggregate_s=0.1)
    assert sampler.start().available
    wait_until(lambda: sampler.stats.ticks >= 30, what="30 ticks")
    sampler.stop()
    ticks = sampler.stats.ticks
    assert sampler._thread is None
    assert len(sampler.stats.jitter_s) == ticks and min(sampler.stats.jitter_s) >= 0
    assert sum(r["samples"] for r in rows) == ticks  # every reading in some aggregate


class _Slow(_Broken):
    def sample(self, mono: float, wall: float) -> list[GpuReading]:
        time.sleep(0.035)  # a slow driver call: longer than three 10 ms periods
        return []


def test_a_slow_tick_skips_missed_deadlines_instead_of_bursting():
    sampler = Sampler(_Slow(), sink=None, period_s=0.01)
    sampler.start()
    wait_until(lambda: sampler.stats.ticks >= 5, what="5 slow ticks")
    sampler.stop()
    assert sampler.stats.skipped >= 2 * (sampler.stats.ticks - 1)
