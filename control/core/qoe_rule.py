"""Who to serve when the KV cache is contended, for the quality of experience of streamed answers
(Andes, arXiv 2404.16283): one rule for steersman's vLLM scheduler class and the simulated engine.

A reader expects the first token ``ttft_s`` after sending and then one every ``pace_s``. A stream
far ahead of its reader loses nothing by pausing for a while; one whose first token is overdue
loses every second it waits. Each step under pressure, every running and waiting stream gets the
QoE it would gain over the next ``horizon_s`` from being served rather than paused (the area
between its reader's curve and its delivered tokens, over the area of its whole expected curve,
so a short answer's stall weighs more), per KV block it holds or needs. The waiting streams with
the most gain per block are admitted first, pausing (preempting) running streams of lower gain
per block while the gain admitted exceeds the gain paused. A stream restarted within
``protect_s``, or with little left to generate, is never paused (no thrashing).

With ``predicted_lengths``, a stream's predicted length sets the area its stall is measured
against (a short answer's stall weighs more); otherwise (Andes as published, and the default:
under overload it served more readers well) every stream is taken to have ``unknown_tokens``
left, and the rule favours the longest-overdue streams that need the fewest blocks. A stream
predicted to be nearly done is never paused either way.

The rule is plain data in, plain data out and imports nothing outside the standard library:
vLLM's environment imports it without steersman's dependencies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# What a request tells the engine of its reader (``vllm_xargs``): the rule is applied to it.
EXPECTED_TTFT = "steersman_expected_ttft_s"
EXPECTED_PACE = "steersman_expected_pace_s"
# The rule's knobs travel with each request too (``steersman_qoe_<knob>``): the engine has no
# other way to hear steersman's settings.
KNOBS = (
    "kv_pressure",
    "horizon_s",
    "interval_s",
    "protect_s",
    "min_left_tokens",
    "unknown_tokens",
    "max_pauses",
    "predicted_lengths",
)


def knobs_as_extra(settings: RuleSettings) -> dict[str, float]:
    """The rule's knobs as a request's extra arguments."""
    return {f"steersman_qoe_{k}": getattr(settings, k) for k in KNOBS}


def knobs_of(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a request's extra arguments carry (unvalidated)."""
    return {k: extra[f"steersman_qoe_{k}"] for k in KNOBS if f"steersman_qoe_{k}" in extra}


def expectation(extra: Mapping[str, Any]) -> tuple[float, float] | None:
    """The (TTFT, pace) a request's extra arguments carry; None unless both are positive
    finite numbers.

    >>> expectation({EXPECTED_TTFT: 1.0, EXPECTED_PACE: 0.2}), expectation({EXPECTED_TTFT: "x"})
    ((1.0, 0.2), None)
    """
    values = [extra.get(EXPECTED_TTFT), extra.get(EXPECTED_PACE)]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            return None
    return float(values[0]), float(values[1])  # type: ignore[arg-type]


class RuleSettings(Protocol):
    """The knobs the rule reads (``core.settings.QoeSettings``)."""

    kv_pressure: float
    horizon_s: float
    protect_s: float
    min_left_tokens: int
    unknown_tokens: float
    max_pauses: int
    predicted_lengths: bool


@dataclass(slots=True)
class Stream:
    """One request as the rule sees it. ``blocks``: KV blocks it holds (running) or needs to
    start (waiting); ``age_s``: seconds since it arrived; ``delivered``: tokens its reader has;
    ``remaining``: predicted tokens left (None: unknown); ``restart_tokens``: tokens to compute
    before its next token (a waiting stream's prompt, or its recompute after a preemption);
    ``since_start_s``: seconds since it last started running (None: waiting)."""

    key: Any
    running: bool
    blocks: int
    age_s: float
    delivered: int
    remaining: float | None
    restart_tokens: int = 0
    ttft_s: float = 1.0
    pace_s: float = 0.2
    since_start_s: float | None = None
    pauses: int = 0  # times it was preempted already


