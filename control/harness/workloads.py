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


def load_trace(path: Path) -> Trace:
    """A CSV ``arrival_s,input_tokens,output_tokens``; bad rows are skipped and counted."""
    rows: list[TraceRow] = []
    skipped = 0
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader, None)  # header
        for record in reader:
            try:
                arrival, inp, out = float(record[0]), int(record[1]), int(record[2])
            except (ValueError, IndexError):
                skipped += 1
                continue
            if (
                not math.isfinite(arrival)
                or inp < 0
                or out < 0
                or (rows and arrival < rows[-1].arrival_s)
            ):
                skipped += 1
                continue
            rows.append(TraceRow(arrival, inp, out))
    return Trace(rows, skipped)


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
