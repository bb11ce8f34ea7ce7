"""Prometheus metrics of one steersman process, on its own registry (no global state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)
ERROR_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5)

# GPU reading field -> (metric name, help, scale to the metric's unit)
GPU_GAUGES = {
    "sm_activity": ("steersman_gpu_sm_activity_ratio", "SM activity, 0..1.", 1.0),
    "sm_occupancy": ("steersman_gpu_sm_occupancy_ratio", "SM occupancy, 0..1.", 1.0),
    "temperature_c": ("steersman_gpu_temperature_celsius", "GPU temperature.", 1.0),
    "sm_clock_mhz": ("steersman_gpu_sm_clock_hertz", "SM clock.", 1e6),
    "power_w": ("steersman_gpu_power_watts", "Board power.", 1.0),
    "fragmentation": ("steersman_gpu_memory_fragmentation_ratio", "KV/allocator waste.", 1.0),
}


class _GpuCollector(Collector):
    """Reads the sampler's latest readings at scrape time."""

    def __init__(self, latest: Callable[[], Mapping[int, Any]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        readings = self._latest()
        for field, (name, doc, scale) in GPU_GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=["gpu"])
            for index, reading in sorted(readings.items()):
                value = getattr(reading, field, None)
                if value is not None:
                    family.add_metric([str(index)], float(value) * scale)
            yield family


class _AdmissionCollector(Collector):
    """The core's admission counts, read at scrape time (the core itself does no I/O)."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self._stats()
        yield CounterMetricFamily(
            "steersman_kv_held",
            "Times a request waited for KV room over its predicted lifetime.",
            value=stats.kv_held,
        )
        yield CounterMetricFamily(
            "steersman_kv_overrides",
            "Requests admitted on the room the engine measured where the projection saw none.",
            value=stats.kv_overrides,
        )


class Metrics:
    def __init__(
        self,
        gpu_latest: Callable[[], Mapping[int, Any]] | None = None,
        admission: Callable[[], Any] | None = None,
    ) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "steersman_requests",
            "Finished requests.",
            ["policy", "instance", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "steersman_retries", "Requests retried on another instance.", registry=r
        )
        self.predictions = Counter(
            "steersman_predictions", "Length predictions by path.", ["path"], registry=r
        )
        self.error_ratio = Histogram(
            "steersman_prediction_error_ratio",
            "|scheduled prediction - actual| / actual of finished requests.",
            ["path"],
            buckets=ERROR_BUCKETS,
            registry=r,
        )
        self.mode = Gauge(
            "steersman_mode", "1 for the current controller mode.", ["mode"], registry=r
        )
        self.miss_streak = Gauge("steersman_miss_streak", "Consecutive misses.", registry=r)
        self.fallbacks = Counter("steersman_fallbacks", "FALLBACK periods entered.", registry=r)
        self.compensation = Gauge(
            "steersman_compensation",
            "Compensation a and b per request class.",
            ["request_class", "param"],
            registry=r,
        )
        self.decision = Histogram(
            "steersman_decision_seconds",
            "Time to take one dispatch decision.",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "steersman_queue_depth", "Requests waiting in steersman's queue.", registry=r
        )
        self.in_flight = Gauge(
            "steersman_in_flight", "Requests at an instance.", ["instance"], registry=r
        )
        self.instance_up = Gauge(
            "steersman_instance_up", "1 when the instance is healthy.", ["instance"], registry=r
        )
        self.ttft = Histogram(
            "steersman_ttft_seconds", "Time to first token.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "steersman_e2e_seconds", "End-to-end latency.", buckets=LATENCY_BUCKETS, registry=r
        )
        if gpu_latest is not None:
            r.register(_GpuCollector(gpu_latest))
        if admission is not None:
            r.register(_AdmissionCollector(admission))

    def set_mode(self, mode: str) -> None:
        for name in ("NORMAL", "FALLBACK"):
            self.mode.labels(name).set(1.0 if name == mode else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
