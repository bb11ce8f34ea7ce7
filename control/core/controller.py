"""The controller: a pure state machine over finished requests (misses, fallback, compensation).

``observe(state, outcome, now, config)`` and ``tick(state, now, config)`` return a new state and
the events to record; the loop that calls them does the I/O (SQL events, corrector reset,
an early retraining job).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from steersman.control.core.settings import ControllerSettings
from steersman.learners.metrics import within

Mode = Literal["NORMAL", "FALLBACK"]


@dataclass(frozen=True)
class Compensation:
    """Scheduled length = ``a * corrected + b``."""

    a: float
    b: float

    def apply(self, corrected: float) -> float:
        return self.a * corrected + self.b


@dataclass(frozen=True)
class Finished:
    """A finished request as the controller sees it. ``scheduled`` is the compensated prediction
    the request was scheduled with; ``corrected`` the prediction before compensation; ``band``
    the compensated band it was scheduled with (``None``: the point is all there is)."""

    request_class: str
    scheduled: float
    corrected: float
    actual: int
    max_tokens: int | None = None
    band: tuple[float, float] | None = None
    rank: float | None = None  # how the length model ranked its last window (None: unknown)
    modelled: bool = False  # a length model predicted this request (not the fast path alone)


@dataclass(frozen=True)
class Event:
    kind: str  # "mode" or "compensation"
    reason: str
    from_mode: Mode | None = None
    to_mode: Mode | None = None
    request_class: str | None = None
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ControllerState:
    mode: Mode = "NORMAL"
    since: float = 0.0
    streak: int = 0  # consecutive misses
    shadow_hits: int = 0  # consecutive hits while in FALLBACK
    unranked: bool = False  # FALLBACK began because the model stopped ranking
    fallback_until: float | None = None
    fallbacks: int = 0
    compensation: Mapping[str, Compensation] = field(default_factory=dict)
    ratios: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # actual / scheduled
    seen: Mapping[str, int] = field(default_factory=dict)

    def compensation_for(self, request_class: str, config: ControllerSettings) -> Compensation:
        return self.compensation.get(request_class) or Compensation(
            config.compensation_a, config.compensation_b
        )


@dataclass(frozen=True)
class Step:
    state: ControllerState
    events: tuple[Event, ...] = ()
    miss: bool | None = None
    hot_update: bool = False  # the loop resets the corrector and asks for early retraining


def is_miss(
    scheduled: float,
    actual: int,
    max_tokens: int | None,
    threshold: float,
    band: tuple[float, float] | None = None,
) -> bool:
    """With a ``band``: the actual length lies more than ``threshold`` outside it (below
    ``(1 - threshold) * low`` or above ``(1 + threshold) * high``). Without one: the point is
    off by more than ``threshold`` of the actual length. A request cut off by its own
    ``max_tokens`` says only that the true length is at least that: the prediction (and band)
    counts as at most ``max_tokens``.

    >>> is_miss(130, 100, None, 0.3), is_miss(131, 100, None, 0.3)
    (False, True)
    >>> is_miss(900, 64, 64, 0.3)  # censored at 64: predicting more is not a miss
    False
    >>> is_miss(300, 100, None, 0.3, band=(120, 600))  # 100 is within 30% of the band
    False
    >>> is_miss(300, 800, None, 0.3, band=(120, 600)), is_miss(300, 50, None, 0.3, (120, 600))
    (True, True)
    """
    if band is None:
        predicted = min(scheduled, max_tokens) if max_tokens else scheduled
        return not within(predicted, actual, threshold)
    low, high = band
    if max_tokens:
        low, high = min(low, max_tokens), min(high, max_tokens)
    return actual > (1 + threshold) * high or actual < (1 - threshold) * low


def observe(
    state: ControllerState, outcome: Finished, now: float, config: ControllerSettings
) -> Step:
    """Score one finished request; move between NORMAL and FALLBACK; adjust compensation.

    >>> cfg = ControllerSettings()
    >>> s = ControllerState()
    >>> for t in range(5):
    ...     step = observe(s, Finished("chat", 300, 250, 100), float(t), cfg)
    ...     s = step.state
    >>> s.mode, step.hot_update, step.events[0].reason
    ('FALLBACK', True, '5 consecutive misses over 30%')

    And a length model whose predictions stop ordering requests (``rank`` below ``min_rank``)
    is broken however well the corrector calibrates bands around it.

    >>> observe(ControllerState(), Finished("chat", 300, 250, 280, rank=0.02), 0.0, cfg).events[0]
    ... # doctest: +ELLIPSIS
    Event(kind='mode', reason='predictions no longer rank: correlation 0.02 below 0.15', ...)
    """
    band = outcome.band if config.miss_rule == "band" else None
    miss = is_miss(
        outcome.scheduled, outcome.actual, outcome.max_tokens, config.miss_threshold, band
    )
    events: list[Event] = []
    hot = False
    streak = state.streak + 1 if miss else 0
    unranked = config.min_rank > 0 and outcome.rank is not None and outcome.rank < config.min_rank
    if state.mode == "NORMAL":
        state = replace(state, streak=streak)
        cause = "misses" if streak >= config.miss_streak else "rank" if unranked else ""
        if config.enabled and cause:
            state = replace(
                state,
                mode="FALLBACK",
                since=now,
                fallback_until=now + config.fallback_s,
                shadow_hits=0,
                fallbacks=state.fallbacks + 1,
                unranked=cause == "rank",
            )
            hot = True
            if cause == "misses":
                reason = f"{streak} consecutive misses over {config.miss_threshold:.0%}"
            else:
                reason = (
                    f"predictions no longer rank: correlation {outcome.rank:.2f} below "
                    f"{config.min_rank:g}"
                )
            events.append(
                Event(
                    "mode",
                    reason,
                    "NORMAL",
                    "FALLBACK",
                    details={"streak": streak, "rank": outcome.rank, "until_s": config.fallback_s},
                )
            )
    else:
        shadow = 0 if miss else state.shadow_hits + 1
        state = replace(state, shadow_hits=shadow, streak=streak)
        # Bands can be hit by a model that knows nothing: one that stopped ranking ends FALLBACK
        # early only once it ranks again over a whole window of outcomes since FALLBACK began
        # (the loop starts the window over), clearly (three times the bar, so that a window
        # hovering at it does not flap); after misses, it must not be known not to rank.
        if state.unranked and outcome.modelled:
            ranks = outcome.rank is not None and outcome.rank >= 3 * config.min_rank
        else:
            ranks = not unranked
        if shadow >= config.recover_hits and ranks:
            events.append(_back(state, f"shadow predictions recovered: {shadow} hits in a row"))
            state = _normal(state, now)
        else:
            step = tick(state, now, config)
            state, events = step.state, list(step.events)
    state, change = _compensate(state, outcome, config)
    if change is not None:
        events.append(change)
    return Step(state, tuple(events), miss, hot)


def tick(state: ControllerState, now: float, config: ControllerSettings) -> Step:
    """Time passing: FALLBACK ends after ``fallback_s`` even with no traffic."""
    if (
        state.mode == "FALLBACK"
        and state.fallback_until is not None
        and now >= state.fallback_until
    ):
        event = _back(state, f"fallback ended after {config.fallback_s:g} s")
        return Step(_normal(state, now), (event,))
    return Step(state)


def _back(state: ControllerState, reason: str) -> Event:
    return Event("mode", reason, "FALLBACK", "NORMAL", details={"shadow_hits": state.shadow_hits})


def _normal(state: ControllerState, now: float) -> ControllerState:
    return replace(
        state,
        mode="NORMAL",
        since=now,
        streak=0,
        shadow_hits=0,
        fallback_until=None,
        unranked=False,
    )


def _compensate(
    state: ControllerState, outcome: Finished, config: ControllerSettings
) -> tuple[ControllerState, Event | None]:
    """Every ``adjust_every`` outcomes of a class, scale (a, b) so that the median scheduled
    length sits ``headroom`` above the actual one, moving ``step`` of the way, within bounds.
    Censored outcomes say nothing about the true length and are left out."""
    cls = outcome.request_class
    censored = outcome.max_tokens is not None and outcome.actual >= outcome.max_tokens
    if censored or outcome.scheduled <= 0 or outcome.actual <= 0:
        return state, None
    ratios = (*state.ratios.get(cls, ()), outcome.actual / outcome.scheduled)[-config.window :]
    seen = state.seen.get(cls, 0) + 1
    state = replace(state, ratios={**state.ratios, cls: ratios}, seen={**state.seen, cls: seen})
    if seen % config.adjust_every:
        return state, None
    old = state.compensation_for(cls, config)
    factor = statistics.median(ratios) * (1 + config.headroom)
    scale = 1 + config.step * (factor - 1)
    a = min(max(old.a * scale, config.a_min), config.a_max)
    b = min(max(old.b * scale, 0.0), config.b_max)
    if abs(a - old.a) < config.min_change:
        return state, None
    new = Compensation(round(a, 4), round(b, 3))
    state = replace(state, compensation={**state.compensation, cls: new})
    return state, Event(
        "compensation",
        f"median actual/scheduled {statistics.median(ratios):.2f} over {len(ratios)} requests",
        request_class=cls,
        details={"a": new.a, "b": new.b, "previous_a": old.a, "previous_b": old.b},
    )
