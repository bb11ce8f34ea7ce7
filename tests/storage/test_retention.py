"""Telemetry retention: old rows deleted, day-old rows merged to one per GPU and minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select

from steersman.storage.models import TelemetryRow
from steersman.storage.retention import apply_retention


def test_retention_deletes_and_downsamples(engine):
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    rows = []
    for gpu in (0, 1):
        for age_days, seconds in ((20, range(3)), (2, range(0, 60, 10)), (0, range(4))):
            for s in seconds:
                rows.append(
                    {
                        "ts": now - timedelta(days=age_days) + timedelta(seconds=s),
                        "gpu_index": gpu,
                        "method": "gpm",
                        "samples": 20,
                        "sm_activity": 0.1 * (s % 10 + 1),
                        "sm_activity_max": 0.9 if s == 10 else 0.5,
                        "temperature_c": 60.0 + s,
                        "memory_used_bytes": 1000 + s,
                        "throttle_reasons": 4 if s == 20 else 0,
                        "errors": 1,
                    }
                )
    with engine.begin() as conn:
        conn.execute(insert(TelemetryRow), rows)

    done = apply_retention(engine, now, keep_days=14, downsample_after_days=1)
    assert done == {"deleted": 6, "merged": 12}
    assert apply_retention(engine, now, 14, 1) == {"deleted": 0, "merged": 0}  # idempotent

    table = TelemetryRow.__table__
    with engine.connect() as conn:
        kept = conn.execute(select(table).order_by(table.c.gpu_index, table.c.ts)).mappings().all()
    assert len(kept) == 2 * (1 + 4)
    merged = kept[0]
    assert merged["samples"] == 6 * 20 and merged["errors"] == 6
    assert merged["temperature_c"] == 60 + 25  # mean of 60..110 by 10
    assert merged["sm_activity_max"] == 0.9
    assert merged["throttle_reasons"] == 4
    assert merged["memory_used_bytes"] == 1025
    assert [r["samples"] for r in kept[1:5]] == [20] * 4  # recent rows untouched
