"""Typed records of the SQL history, built in one place: one row per request and one per event.

Times are the core's clock (monotonic seconds in the daemon, virtual seconds in the simulator);
``row(to_datetime)`` turns them into the table's timestamps, so the shell alone knows the wall.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from steersman.control.core.controller import Event

Wall = Callable[[float | None], datetime | None]


@dataclass(frozen=True)
class EventRecord:
    """A ``controller_events`` row: a mode change, a compensation change, an instance marked
    down or readmitted, a model served or refused, ..."""

    at: float
    kind: str
    reason: str
    from_mode: str | None = None
    to_mode: str | None = None
    request_class: str | None = None
    details: Mapping[str, Any] | None = None

    table = "controller_events"

    @classmethod
    def of(cls, event: Event, at: float) -> EventRecord:
        return cls(
            at,
            event.kind,
            event.reason,
            event.from_mode,
            event.to_mode,
            event.request_class,
            event.details,
        )

    def row(self, wall: Wall) -> dict[str, Any]:
        return {
            "ts": wall(self.at),
            "kind": self.kind,
            "from_mode": self.from_mode,
            "to_mode": self.to_mode,
            "request_class": self.request_class,
            "reason": self.reason,
            "details": dict(self.details) if self.details else None,
        }


@dataclass
class RequestRecord:
    """A ``requests`` row: what was predicted, decided and measured for one request (refused,
    failed and abandoned ones too: ``error`` says why)."""

    request_id: str
    received_at: float
    dispatched_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    instance: str | None = None
    policy: str | None = None
    mode: str | None = None
    request_class: str | None = None
    priority: int | None = None
    prompt_tokens: int | None = None
    prompt_sha256: str | None = None
    prompt_text: str | None = None
    features: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    predictor_path: str | None = None
    base_prediction: float | None = None
    corrected_prediction: float | None = None
    scheduled_prediction: float | None = None
    band_low: float | None = None
    band_high: float | None = None
    expected_cached_tokens: int | None = None
    cached_tokens: int | None = None
    model_version: str | None = None
    actual_tokens: int | None = None
    abs_error: float | None = None
    rel_error: float | None = None
    miss: bool | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    qoe: float | None = None
    expected_ttft_s: float | None = None  # what its reader expected (the QoE is against it)
    expected_pace_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None

    table = "requests"
    _TIMES = ("received_at", "dispatched_at", "first_token_at", "finished_at")

    def scored(self, actual: int) -> None:
        """The outcome against the scheduled prediction."""
        self.actual_tokens = actual
        if self.scheduled_prediction is not None:
            error = abs(self.scheduled_prediction - actual)
            self.abs_error = error
            self.rel_error = error / max(actual, 1)

    def row(self, wall: Wall) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # no deep copies
        for name in self._TIMES:
            out[name] = wall(out[name])
        out["features"] = {k: v for k, v in self.features.items() if _jsonable(v)}
        for name in (
            "base_prediction", "corrected_prediction", "scheduled_prediction", "band_low",
            "band_high",
        ):  # fmt: skip
            if out[name] is not None and not math.isfinite(out[name]):
                out[name] = None
        return out


def _jsonable(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int | str | bool) or value is None
