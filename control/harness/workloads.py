"""Workloads: real arrival traces (or Poisson / gamma arrivals) joined with real prompts and their
true response lengths in the served model's tokens. Deterministic for a seed."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from steersman.learners.datasets import PromptRecord
from steersman.learners.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Trace:
    rows: list[TraceRow]
    skipped: int  # rows that were not three numbers, or went back in time


class TraceError(ValueError):
    """A trace that does not parse: the message names the file, the line and the field."""


FIELDS = ("arrival_s", "input_tokens", "output_tokens")


def load_trace(path: Path, *, strict: bool = False) -> Trace:
    """A CSV ``arrival_s,input_tokens,output_tokens``. Bad rows are skipped and counted, or with
    ``strict`` (a user's own trace) refused with the file, line and field."""
    rows: list[TraceRow] = []
    skipped = 0
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if strict and [h.strip() for h in header or []] != list(FIELDS):
            raise TraceError(f"{path}:1: the header must be {','.join(FIELDS)}, not {header}")
        for line, record in enumerate(reader, start=2):
            try:
                row = _row(record, rows[-1].arrival_s if rows else None)
            except TraceError as exc:
                if strict:
                    raise TraceError(f"{path}:{line}: {exc}") from None
                skipped += 1
                continue
            rows.append(row)
    if strict and len(rows) < 2:
        raise TraceError(f"{path}: a trace needs at least two rows, it has {len(rows)}")
    return Trace(rows, skipped)


def _row(record: list[str], previous: float | None) -> TraceRow:
    if len(record) < len(FIELDS):
        raise TraceError(f"{len(record)} fields where {len(FIELDS)} ({','.join(FIELDS)}) are due")
    values: list[float] = []
    for name, raw, kind in zip(FIELDS, record, (float, int, int), strict=False):
        try:
            value = kind(raw)
        except ValueError:
            raise TraceError(f"field {name}: {raw!r} is not a{'n integer' * (kind is int)}"
                             f"{' number' * (kind is float)}") from None  # fmt: skip
        if not math.isfinite(value) or value < 0:
            raise TraceError(f"field {name}: {raw!r} must be a finite number >= 0")
        values.append(value)
    if previous is not None and values[0] < previous:
        raise TraceError(f"field arrival_s: {record[0]!r} goes back in time (from {previous})")
    return TraceRow(values[0], int(values[1]), int(values[2]))


def trace_arrivals(trace: Trace, n: int, rate: float, rng: random.Random) -> list[float]:
    """``n`` consecutive arrivals from a random point of the trace, time-scaled so that their
    mean rate is ``rate`` requests/s; bursts and lulls keep their shape. Starts at 0."""
    rows = trace.rows
    if len(rows) < 2:
        raise ValueError("a trace needs at least two rows")
    n = min(n, len(rows))
    start = rng.randrange(0, len(rows) - n + 1)
    window = [r.arrival_s for r in rows[start : start + n]]
    span = window[-1] - window[0]
    scale = ((n - 1) / rate) / span if span > 0 else 0.0
    return [(t - window[0]) * scale for t in window]


def burst_arrivals(
    unit: Sequence[float], rate: float, burst_rate: float, start_s: float, length_s: float
) -> list[float]:
    """Arrivals at ``rate`` with a burst at ``burst_rate`` from ``start_s`` for ``length_s``:
    ``unit`` (arrival times at a mean rate of 1/s, a trace's or any process's) is stretched
    through the inverse of the cumulative rate, so bursts and lulls keep their shape.

    >>> burst_arrivals([0, 10, 20, 30, 40], rate=1, burst_rate=2, start_s=10, length_s=5)
    [0.0, 10.0, 15.0, 25.0, 35.0]
    """
    before, during = rate * start_s, burst_rate * length_s
    out = []
    for u in unit:
        if u < before:
            out.append(u / rate)
        elif u < before + during:
            out.append(start_s + (u - before) / burst_rate)
        else:
            out.append(start_s + length_s + (u - before - during) / rate)
    return out


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def gamma_arrivals(n: int, rate: float, cv: float, rng: random.Random) -> list[float]:
    """Gamma inter-arrivals with mean 1/rate and coefficient of variation ``cv`` (>1: bursty)."""
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(shape, scale)
    return out


@dataclass(frozen=True, slots=True)
class WorkItem:
    index: int
    arrival_s: float
    prompt_id: str
    source: str
    prompt: str
    prompt_tokens: int
    true_tokens: int  # the real response's length in the served model's tokens
    messages: tuple[dict[str, str], ...] = ()  # a chat (sent as one, its history included)
    token_ids: tuple[int, ...] = ()  # a prompt sent as token ids (the hashed Mooncake trace)


def build_workload(
    prompts: Sequence[PromptRecord],
    arrivals: Sequence[float],
    counter: TokenCounter,
    rng: random.Random,
    *,
    max_model_len: int = 1024,
    max_tokens_cap: int | None = None,
) -> list[WorkItem]:
    """One real prompt per arrival, drawn without replacement while the pool lasts.

    The true length is the real response's token count, at least 1, and cut so that prompt and
    response fit the model window (and ``max_tokens_cap`` when given).
    """
    pool = list(prompts)
    rng.shuffle(pool)
    if not pool:
        raise ValueError("no prompts to build a workload from")
    items: list[WorkItem] = []
    cursor = 0
    batch = 256
    at_last_pass = 0
    while len(items) < len(arrivals):
        if cursor >= len(pool):
            if len(items) == at_last_pass:
                raise ValueError(f"no prompt fits a {max_model_len}-token window")
            at_last_pass = len(items)
            rng.shuffle(pool)
            cursor = 0
        chunk = pool[cursor : cursor + batch]
        cursor += len(chunk)
        prompt_counts = counter.count_many([r.prompt for r in chunk])
        response_counts = counter.count_many([r.response for r in chunk])
        for record, p_tokens, r_tokens in zip(chunk, prompt_counts, response_counts, strict=True):
            room = max_model_len - p_tokens - 1
            if room < 8 or len(items) >= len(arrivals):
                continue  # a prompt that leaves no room to answer is not replayable here
            true = max(1, min(r_tokens, room, max_tokens_cap or room))
            items.append(
                WorkItem(
                    len(items),
                    arrivals[len(items)],
                    record.id,
                    record.source,
                    record.prompt,
                    p_tokens,
                    true,
                )
            )
    return items
