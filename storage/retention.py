"""Retention of telemetry: old rows are deleted, older-than-a-day rows downsampled per minute."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from statistics import fmean
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from steersman.storage.models import TelemetryRow

_MEANS = (
    "sm_activity",
    "sm_occupancy",
    "temperature_c",
    "sm_clock_mhz",
    "power_w",
    "memory_used_bytes",
    "memory_total_bytes",
    "memory_reserved_bytes",
    "fragmentation",
)


def apply_retention(
    engine: Engine, now: datetime, keep_days: float, downsample_after_days: float
) -> dict[str, int]:
    """Delete telemetry older than ``keep_days``; merge rows older than
    ``downsample_after_days`` into one row per GPU and minute (means, maxima, summed counts).
    Idempotent: a minute already down to one row is left alone."""
    table = TelemetryRow.__table__
    deleted = merged = 0
    with engine.begin() as conn:
        cutoff = now - timedelta(days=keep_days)
        deleted = conn.execute(delete(table).where(table.c.ts < cutoff)).rowcount or 0
        old = now - timedelta(days=downsample_after_days)
        rows = conn.execute(select(table).where(table.c.ts < old).order_by(table.c.ts)).mappings()
        buckets: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            minute = row["ts"].replace(second=0, microsecond=0)
            buckets[(row["host"], row["gpu_index"], minute)].append(dict(row))
        for (_, _, minute), group in buckets.items():
            if len(group) < 2:
                continue
            conn.execute(delete(table).where(table.c.id.in_([r["id"] for r in group])))
            conn.execute(insert(table).values(**_merge(group, minute)))
            merged += len(group)
    return {"deleted": deleted, "merged": merged}


def _merge(group: list[dict[str, Any]], minute: datetime) -> dict[str, Any]:
    first = group[0]
    out: dict[str, Any] = {
        "ts": minute,
        "host": first["host"],
        "gpu_index": first["gpu_index"],
        "gpu_uuid": first["gpu_uuid"],
        "method": first["method"],
        "samples": sum(r["samples"] or 1 for r in group),
        "errors": sum(r["errors"] or 0 for r in group),
    }
    for key in _MEANS:
        values = [r[key] for r in group if r[key] is not None]
        mean = fmean(values) if values else None
        is_int = key.endswith("_bytes")
        out[key] = None if mean is None else (round(mean) if is_int else mean)
    peaks = [r["sm_activity_max"] for r in group if r["sm_activity_max"] is not None]
    out["sm_activity_max"] = max(peaks) if peaks else None
    reasons = [r["throttle_reasons"] for r in group if r["throttle_reasons"] is not None]
    combined = 0
    for value in reasons:
        combined |= value
    out["throttle_reasons"] = combined if reasons else None
    return out
