"""Plain data produced by the telemetry sources: GPU readings and source status."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One 50 ms reading of one GPU. Fractions are 0..1; a field is None when it failed."""

    ts: float  # wall-clock seconds since the epoch
    gpu_index: int
    uuid: str | None
    method: str  # "gpm", "samples", "utilization" or "error": how SM activity was obtained
    sm_activity: float | None = None
    sm_occupancy: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    processes: int | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SourceStatus:
    available: bool
    reason: str = ""
    gpus: int = 0
