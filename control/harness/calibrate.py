"""Measures the step-time coefficients of a live vLLM instance (``steersman calibrate``).

Prefill: single requests whose prompts are token-id lists of known length, one output token,
spaced apart as arrivals are in service (back to back, a server answers a first token up to twice
as fast as it does to a request that finds it idle); the slope of time-to-first-token over prompt
length is ``b``. Decode: k concurrent requests with ``ignore_eos``; their mean inter-token interval
is one step of k sequences, fitted by least squares to ``a + c*k + d*context``. Joins: the same
background decodes with and without a train of one-token requests joining them; the time each
join adds to the background requests, less its prefill tokens' ``b``, is ``e``; the joins' own
time to first token gives the admission delay of a request that finds the engine busy, and the
rest of the idle one is ``wake_s``. Prompts are token ids, so no tokenizer is involved.
On a GPU (``--gpu``), the SM clock the GPU held while it worked is kept with the profile: the
latency model scales step times by it over the clock it reads, and a busy GPU often runs well
below its boost clock (bound by power), so boost would plan a healthy GPU as a slowed one.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from steersman.control.backends.base import BackendError, GenerationRequest, GenerationResult
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.sim.profiles import StepModel


@dataclass(frozen=True)
class Sample:
    kind: str  # "prefill", "decode", "join" or "busy-prefill"
    seqs: int  # requests decoding (decode, join, busy-prefill) or 1 (prefill)
    prompt_tokens: int
    context_tokens: float  # mean attended tokens per step, or the prompt length (prefill)
    # TTFT (prefill, busy-prefill: while seqs decode), one step (decode), what one join adds.
    seconds: float


async def _one(
    backend: VllmHttpBackend, model: str, prompt_len: int, out: int, tag: str
) -> GenerationResult:
    # A prompt of its own per request: vLLM's prefix cache would otherwise skip the prefill of
    # every prompt that repeats an earlier one's leading blocks.
    rng = random.Random()
    body = {
        "model": model,
        "prompt": [rng.randrange(7, 1000) for _ in range(prompt_len)],
        "max_tokens": out,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    result = GenerationResult(tag, backend.name, time.monotonic())
    async for _ in backend.stream(GenerationRequest(tag, "completion", body), result):
        pass
    return result


async def _decoding(
    backend: VllmHttpBackend, model: str, seqs: int, out: int, joins: int, join_len: int, gap: float
) -> tuple[float, list[float]]:
    """Mean decode time (first to last token) of ``seqs`` background requests while ``joins``
    one-token requests of ``join_len`` prompt tokens arrive one after another, and the joins'
    times to first token."""
    background = [
        asyncio.create_task(_one(backend, model, 16, out, f"bg{seqs}-{i}")) for i in range(seqs)
    ]
    ttfts = []
    for j in range(joins):
        await asyncio.sleep(gap)
        ttfts.append((await _one(backend, model, join_len, 1, f"join{join_len}-{j}")).ttft or 0.0)
    results = await asyncio.gather(*background)
    return statistics.fmean(r.finished_at - r.first_token_at for r in results), ttfts


async def measure(
    base_url: str,
    model: str,
    *,
    max_model_len: int = 1024,
    repeats: int = 3,
    gap_s: float = 0.05,
) -> list[Sample]:
    backend = VllmHttpBackend("calibrate", base_url, read_timeout_s=120)
    samples: list[Sample] = []
    try:
        await _one(backend, model, 16, 8, "warmup")
        for prompt_len in (16, 128, 256, 512, min(896, max_model_len - 8)):
            ttfts = []
            for r in range(repeats):
                await asyncio.sleep(gap_s)
                res = await _one(backend, model, prompt_len, 1, f"p{prompt_len}-{r}")
                ttfts.append(res.ttft or 0.0)
            samples.append(Sample("prefill", 1, prompt_len, prompt_len, statistics.median(ttfts)))
        out = 64
        for prompt_len, seqs in (
            (16, 1),
            (16, 2),
            (16, 4),
            (16, 8),
            (16, 12),
            (16, 16),
            (16, 24),
            (16, 32),
            (384, 4),
            (384, 16),
        ):
            itls = []
            for r in range(repeats):
                results = await asyncio.gather(
                    *(
                        _one(backend, model, prompt_len, out, f"d{prompt_len}-{seqs}-{r}-{i}")
                        for i in range(seqs)
                    )
                )
                itls.append(statistics.fmean(res.tpot for res in results if res.tpot))
            # Mean context per sequence over the decode phase: prompt + half the output.
            samples.append(
                Sample(
                    "decode",
                    seqs,
                    prompt_len,
                    seqs * (prompt_len + out / 2),
                    statistics.median(itls),
                )
            )
        # Background decodes long enough that every join lands inside them; many joins, since
        # what each adds is a few percent of the background's time, and that varies run to run.
        seqs, joins, bg_out = 4, 32, min(800, max_model_len - 32)
        for join_len in (16, 256):
            added, ttfts = [], []
            for _ in range(repeats):
                alone, _ = await _decoding(backend, model, seqs, bg_out, 0, join_len, 0)
                joined, t = await _decoding(
                    backend, model, seqs, bg_out, joins, join_len, gap_s / 2
                )
                added.append((joined - alone) / joins)
                ttfts.extend(t)
            context = seqs * (16 + bg_out / 2)
            samples.append(Sample("join", seqs, join_len, context, statistics.median(added)))
            samples.append(
                Sample("busy-prefill", seqs, join_len, context, statistics.median(ttfts))
            )
    finally:
        await backend.aclose()
    return samples


def fit(
    samples: list[Sample],
    name: str,
    *,
    num_blocks: int,
    max_model_len: int,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
) -> StepModel:
    decode = [s for s in samples if s.kind == "decode"]
    x = np.array([[1.0, s.seqs, s.context_tokens] for s in decode])
    y = np.array([s.seconds for s in decode])
    (a, c, d), *_ = np.linalg.lstsq(x, y, rcond=None)
    prefill = [s for s in samples if s.kind == "prefill"]
    px = np.array([s.prompt_tokens for s in prefill], dtype=float)
    py = np.array([s.seconds for s in prefill])
    b, intercept = np.polyfit(px, py, 1)
    a, b = max(float(a), 1e-5), max(float(b), 0.0)
    c, d = max(float(c), 0.0), max(float(d), 0.0)
    joins = [s.seconds - b * s.prompt_tokens for s in samples if s.kind == "join"]
    # An idle request's first token takes at least one step with its prefill (a + e + b * p), so
    # the spaced single requests bound e: a join's added time is the noisiest measurement here
    # (a few percent of a busy background), and unbounded it would put the idle TTFT above
    # what the server was measured to take.
    e = min(max(statistics.fmean(joins), 0.0), max(float(intercept) - a, 0.0)) if joins else 0.0
    # What a one-token request waits beyond its one engine step (a + e) when the engine is idle:
    # HTTP, the hops between the API server and the engine, the engine waking up.
    idle = max(float(intercept) - a - e, 0.0)
    # While it decodes, a join waits for half the step in progress, then for its own step.
    busy = [
        s.seconds - 1.5 * (a + c * s.seqs + d * s.context_tokens) - e - b * s.prompt_tokens
        for s in samples
        if s.kind == "busy-prefill"
    ]
    admission = min(max(statistics.fmean(busy), 0.0), idle) if busy else idle
    return StepModel(
        name=name,
        a=a,
        b=b,
        c=c,
        d=d,
        e=e,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        admission_s=admission,
        wake_s=idle - admission,
        source=f"steersman calibrate ({len(samples)} measurements)",
    )


def busy_clock_mhz(
    rows: Iterable[Mapping[str, Any]], gpu_index: int, min_activity: float = 0.5
) -> float | None:
    """The mean SM clock of one GPU over the telemetry rows (the sampler's per-second
    aggregates) in which it was busy: SM activity at least ``min_activity``. None when it never
    was, or no such row has a clock.

    >>> rows = [
    ...     {"gpu_index": 0, "sm_activity": 0.02, "sm_clock_mhz": 1980.0},  # idle: boost
    ...     {"gpu_index": 0, "sm_activity": 0.9, "sm_clock_mhz": 1500.0},
    ...     {"gpu_index": 0, "sm_activity": 0.8, "sm_clock_mhz": 1460.0},
    ...     {"gpu_index": 1, "sm_activity": 0.9, "sm_clock_mhz": 1100.0},
    ...     {"gpu_index": 0, "sm_activity": None, "sm_clock_mhz": 1300.0},
    ... ]
    >>> busy_clock_mhz(rows, 0), busy_clock_mhz(rows, 2)
    (1480.0, None)
    """
    clocks = [
        r["sm_clock_mhz"]
        for r in rows
        if r.get("gpu_index") == gpu_index
        and (r.get("sm_activity") or 0.0) >= min_activity  # a failed reading is None
        and (r.get("sm_clock_mhz") or 0.0) > 0
    ]
    return statistics.fmean(clocks) if clocks else None


def measure_and_fit(
    base_url: str, model: str, name: str, *, num_blocks: int, max_model_len: int, repeats: int = 3
) -> tuple[StepModel, list[Sample]]:
    try:
        samples = asyncio.run(
            measure(base_url, model, max_model_len=max_model_len, repeats=repeats)
        )
    except BackendError as exc:
        raise RuntimeError(f"calibration request failed: {exc}") from None
    return fit(samples, name, num_blocks=num_blocks, max_model_len=max_model_len), samples
