"""Simulated GPUs at the pynvml function boundary, for machines without an NVIDIA driver.

Only the ``pynvml.nvml*`` functions are replaced; everything the code under test builds or reads
(c_nvmlGpmMetricsGet_t, c_nvmlMemory_v2_t, c_nvmlFieldValue_t, c_nvmlSample_t, NVMLError
subclasses) is the real pynvml type. Like the real GPM API, a metric computed from two samples
less than 100 ms apart is refused.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml


class _SampleBuffer(ctypes.Structure):
    _fields_ = [("ident", ctypes.c_int)]


@dataclass
class FakeGpu:
    index: int
    gpm: bool = True  # Hopper and newer
    power_instant: bool = True  # NVML_FI_DEV_POWER_INSTANT offered
    samples_api: bool = True  # nvmlDeviceGetSamples supported
    clock_events_api: bool = True  # nvmlDeviceGetCurrentClocksEventReasons present
    total: int = 80 * 2**30
    reserved: int = 512 * 2**20
    used: int = 30 * 2**30
    temperature: int = 61
    sm_clock: int = 1755
    power_mw: int = 312_000
    reasons: int = 0
    processes: int = 2
    lost: bool = False
    failing: dict[str, type[pynvml.NVMLError] | None] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        return f"GPU-fake-{self.index:04d}"

    def activity(self, t: float) -> float:
        """SM activity in percent, a slow wave different for each GPU."""
        return 50.0 + 40.0 * math.sin(t / 3.0 + self.index)


class FakeNvml:
    """Installs itself over pynvml's functions with ``install(monkeypatch)``."""

    def __init__(
        self, gpus: list[FakeGpu], clock: Callable[[], float], init_error: int | None = None
    ):
        self.gpus = gpus
        self.clock = clock
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.call_cpu_s = 0.0
        self._buffers: dict[int, _SampleBuffer] = {}
        self._taken: dict[int, tuple[int, float]] = {}
        self.samples_returned: list[tuple[int, list[int]]] = []  # (since_us, values) per call

    def install(self, monkeypatch: Any) -> FakeNvml:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._counted(name, getattr(self, name)))
        return self

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls[name] += 1
            started = time.thread_time()
            try:
                return fn(*args, **kw)
            finally:
                self.call_cpu_s += time.thread_time() - started

        return call

    def _check(self, gpu: FakeGpu, name: str) -> None:
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.failing:
            exc = gpu.failing[name]
            raise (exc or pynvml.NVMLError_Unknown)()

    # -- the replaced functions -------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        return gpu.uuid

    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        buf = _SampleBuffer(len(self._buffers) + 1)
        self._buffers[buf.ident] = buf
        return ctypes.cast(ctypes.pointer(buf), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._buffers.pop(self._ident(sample), None)

    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: Any) -> Any:
        self._check(gpu, "nvmlGpmSampleGet")
        self._taken[self._ident(sample)] = (gpu.index, self.clock())
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        first = self._taken[self._ident(request.sample1)]
        second = self._taken[self._ident(request.sample2)]
        gpu = self.gpus[second[0]]
        self._check(gpu, "nvmlGpmMetricsGet")
        if first[0] != second[0] or second[1] - first[1] < 0.1 - 1e-9:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL:
                metric.value = gpu.activity(second[1])
            elif metric.metricId == pynvml.NVML_GPM_METRIC_SM_OCCUPANCY:
                metric.value = gpu.activity(second[1]) / 2
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlDeviceGetSamples(self, gpu: FakeGpu, kind: int, since_us: int) -> Any:
        self._check(gpu, "nvmlDeviceGetSamples")
        if not gpu.samples_api:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        now_us = int(self.clock() * 1e6)
        step = 20_000  # the driver keeps a utilization sample every 20 ms
        start = max(since_us + 1, now_us - 1_000_000)
        first = start + (-start) % step
        out = []
        for ts in range(first, now_us + 1, step):
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = ts
            sample.sampleValue.uiVal = round(gpu.activity(ts / 1e6))
            out.append(sample)
        self.samples_returned.append((since_us, [s.sampleValue.uiVal for s in out]))
        return (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        self._check(gpu, "nvmlDeviceGetUtilizationRates")
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu = round(gpu.activity(self.clock()))
        return rates

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._check(gpu, "nvmlDeviceGetTemperature")
        return gpu.temperature

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, kind: int) -> int:
        self._check(gpu, "nvmlDeviceGetClockInfo")
        assert kind == pynvml.NVML_CLOCK_SM
        return gpu.sm_clock

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> Any:
        self._check(gpu, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            if fid == pynvml.NVML_FI_DEV_POWER_INSTANT and gpu.power_instant:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].value.uiVal = gpu.power_mw
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._check(gpu, "nvmlDeviceGetPowerUsage")
        return gpu.power_mw - 10_000  # the 1 s average lags the instant value

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        self._check(gpu, "nvmlDeviceGetCurrentClocksEventReasons")
        if not gpu.clock_events_api:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return gpu.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        self._check(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return gpu.reasons

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> Any:
        self._check(gpu, "nvmlDeviceGetMemoryInfo")
        if version == pynvml.nvmlMemory_v2:
            mem = pynvml.c_nvmlMemory_v2_t()
            mem.version = version
            mem.reserved = gpu.reserved
        else:
            mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used = gpu.total, gpu.used
        mem.free = gpu.total - gpu.used - (gpu.reserved if version else 0)
        return mem

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:
        self._check(gpu, "nvmlDeviceGetComputeRunningProcesses")
        return [object() for _ in range(gpu.processes)]

    @staticmethod
    def _ident(sample: Any) -> int:
        return ctypes.cast(sample, ctypes.POINTER(_SampleBuffer)).contents.ident


class FakeClock:
    """Monotonic and wall time the test moves by hand (kept in integer nanoseconds, so that
    sixty 50 ms steps make exactly three seconds)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.ns = round(start * 1e9)

    def __call__(self) -> float:
        return self.ns / 1e9

    def advance(self, seconds: float) -> float:
        self.ns += round(seconds * 1e9)
        return self()
