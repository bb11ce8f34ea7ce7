"""Settings of the telemetry layer, a branch of the one settings tree built at the entry point."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TelemetrySettings(BaseModel):
    """How often GPUs and vLLM instances are sampled, and what is kept."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(default=True, description="Sample GPUs through NVML at all.")
    period_s: float = Field(
        default=0.05, gt=0.001, le=10, description="NVML sampling period per GPU (50 ms)."
    )
    gpm: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="SM activity from GPM metrics (Hopper and newer): auto uses them where the "
        "device supports them; off always uses utilization samples.",
    )
    gpm_span_s: float = Field(
        default=0.1, ge=0.1, description="Distance between the two GPM samples of one reading."
    )
    window_s: float = Field(
        default=1.0, gt=0, description="Window of the mean/max statistics offered as features."
    )
    ewma_alpha: float = Field(
        default=0.2, gt=0, le=1, description="Weight of the newest sample in the EWMA features."
    )
    ring_s: float = Field(
        default=60.0, gt=0, description="Seconds of raw samples kept in memory per GPU."
    )
    aggregate_s: float = Field(
        default=1.0, gt=0, description="Period of the aggregates written to the SQL history."
    )
    store_raw: bool = Field(
        default=False, description="Also write every raw sample to the SQL history (heavy)."
    )
    process_query_s: float = Field(
        default=1.0, ge=1.0, description="Per-process GPU queries run at most this often."
    )
    scrape_interval_s: float = Field(
        default=0.25, gt=0, description="Period of the vLLM /metrics scrape per instance."
    )
    scrape_timeout_s: float = Field(
        default=0.2, gt=0, description="Deadline of one /metrics scrape."
    )
