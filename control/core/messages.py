"""The plain data the scheduling core takes and returns: what the shell measures of an
instance, an arriving request, the prediction it is scheduled with, the core's assignments and
what a finished request did to the controller."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from steersman.control.core import controller as ctl
from steersman.learners.corrector import Band
from steersman.learners.latency import StepCoefficients

DEFAULT_STEP = StepCoefficients(0.01, 0.0005, 0.0001)


class QueueFull(Exception):
    """More requests are waiting than ``dispatch.max_queue``."""


class Learner(Protocol):
    """The online length predictor the core consults and teaches (River's shape)."""

    def predict_band(self, x: Mapping[str, Any]) -> Band: ...

    def with_prior(self, x: Mapping[str, Any], segment_tokens: int) -> dict[str, Any]: ...

    def learn_one(self, x: Mapping[str, Any], y: float) -> None: ...

    def reset(self, *, new_model: bool = False) -> None: ...


@dataclass(slots=True)  # not frozen: the shell builds one per instance per decision
class InstanceState:
    """What the shell measures of one instance, handed in with every ``schedule`` call."""

    name: str
    healthy: bool = True
    cap: int = 1 << 30  # most requests steersman keeps there
    kv_usage: float | None = None
    waiting: int = 0  # in the engine's own queue
    others: int = 0  # requests there that are not this scheduler's (another replica's)
    step: StepCoefficients = DEFAULT_STEP
    kv_capacity: int | None = None  # KV cache tokens; None: unknown, the count cap alone holds
    block: int = 16  # tokens per KV block
    # It runs steersman's scheduler class, which re-ranks every request by its predicted
    # remaining length before each step: it gets every prediction, whatever engine_order says.
    ranks: bool = False


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request as the core sees it. ``x`` holds the predictor's features (and the base model's
    prediction under ``base_tokens``); ``max_tokens`` is the client's cap (a prediction above it
    is cut to it, and a request that hits it was cut off); ``true_tokens`` is for the oracle.
    With ``expected_ttft_s`` (streamed QoE on), the queue takes it by when its first token is
    due rather than by when it arrived: the most overdue first, among equal predictions."""

    request_id: str
    prompt_tokens: int
    x: Mapping[str, Any] = field(default_factory=dict)
    request_class: str = "other"
    max_tokens: int | None = None
    true_tokens: int | None = None
    prefix: tuple[int, ...] = ()  # the prompt's segment hashes (core.prefix)
    segment_tokens: int = 0
    expected_ttft_s: float | None = None  # its reader's (core.qoe_rule): queued by that deadline
    candidates: frozenset[str] | None = None  # the instances it may go to (None: any)


@dataclass(frozen=True, slots=True)
class Ticket:
    """The prediction a request is scheduled with."""

    corrected: float  # the online corrector's prediction (tokens)
    scheduled: float  # after compensation: what the scheduler plans with
    key: float  # its place in the queue (lower first)
    priority: int  # vLLM's priority: shortest predicted first, with aging
    low: float = 0.0  # the band it is scheduled with, compensated like the point
    high: float = 0.0
    arrival_priority: int = 0  # vLLM's priority in arrival order (FCFS)


@dataclass(frozen=True, slots=True)
class Assignment:
    request_id: str
    instance: str
    priority: int
    scheduled: float
    policy: str
    mode: ctl.Mode
    running: int  # requests steersman had there before this one
    cached_tokens: int = 0  # of its prompt, what steersman expects the instance holds cached
    ordered: bool = False  # vLLM orders it by its length (priority, predicted tokens)


@dataclass(frozen=True, slots=True)
class Outcome:
    actual: int  # tokens generated
    cut_off: bool = False  # ended by its own max_tokens: the true length is at least ``actual``


@dataclass(frozen=True, slots=True)
class Report:
    """What a finished request (or time passing) did to the controller."""

    events: tuple[ctl.Event, ...] = ()
    miss: bool | None = None
    hot_update: bool = False  # the shell asks for an early retraining


@dataclass
class SchedulerStats:
    decisions: int = 0
    fallback_decisions: int = 0
    kv_held: int = 0  # times the head waited for KV room that its count cap would have given
    kv_overrides: int = 0  # requests admitted on measured room the projection did not see
    scored: int = 0
    misses: int = 0
    fallbacks: int = 0
    compensation_changes: int = 0
