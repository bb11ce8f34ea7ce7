"""Measures the step-time coefficients of a live vLLM instance (``steersman calibrate``).

Prefill: single requests whose prompts are token-id lists of known length, one output token;
the slope of time-to-first-token over prompt length is ``b``. Decode: k concurrent requests with
``ignore_eos``; their mean inter-token interval is one step of k sequences, fitted by least
squares to ``a + c*k + d*context``. Prompts are token ids, so no tokenizer is involved.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import numpy as np

from steersman.control.backends.base import BackendError, GenerationRequest, GenerationResult
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.sim.profiles import StepModel


@dataclass(frozen=True)
class Sample:
    kind: str  # "prefill" or "decode"
    seqs: int
    prompt_tokens: int
    context_tokens: float  # mean attended tokens per step (decode) or prompt length (prefill)
    seconds: float


async def _one(
    backend: VllmHttpBackend, model: str, prompt_len: int, out: int, tag: str
) -> GenerationResult:
    body = {
        "model": model,
        "prompt": [7 + (i % 50) for i in range(prompt_len)],
        "max_tokens": out,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    result = GenerationResult(tag, backend.name, time.monotonic())
    async for _ in backend.stream(GenerationRequest(tag, "completion", body), result):
        pass
    return result


async def measure(
    base_url: str, model: str, *, max_model_len: int = 1024, repeats: int = 3
) -> list[Sample]:
    backend = VllmHttpBackend("calibrate", base_url, read_timeout_s=120)
    samples: list[Sample] = []
    try:
        await _one(backend, model, 16, 8, "warmup")
        for prompt_len in (16, 128, 256, 512, min(896, max_model_len - 8)):
            ttfts = []
            for r in range(repeats):
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
    return StepModel(
        name=name,
        a=max(float(a), 1e-5),
        b=max(float(b), 0.0),
        c=max(float(c), 0.0),
        d=max(float(d), 0.0),
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        # What a one-token request waits beyond one engine step: HTTP, tokenization, queueing.
        admission_s=max(float(intercept) - max(float(a), 1e-5), 0.0),
        source=f"steersman calibrate ({len(samples)} measurements)",
    )


def measure_and_fit(
    base_url: str, model: str, name: str, *, num_blocks: int, max_model_len: int
) -> tuple[StepModel, list[Sample]]:
    try:
        samples = asyncio.run(measure(base_url, model, max_model_len=max_model_len))
    except BackendError as exc:
        raise RuntimeError(f"calibration request failed: {exc}") from None
    return fit(samples, name, num_blocks=num_blocks, max_model_len=max_model_len), samples
