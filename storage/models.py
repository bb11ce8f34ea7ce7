"""SQLAlchemy 2 typed models of the history tables; the schema itself is created by migrations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments INTEGER PRIMARY KEY, so BIGINT keys become INTEGER there.
Id = BigInteger().with_variant(Integer(), "sqlite")
Timestamp = DateTime(timezone=True)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class RequestRow(Base):
    """One row per request: what was predicted, how it was scheduled, and what happened."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    received_at: Mapped[datetime] = mapped_column(Timestamp)
    dispatched_at: Mapped[datetime | None] = mapped_column(Timestamp)
    first_token_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)
    instance: Mapped[str | None] = mapped_column(String(128))
    policy: Mapped[str | None] = mapped_column(String(32))
    mode: Mapped[str | None] = mapped_column(String(16))
    request_class: Mapped[str | None] = mapped_column(String(32))
    priority: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    prompt_sha256: Mapped[str | None] = mapped_column(String(64))
    prompt_text: Mapped[str | None] = mapped_column(Text)
    features: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    predictor_path: Mapped[str | None] = mapped_column(String(16))
    base_prediction: Mapped[float | None] = mapped_column(Float)
    corrected_prediction: Mapped[float | None] = mapped_column(Float)
    scheduled_prediction: Mapped[float | None] = mapped_column(Float)
    band_low: Mapped[float | None] = mapped_column(Float)  # the band it was scheduled with
    band_high: Mapped[float | None] = mapped_column(Float)
    expected_cached_tokens: Mapped[int | None] = mapped_column(Integer)  # by steersman
    cached_tokens: Mapped[int | None] = mapped_column(Integer)  # as the server reported
    actual_tokens: Mapped[int | None] = mapped_column(Integer)
    abs_error: Mapped[float | None] = mapped_column(Float)
    rel_error: Mapped[float | None] = mapped_column(Float)
    miss: Mapped[bool | None] = mapped_column(Boolean)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    qoe: Mapped[float | None] = mapped_column(Float)
    expected_ttft_s: Mapped[float | None] = mapped_column(Float)  # what its reader expected
    expected_pace_s: Mapped[float | None] = mapped_column(Float)
    model_version: Mapped[str | None] = mapped_column(String(64))
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index(None, "received_at"),
        Index(None, "finished_at"),
        Index(None, "instance", "finished_at"),
        Index(None, "request_class", "finished_at"),
    )


class TelemetryRow(Base):
    """One GPU reading (a 1 s aggregate by default, or a raw 50 ms sample)."""

    __tablename__ = "telemetry"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(Timestamp)
    host: Mapped[str | None] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    gpu_uuid: Mapped[str | None] = mapped_column(String(96))
    method: Mapped[str] = mapped_column(String(16))
    samples: Mapped[int] = mapped_column(Integer, server_default="1")
    sm_activity: Mapped[float | None] = mapped_column(Float)
    sm_activity_max: Mapped[float | None] = mapped_column(Float)
    sm_occupancy: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    throttle_reasons: Mapped[int | None] = mapped_column(BigInteger)
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    fragmentation: Mapped[float | None] = mapped_column(Float)
    errors: Mapped[int] = mapped_column(Integer, server_default="0")

    __table_args__ = (Index(None, "ts"), Index(None, "gpu_index", "ts"))


class InstanceStatsRow(Base):
    """A scrape of one serving instance: queue, KV cache and latency state."""

    __tablename__ = "instance_stats"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(Timestamp)
    instance: Mapped[str] = mapped_column(String(128))
    healthy: Mapped[bool] = mapped_column(Boolean)
    running: Mapped[int | None] = mapped_column(Integer)
    waiting: Mapped[int | None] = mapped_column(Integer)
    kv_cache_usage: Mapped[float | None] = mapped_column(Float)
    preemptions_total: Mapped[float | None] = mapped_column(Float)
    fragmentation: Mapped[float | None] = mapped_column(Float)
    ttft_mean_s: Mapped[float | None] = mapped_column(Float)
    itl_mean_s: Mapped[float | None] = mapped_column(Float)
    in_flight: Mapped[int | None] = mapped_column(Integer)
    prefix_cache_queries: Mapped[float | None] = mapped_column(Float)  # tokens, cumulative
    prefix_cache_hits: Mapped[float | None] = mapped_column(Float)
    # One decode step with one sequence: as the latency model has learned it, as profiled.
    step_s: Mapped[float | None] = mapped_column(Float)
    profiled_step_s: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (Index(None, "ts"), Index(None, "instance", "ts"))


class ControllerEventRow(Base):
    """A controller event: a mode change, a compensation change, drift, a model swap."""

    __tablename__ = "controller_events"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(Timestamp)
    kind: Mapped[str] = mapped_column(String(32))
    from_mode: Mapped[str | None] = mapped_column(String(16))
    to_mode: Mapped[str | None] = mapped_column(String(16))
    request_class: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (Index(None, "ts"), Index(None, "kind", "ts"))


class ModelVersionRow(Base):
    """A trained length model: where it lives, what it was trained on, how it validated."""

    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    version: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str | None] = mapped_column(Text)
    data_hash: Mapped[str | None] = mapped_column(String(64))
    train_rows: Mapped[int | None] = mapped_column(Integer)
    val_rows: Mapped[int | None] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    promoted_at: Mapped[datetime | None] = mapped_column(Timestamp)
    notes: Mapped[str | None] = mapped_column(Text)
    base_model: Mapped[str | None] = mapped_column(Text)  # what it was fine-tuned from

    __table_args__ = (Index(None, "created_at"),)


TABLES = {
    model.__tablename__: model.__table__
    for model in (RequestRow, TelemetryRow, InstanceStatsRow, ControllerEventRow, ModelVersionRow)
}


class CheckpointRow(Base):
    """A replica's learned state (corrector, latency models, controller), so that a replica
    that starts, here or elsewhere, begins from the latest any of them saved."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    saved_at: Mapped[datetime] = mapped_column(Timestamp)
    replica: Mapped[str] = mapped_column(String(128))
    state: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index(None, "saved_at"),)
