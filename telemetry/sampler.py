"""The sampler loop: a dedicated thread ticking on monotonic deadlines (50 ms by default).

APScheduler would flood at this rate, and sleeping a fixed period after each tick drifts by the
tick's own cost; this loop instead aims every tick at ``start + k * period`` and, when it falls
more than a period behind, skips the missed ticks rather than bursting to catch up.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, Protocol

from steersman.telemetry.readings import GpuReading, SourceStatus
from steersman.telemetry.window import GpuWindow, aggregate

log = logging.getLogger(__name__)

Sink = Callable[[dict[str, Any]], None]


class GpuSource(Protocol):
    status: SourceStatus

    def open(self) -> SourceStatus: ...
    def sample(self, mono: float, wall: float) -> list[GpuReading]: ...
    def close(self) -> None: ...


@dataclass
class SamplerStats:
    ticks: int = 0
    skipped: int = 0
    source_errors: int = 0
    sink_errors: int = 0
    rows: int = 0
    cpu_s: float = 0.0
    jitter_s: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))


class Sampler:
    """Samples a GPU source every ``period_s``, keeps windows, hands 1 Hz rows to ``sink``.

    ``tick(mono, wall)`` is one step and can be driven by a fake clock; ``start()`` runs it on
    its own thread. Nothing a source or sink raises stops the loop.
    """

    def __init__(
        self,
        source: GpuSource,
        *,
        period_s: float = 0.05,
        window_s: float = 1.0,
        ewma_alpha: float = 0.2,
        ring_s: float = 60.0,
        aggregate_s: float = 1.0,
        store_raw: bool = False,
        sink: Sink | None = None,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.period_s = period_s
        self.window_s = window_s
        self.ewma_alpha = ewma_alpha
        self.ring_size = max(1, int(ring_s / period_s))
        self.aggregate_s = aggregate_s
        self.store_raw = store_raw
        self.sink = sink
        self.host = host or socket.gethostname()
        self.stats = SamplerStats()
        self._clock = clock
        self._wall = wall
        self._windows: dict[int, GpuWindow] = {}
        self._pending: dict[int, list[GpuReading]] = {}
        self._next_flush: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> SourceStatus:
        return self.source.status

    # -- one step -----------------------------------------------------------------------------

    def tick(self, mono: float, wall: float) -> list[GpuReading]:
        if self._next_flush is None:
            self._next_flush = mono + self.aggregate_s
        elif mono >= self._next_flush:
            self.flush()  # before this tick's readings: they open the next period
            while self._next_flush <= mono:
                self._next_flush += self.aggregate_s
        try:
            readings = self.source.sample(mono, wall)
        except Exception:
            self.stats.source_errors += 1
            log.exception("GPU source failed; this tick has no readings")
            readings = []
        with self._lock:
            for reading in readings:
                window = self._windows.get(reading.gpu_index)
                if window is None:
                    window = GpuWindow(self.ring_size, self.window_s, self.ewma_alpha)
                    self._windows[reading.gpu_index] = window
                window.add(mono, reading)
                self._pending.setdefault(reading.gpu_index, []).append(reading)
        self.stats.ticks += 1
        if self.store_raw:
            for reading in readings:
                self._emit(aggregate([reading], self.host))
        return readings

    def flush(self) -> None:
        """Write one aggregate row per GPU for the readings since the last flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if self.store_raw:
            return
        for readings in pending.values():
            self._emit(aggregate(readings, self.host))

    def _emit(self, row: dict[str, Any] | None) -> None:
        if row is None or self.sink is None:
            return
        try:
            self.sink(row)
            self.stats.rows += 1
        except Exception:
            self.stats.sink_errors += 1
            log.exception("telemetry sink failed; row dropped from the history")

    def latest(self) -> dict[int, GpuReading]:
        """The newest reading of every GPU seen."""
        with self._lock:
            return {i: w.ring[-1][1] for i, w in self._windows.items() if w.ring}

    # -- features for learners and the controller -----------------------------------------------

    def features(
        self, gpu_index: int | None = None, mono: float | None = None, since: float | None = None
    ) -> dict[str, Any]:
        """Window statistics of one GPU, or across all GPUs (mean of means, max of maxes), over
        the last ``window_s`` or from ``since`` (a request's span: what it ran on)."""
        now = self._clock() if mono is None else mono
        with self._lock:
            if gpu_index is not None:  # one GPU's window only: this runs per instance and request
                window = self._windows.get(gpu_index)
                return window.features(now, since) if window is not None else {}
            per_gpu = {i: w.features(now, since) for i, w in self._windows.items()}
        if not per_gpu:
            return {"gpu_available": False}
        merged: dict[str, Any] = {"gpu_available": True, "gpus": len(per_gpu)}
        for key in next(iter(per_gpu.values())):
            values = [f[key] for f in per_gpu.values() if f.get(key) is not None]
            if key == "throttled":
                merged[key] = any(values)
            elif not values:
                merged[key] = None
            elif key.endswith("_max") or key == "memory_used_frac":
                merged[key] = max(values)
            else:
                merged[key] = fmean(values)
        return merged

    # -- the thread -----------------------------------------------------------------------------

    def start(self) -> SourceStatus:
        """Open the source and start ticking; an unavailable source is reported, not raised."""
        status = self.source.open()
        if not status.available:
            log.info("GPU telemetry unavailable: %s", status.reason)
            return status
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return status

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush()
        self.source.close()

    def _run(self) -> None:
        deadline = self._clock()
        while not self._stop.is_set():
            now = self._clock()
            if now < deadline:
                self._stop.wait(deadline - now)
                continue
            self.stats.jitter_s.append(now - deadline)
            started = time.thread_time()
            self.tick(now, self._wall())
            self.stats.cpu_s += time.thread_time() - started
            deadline += self.period_s
            behind = self._clock() - deadline
            if behind > self.period_s:
                missed = int(behind // self.period_s)
                self.stats.skipped += missed
                deadline += missed * self.period_s