@dataclass(frozen=True, slots=True)
class Decision:
    """Running streams to pause (preempt), then waiting streams to admit first, in that order."""

    pause: tuple[Any, ...] = ()
    admit: tuple[Any, ...] = ()
    gains: dict[Any, float] = field(default_factory=dict)


def under_pressure(
    kv_usage: float, running: int, waiting: int, max_seqs: int, settings: RuleSettings
) -> bool:
    """Whether the rule runs: streams wait and either the KV cache is nearly full or every seat
    is taken. Otherwise the engine's own order stands.

    >>> from types import SimpleNamespace as S
    >>> k = S(kv_pressure=0.9)
    >>> under_pressure(0.95, 10, 3, 256, k), under_pressure(0.95, 10, 0, 256, k)
    (True, False)
    >>> under_pressure(0.5, 256, 1, 256, k), under_pressure(0.5, 10, 1, 256, k)
    (True, False)
    """
    return waiting > 0 and (kv_usage >= settings.kv_pressure or running >= max_seqs)


def reader_lag_area(
    age_s: float,
    delivered: int,
    total: float,
    ttft_s: float,
    pace_s: float,
    span_s: float,
    start_s: float = math.inf,
    rate: float = 0.0,
) -> float:
    """Token-seconds by which a stream falls behind its reader over the next ``span_s``: the
    integral of max(0, reader - delivered), the reader reaching token 1 at ``ttft_s`` after
    arrival and one more every ``pace_s`` (up to ``total``), the stream delivering nothing until
    ``start_s`` from now and then ``rate`` tokens a second (up to ``total``).

    >>> reader_lag_area(0.0, 0, 100, 1.0, 0.2, 2.0)          # never served: 1 s behind, growing
    3.5
    >>> reader_lag_area(0.0, 0, 100, 1.0, 0.2, 2.0, 0.0, 50.0)  # served at once: never behind
    0.0
    >>> reader_lag_area(10.0, 60, 100, 1.0, 0.2, 2.0)        # 14 tokens ahead: 2 s of slack
    0.0
    """
    reader_start = ttft_s - age_s  # when (from now) the reader reaches the first token
    reader_full = reader_start + (total - 1) * pace_s
    points = {0.0, span_s, reader_start, reader_full}
    if math.isfinite(start_s) and rate > 0:
        points |= {start_s, start_s + (total - delivered) / rate}
    grid = sorted(p for p in points if 0.0 <= p <= span_s)

    def gap(s: float) -> float:
        read = 0.0 if s < reader_start else min(total, 1.0 + (s - reader_start) / pace_s)
        got = delivered + (max(0.0, s - start_s) * rate if s >= start_s else 0.0)
        return read - min(total, got)

    area = 0.0
    for a, b in itertools.pairwise(grid):
        if b - a <= 1e-12:
            continue
        eps = (b - a) * 1e-9  # the reader's curve jumps to 1 at its start: take one-sided values
        fa, fb = gap(a + eps), gap(b - eps)
        if fa >= 0 and fb >= 0:
            area += (fa + fb) / 2 * (b - a)
        elif fa > 0 or fb > 0:  # it crosses zero: the positive triangle
            top = max(fa, fb)
            area += top * top / (abs(fa) + abs(fb)) * (b - a) / 2
    return area


