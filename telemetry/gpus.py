"""The GPU sampler as the settings describe it: NVML readings on the sampler's thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from steersman.telemetry.nvml import NvmlSource
from steersman.telemetry.sampler import Sampler
from steersman.telemetry.settings import TelemetrySettings


def make_sampler(
    settings: TelemetrySettings, sink: Callable[[dict[str, Any]], None] | None = None
) -> Sampler:
    t = settings
    source = NvmlSource(gpm=t.gpm, gpm_span_s=t.gpm_span_s, process_query_s=t.process_query_s)
    return Sampler(
        source,
        period_s=t.period_s,
        window_s=t.window_s,
        ewma_alpha=t.ewma_alpha,
        ring_s=t.ring_s,
        aggregate_s=t.aggregate_s,
        store_raw=t.store_raw,
        sink=sink,
    )
