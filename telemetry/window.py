"""Per-GPU rings of readings, window statistics offered as features, and 1 Hz aggregates."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from datetime import UTC, datetime
from statistics import fmean
from typing import Any

from steersman.telemetry.readings import GpuReading

_WINDOWED = ("sm_activity", "sm_occupancy", "temperature_c", "power_w", "sm_clock_mhz")


class GpuWindow:
    """The recent readings of one GPU: a ring of raw samples, window mean/max, and EWMAs.

    >>> w = GpuWindow(ring_size=100, window_s=1.0, ewma_alpha=0.5)
    >>> for k, act in enumerate([0.2, 0.4, 0.6]):
    ...     w.add(10.0 + 0.05 * k, GpuReading(0.0, 0, None, "gpm", sm_activity=act))
    >>> f = w.features(10.1)
    >>> round(f["sm_activity_mean"], 3), f["sm_activity_max"], round(f["sm_activity_ewma"], 3)
    (0.4, 0.6, 0.45)
    """

    def __init__(self, ring_size: int, window_s: float, ewma_alpha: float) -> None:
        self.window_s = window_s
        self.alpha = ewma_alpha
        self.ring: deque[tuple[float, GpuReading]] = deque(maxlen=ring_size)
        self.ewma: dict[str, float] = {}

    def add(self, mono: float, reading: GpuReading) -> None:
        self.ring.append((mono, reading))
        for name in ("sm_activity", "temperature_c", "power_w"):
            value = getattr(reading, name)
            if value is None:
                continue
            last = self.ewma.get(name)
            self.ewma[name] = (
                value if last is None else self.alpha * value + (1 - self.alpha) * last
            )

    def recent(self, mono: float, since: float | None = None) -> list[GpuReading]:
        """The readings of the last ``window_s``; with ``since``, those from ``since`` to
        ``mono`` and the one in force at ``since`` (a span shorter than a period has one), if
        it is at most ``window_s`` older: readings that stopped say nothing of now."""
        start = mono - self.window_s if since is None else since
        out = []
        for t, reading in reversed(self.ring):
            if t > mono:
                continue
            if t < start:
                if since is not None and t >= start - self.window_s:
                    out.append(reading)
                break
            out.append(reading)
        out.reverse()
        return out

    def features(self, mono: float, since: float | None = None) -> dict[str, Any]:
        recent = self.recent(mono, since)
        feats: dict[str, Any] = {}
        for name in _WINDOWED:
            values = [v for r in recent if (v := getattr(r, name)) is not None]
            feats[f"{name}_mean"] = fmean(values) if values else None
            feats[f"{name}_max"] = max(values) if values else None
        for name, value in self.ewma.items():
            feats[f"{name}_ewma"] = value
        last = recent[-1] if recent else None
        feats["throttled"] = bool(last and last.throttle_reasons)
        feats["memory_used_frac"] = (
            last.memory_used_bytes / last.memory_total_bytes
            if last and last.memory_used_bytes is not None and last.memory_total_bytes
            else None
        )
        feats["samples"] = len(recent)
        return feats


def aggregate(readings: Iterable[GpuReading], host: str | None = None) -> dict[str, Any] | None:
    """One history row (the ``telemetry`` table's columns) from the readings of one GPU."""
    rows = list(readings)
    if not rows:
        return None
    last = rows[-1]

    def mean(name: str) -> float | None:
        values = [v for r in rows if (v := getattr(r, name)) is not None]
        return fmean(values) if values else None

    activity = [r.sm_activity for r in rows if r.sm_activity is not None]
    reasons = [r.throttle_reasons for r in rows if r.throttle_reasons is not None]
    merged = 0
    for value in reasons:
        merged |= value
    return {
        "ts": datetime.fromtimestamp(last.ts, UTC),
        "host": host,
        "gpu_index": last.gpu_index,
        "gpu_uuid": last.uuid,
        "method": Counter(r.method for r in rows).most_common(1)[0][0],
        "samples": len(rows),
        "sm_activity": fmean(activity) if activity else None,
        "sm_activity_max": max(activity) if activity else None,
        "sm_occupancy": mean("sm_occupancy"),
        "temperature_c": mean("temperature_c"),
        "sm_clock_mhz": mean("sm_clock_mhz"),
        "power_w": mean("power_w"),
        "throttle_reasons": merged if reasons else None,
        "memory_used_bytes": last.memory_used_bytes,
        "memory_total_bytes": last.memory_total_bytes,
        "memory_reserved_bytes": last.memory_reserved_bytes,
        "fragmentation": None,
        "errors": sum(len(r.errors) for r in rows),
    }
