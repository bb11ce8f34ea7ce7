"""GPU readings through NVML (nvidia-ml-py); the one module that imports pynvml.

Per GPU and tick: SM activity and SM occupancy from GPM metrics where the device supports GPM
(Hopper and newer), else from utilization samples (``nvmlDeviceGetSamples``), else from
``nvmlDeviceGetUtilizationRates``; temperature, SM clock, instantaneous power, clock-event
(throttle) reasons and memory (v2 struct). GPM needs at least 100 ms between the two samples of a
metric, so each GPU keeps a small ring of GPM samples taken every tick and each reading pairs the
newest sample with the newest one at least ``gpm_span_s`` older.

An NVML error degrades that one field of that one GPU and is counted; a GPU that falls off the
bus (``NVMLError_GpuIsLost``) reports method "error" and is retried every few seconds. No NVML at
all (no driver, no GPU) is a normal state: ``open()`` reports it once in the status.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from steersman.telemetry.readings import GpuReading, SourceStatus

log = logging.getLogger(__name__)

_LOST_RETRY_S = 5.0
_GPM_RING = 4


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str | None
    gpm: bool
    gpm_ring: deque[tuple[float, Any]] = field(default_factory=deque)
    gpm_spare: list[Any] = field(default_factory=list)
    util_last_ts: int = 0
    util_last: float | None = None
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    lost_at: float = float("-inf")
    processes: int | None = None
    processes_at: float = float("-inf")
    errors: Counter[str] = field(default_factory=Counter)


class NvmlSource:
    """Reads every GPU NVML can see. ``sample(mono, wall)`` never raises."""

    def __init__(
        self,
        *,
        gpm: str = "auto",
        gpm_span_s: float = 0.1,
        process_query_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock  # when each GPM sample was actually taken
        # A millisecond of margin: the driver's timestamps are not ours.
        self._min_gap = gpm_span_s + 0.001
        self.gpm_mode = gpm
        self.gpm_span_s = gpm_span_s
        self.process_query_s = process_query_s
        self.status = SourceStatus(available=False, reason="not opened")
        self.calls = 0
        self._gpus: list[_Gpu] = []

    # -- life cycle ---------------------------------------------------------------------------

    def open(self) -> SourceStatus:
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.status = SourceStatus(available=False, reason=f"NVML unavailable: {exc}")
            return self.status
        if count == 0:
            self.status = SourceStatus(available=False, reason="NVML reports no GPU")
            return self.status
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:
                log.warning("GPU %d: no handle (%s); skipped", index, exc)
                continue
            gpu = _Gpu(index=index, handle=handle, uuid=self._uuid(handle), gpm=False)
            gpu.gpm = self._gpm_supported(gpu)
            self._gpus.append(gpu)
        self.status = SourceStatus(
            available=bool(self._gpus),
            gpus=len(self._gpus),
            reason="" if self._gpus else "no GPU handle could be opened",
        )
        return self.status

    def close(self) -> None:
        for gpu in self._gpus:
            for _, sample in gpu.gpm_ring:
                self._quiet(pynvml.nvmlGpmSampleFree, sample)
            for sample in gpu.gpm_spare:
                self._quiet(pynvml.nvmlGpmSampleFree, sample)
        self._gpus = []
        if self.status.available:
            self._quiet(pynvml.nvmlShutdown)
        self.status = SourceStatus(available=False, reason="closed")

    def error_counts(self) -> dict[int, dict[str, int]]:
        return {g.index: dict(g.errors) for g in self._gpus}

    # -- sampling -----------------------------------------------------------------------------

    def sample(self, mono: float, wall: float) -> list[GpuReading]:
        return [self._read(gpu, mono, wall) for gpu in self._gpus]

    def _read(self, gpu: _Gpu, mono: float, wall: float) -> GpuReading:
        if gpu.lost:
            if mono - gpu.lost_at < _LOST_RETRY_S:
                return GpuReading(wall, gpu.index, gpu.uuid, "error", errors=("GpuIsLost",))
            gpu.lost = False
        errors: list[str] = []
        if gpu.gpm:
            method = "gpm"
            activity, occupancy = self._gpm(gpu, mono, errors)
        else:
            method, activity = self._utilization(gpu, errors)
            occupancy = None
        temperature = self._call(
            gpu,
            errors,
            "temperature",
            pynvml.nvmlDeviceGetTemperature,
            gpu.handle,
            pynvml.NVML_TEMPERATURE_GPU,
        )
        clock = self._call(
            gpu, errors, "sm_clock", pynvml.nvmlDeviceGetClockInfo, gpu.handle, pynvml.NVML_CLOCK_SM
        )
        power = self._power(gpu, errors)
        reasons = self._throttle(gpu, errors)
        memory = self._memory(gpu, errors)
        if mono - gpu.processes_at >= self.process_query_s:
            gpu.processes_at = mono
            procs = self._call(
                gpu, errors, "processes", pynvml.nvmlDeviceGetComputeRunningProcesses, gpu.handle
            )
            gpu.processes = None if procs is None else len(procs)
        if gpu.lost:
            gpu.lost_at = mono
            method = "error"
        return GpuReading(
            ts=wall,
            gpu_index=gpu.index,
            uuid=gpu.uuid,
            method=method,
            sm_activity=activity,
            sm_occupancy=occupancy,
            temperature_c=None if temperature is None else float(temperature),
            sm_clock_mhz=None if clock is None else float(clock),
            power_w=power,
            throttle_reasons=reasons,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            memory_reserved_bytes=getattr(memory, "reserved", None),
            processes=gpu.processes,
            errors=tuple(errors),
        )

    def _gpm(self, gpu: _Gpu, mono: float, errors: list[str]) -> tuple[float | None, float | None]:
        if len(gpu.gpm_ring) + len(gpu.gpm_spare) < _GPM_RING:
            sample = self._call(gpu, errors, "gpm_alloc", pynvml.nvmlGpmSampleAlloc)
            if sample is None:
                return None, None
        elif gpu.gpm_spare:
            sample = gpu.gpm_spare.pop()
        else:
            sample = self._recycle(gpu, self._clock())
        if (
            self._call(gpu, errors, "gpm_sample", pynvml.nvmlGpmSampleGet, gpu.handle, sample)
            is None
        ):
            gpu.gpm_spare.append(sample)
            return None, None
        # Ages count from when each sample was really taken, not from the tick's start: with
        # several GPUs, or a busy machine, the two differ by more than the margin GPM allows.
        taken = self._clock()
        gpu.gpm_ring.append((taken, sample))
        older = next((s for t, s in reversed(gpu.gpm_ring) if taken - t >= self._min_gap), None)
        if older is None:
            return None, None  # the first 100 ms after start: nothing old enough yet
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1 = older
        request.sample2 = sample
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
        result = self._call(gpu, errors, "gpm_metrics", pynvml.nvmlGpmMetricsGet, request)
        if result is None:
            return None, None
        values = []
        for metric in result.metrics[:2]:
            ok = metric.nvmlReturn == pynvml.NVML_SUCCESS
            values.append(_fraction(metric.value) if ok else None)
        return values[0], values[1]

    def _recycle(self, gpu: _Gpu, mono: float) -> Any:
        """Reuse the oldest buffer, but never the newest sample old enough to pair with: ticks
        that bunch up after a stall would otherwise leave no pair gpm_span_s apart."""
        ring = gpu.gpm_ring
        anchor = next(
            (i for i in range(len(ring) - 1, -1, -1) if mono - ring[i][0] >= self._min_gap),
            None,
        )
        victim = 1 if anchor == 0 else 0
        _, sample = ring[victim]
        del ring[victim]
        return sample

    def _utilization(self, gpu: _Gpu, errors: list[str]) -> tuple[str, float | None]:
        if "samples" not in gpu.unsupported:
            got = self._call(
                gpu,
                errors,
                "samples",
                pynvml.nvmlDeviceGetSamples,
                gpu.handle,
                pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                gpu.util_last_ts,
            )
            if got is not None:
                _, samples = got
                fresh = [s for s in samples if s.timeStamp > gpu.util_last_ts]
                if fresh:
                    gpu.util_last_ts = max(s.timeStamp for s in fresh)
                    gpu.util_last = _fraction(sum(s.sampleValue.uiVal for s in fresh) / len(fresh))
                return "samples", gpu.util_last
            if "samples" not in gpu.unsupported:  # a passing error: no reading this tick
                return "samples", None
        rates = self._call(
            gpu, errors, "utilization", pynvml.nvmlDeviceGetUtilizationRates, gpu.handle
        )
        return "utilization", None if rates is None else _fraction(rates.gpu)

    def _power(self, gpu: _Gpu, errors: list[str]) -> float | None:
        if "power_instant" not in gpu.unsupported:
            values = self._call(
                gpu,
                errors,
                "power_instant",
                pynvml.nvmlDeviceGetFieldValues,
                gpu.handle,
                [pynvml.NVML_FI_DEV_POWER_INSTANT],
            )
            if values is not None:
                if values[0].nvmlReturn == pynvml.NVML_SUCCESS:
                    return values[0].value.uiVal / 1000.0
                gpu.unsupported.add("power_instant")  # the field is not offered by this GPU
            elif "power_instant" not in gpu.unsupported:
                return None
        milliwatts = self._call(gpu, errors, "power", pynvml.nvmlDeviceGetPowerUsage, gpu.handle)
        return None if milliwatts is None else milliwatts / 1000.0

    def _throttle(self, gpu: _Gpu, errors: list[str]) -> int | None:
        return self._newer_or_older(
            gpu,
            errors,
            ("clock_events", pynvml.nvmlDeviceGetCurrentClocksEventReasons, (gpu.handle,), {}),
            ("throttle", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, (gpu.handle,), {}),
        )

    def _memory(self, gpu: _Gpu, errors: list[str]) -> Any:
        return self._newer_or_older(
            gpu,
            errors,
            (
                "memory_v2",
                pynvml.nvmlDeviceGetMemoryInfo,
                (gpu.handle,),
                {"version": pynvml.nvmlMemory_v2},
            ),
            ("memory", pynvml.nvmlDeviceGetMemoryInfo, (gpu.handle,), {}),
        )

    def _newer_or_older(self, gpu: _Gpu, errors: list[str], newer: tuple, older: tuple) -> Any:
        """The newer call until the GPU says it does not support it, then the older one.
        A passing error of the newer call gives None for this tick, not the older call."""
        what, fn, args, kw = newer
        if what not in gpu.unsupported:
            value = self._call(gpu, errors, what, fn, *args, **kw)
            if value is not None or what not in gpu.unsupported:
                return value
        what, fn, args, kw = older
        return self._call(gpu, errors, what, fn, *args, **kw)

    # -- NVML calls ---------------------------------------------------------------------------

    def _call(self, gpu: _Gpu, errors: list[str], what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        """One NVML call; an error is counted, remembered per field, and returns None."""
        self.calls += 1
        try:
            return fn(*args, **kw)
        except pynvml.NVMLError as exc:
            name = type(exc).__name__.removeprefix("NVMLError_")
            gpu.errors[name] += 1
            errors.append(f"{what}:{name}")
            if isinstance(exc, pynvml.NVMLError_NotSupported | pynvml.NVMLError_FunctionNotFound):
                gpu.unsupported.add(what)
            elif isinstance(exc, pynvml.NVMLError_GpuIsLost):
                gpu.lost = True
            return None
        except Exception as exc:  # a driver binding bug must not kill the sampler either
            gpu.errors[type(exc).__name__] += 1
            errors.append(f"{what}:{type(exc).__name__}")
            return None

    def _uuid(self, handle: Any) -> str | None:
        try:
            uuid = pynvml.nvmlDeviceGetUUID(handle)
        except pynvml.NVMLError:
            return None
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def _gpm_supported(self, gpu: _Gpu) -> bool:
        if self.gpm_mode == "off":
            return False
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(gpu.handle)
        except pynvml.NVMLError as exc:
            gpu.errors[type(exc).__name__.removeprefix("NVMLError_")] += 1
            return False
        return bool(support.isSupportedDevice)

    @staticmethod
    def _quiet(fn: Any, *args: Any) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            fn(*args)


def _fraction(percent: float) -> float:
    return max(0.0, min(1.0, float(percent) / 100.0))