def gain(stream: Stream, step_s: float, chunk_tokens: int, settings: RuleSettings) -> float:
    """QoE (0-1 scale) the stream gains over the horizon from being served rather than paused.

    A stream ahead of its reader by more than the horizon gains nothing; one whose first token
    is overdue gains the most, and a short one more than a long one.

    >>> from types import SimpleNamespace as S
    >>> k = S(horizon_s=2.0, unknown_tokens=256.0, predicted_lengths=True)
    >>> ahead = Stream("a", True, 10, age_s=10.0, delivered=80, remaining=100)
    >>> late = Stream("l", False, 10, age_s=3.0, delivered=0, remaining=100, restart_tokens=30)
    >>> late_long = Stream("L", False, 10, age_s=3.0, delivered=0, remaining=800, restart_tokens=30)
    >>> gain(ahead, 0.03, 2048, k)
    0.0
    >>> gain(late, 0.03, 2048, k) > gain(late_long, 0.03, 2048, k) > 0
    True
    """
    known = settings.predicted_lengths and stream.remaining is not None
    left = max(stream.remaining if known else settings.unknown_tokens, 1.0)  # type: ignore[arg-type]
    total = stream.delivered + left
    restart = step_s * (1 + math.ceil(stream.restart_tokens / max(chunk_tokens, 1)))
    rate = 1.0 / max(step_s, 1e-6)
    # A running stream paused now must also recompute its context before its next token.
    span = settings.horizon_s + (0.0 if not stream.running else restart)
    start = 0.0 if stream.running else restart
    args = (stream.age_s, stream.delivered, total, stream.ttft_s, stream.pace_s, span)
    paused = reader_lag_area(*args)
    served = reader_lag_area(*args, start, rate)
    whole = stream.pace_s * total * (total + 1) / 2
    return max(0.0, paused - served) / whole


def decide(
    streams: Sequence[Stream],
    free_blocks: int,
    max_seqs: int,
    step_s: float,
    chunk_tokens: int,
    settings: RuleSettings,
) -> Decision:
    """Which running streams to pause and which waiting ones to admit first.

    >>> from types import SimpleNamespace as S
    >>> k = S(horizon_s=2.0, protect_s=1.0, min_left_tokens=8, unknown_tokens=256.0,
    ...       max_pauses=1, predicted_lengths=True)
    >>> ahead = Stream("ahead", True, 40, 20.0, 90, 200, since_start_s=15.0)
    >>> fresh = Stream("fresh", True, 40, 2.0, 5, 200, since_start_s=0.5)
    >>> late = Stream("late", False, 30, 3.0, 0, 100, restart_tokens=400)
    >>> d = decide([ahead, fresh, late], free_blocks=0, max_seqs=8, step_s=0.03,
    ...            chunk_tokens=2048, settings=k)
    >>> d.pause, d.admit          # the stream far ahead of its reader makes room
    (('ahead',), ('late',))
    >>> decide([ahead, late], free_blocks=30, max_seqs=8, step_s=0.03, chunk_tokens=2048,
    ...        settings=k).pause  # room enough: nobody paused
    ()
    """
    score = {s.key: gain(s, step_s, chunk_tokens, settings) for s in streams}

    def density(s: Stream) -> float:
        return score[s.key] / max(s.blocks, 1)

    # A paused stream comes back before new ones: its reader is already reading.
    waiting = sorted(
        (s for s in streams if not s.running),
        key=lambda s: (s.delivered > 0, density(s)),
        reverse=True,
    )
    pausable = sorted((s for s in streams if s.running and _pausable(s, settings)), key=density)
    seats = max_seqs - sum(1 for s in streams if s.running)
    free = free_blocks
    pause: list[Any] = []
    admit: list[Any] = []
    for s in waiting:
        need, taken, value = s.blocks, 0, 0.0
        # Take the lowest gains per block first, while the newcomer gains more than they lose.
        while (free + _blocks(pausable[:taken]) < need or seats + taken < 1) and taken < len(
            pausable
        ):
            value += score[pausable[taken].key]
            taken += 1
        if free + _blocks(pausable[:taken]) < need or seats + taken < 1:
            break  # it cannot fit even by pausing every candidate: later ones wait behind it
        if taken and value >= score[s.key]:
            break
        for p in pausable[:taken]:
            pause.append(p.key)
            free += p.blocks
            seats += 1
        del pausable[:taken]
        free -= need
        seats -= 1
        admit.append(s.key)
    return Decision(tuple(pause), tuple(admit), score)


def _pausable(s: Stream, settings: RuleSettings) -> bool:
    recent = s.since_start_s is not None and s.since_start_s < settings.protect_s
    nearly_done = s.remaining is not None and s.remaining <= settings.min_left_tokens
    return not recent and not nearly_done and s.pauses < settings.max_pauses


def _blocks(streams: Sequence[Stream]) -> int:
    return sum(s.blocks for s in streams)
