"""Replays a workload against an OpenAI-compatible endpoint and measures every request."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from steersman.control.backends.base import BackendError, GenerationRequest, GenerationResult
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.core.qoe import qoe
from steersman.control.harness.workloads import WorkItem
from steersman.storage.query import percentile


@dataclass(frozen=True)
class Replayed:
    index: int
    prompt_id: str
    arrival_s: float
    true_tokens: int
    completion_tokens: int | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    qoe: float | None
    error: str | None
    cached_tokens: int | None = None  # prompt tokens the server found cached, if it says

    @property
    def ok(self) -> bool:
        return self.error is None


async def replay(
    items: Sequence[WorkItem],
    backend: VllmHttpBackend,
    *,
    model: str,
    time_scale: float = 1.0,
    expected_ttft: float = 1.0,
    expected_pace: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    on_outcome: Callable[[Replayed], None] | None = None,
    extra_body: dict[str, Any] | None = None,
) -> list[Replayed]:
    """Send each item at its arrival time (times ``time_scale``) with ``max_tokens`` = its true
    length and ``ignore_eos``, so the server generates exactly the real response's length.
    A chat item goes to chat completions; ``extra_body`` is merged into every request."""
    start = clock()

    async def one(item: WorkItem) -> Replayed:
        delay = start + item.arrival_s * time_scale - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        kind = "chat" if item.messages else "completion"
        body: dict[str, Any] = {"model": model, "max_tokens": item.true_tokens, "ignore_eos": True}
        if item.messages:
            body["messages"] = list(item.messages)
        else:
            body["prompt"] = list(item.token_ids) if item.token_ids else item.prompt
        body.update(extra_body or {})
        result = GenerationResult(f"replay-{item.index}", backend.name, clock())
        try:
            async for _ in backend.stream(GenerationRequest(result.request_id, kind, body), result):
                pass
        except BackendError as exc:
            result.error = result.error or str(exc)
        outcome = _outcome(item, result, expected_ttft, expected_pace)
        if on_outcome is not None:
            on_outcome(outcome)
        return outcome

    return list(await asyncio.gather(*(one(item) for item in items)))


def _outcome(item: WorkItem, r: GenerationResult, ttft: float, pace: float) -> Replayed:
    relative = [(t - r.started_at, n) for t, n in r.token_times]
    return Replayed(
        index=item.index,
        prompt_id=item.prompt_id,
        arrival_s=item.arrival_s,
        true_tokens=item.true_tokens,
        completion_tokens=r.completion_tokens,
        ttft_s=r.ttft,
        tpot_s=r.tpot,
        e2e_s=r.e2e if r.ok else None,
        qoe=qoe(relative, r.completion_tokens or 0, expected_ttft=ttft, expected_pace=pace),
        error=r.error,
        cached_tokens=r.cached_tokens,
    )


def summarize(outcomes: Sequence[Replayed], wall_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.ok]
    summary: dict[str, Any] = {
        "requests": len(outcomes),
        "succeeded": len(ok),
        "failed": len(outcomes) - len(ok),
        "exact_lengths": sum(o.completion_tokens == o.true_tokens for o in ok),
        "wall_s": round(wall_s, 3),
        "throughput_rps": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
    }
    for name in ("ttft_s", "tpot_s", "e2e_s", "qoe"):
        values = [v for o in ok if (v := getattr(o, name)) is not None]
        summary[name] = {
            "mean": round(statistics.fmean(values), 6) if values else None,
            "p50": percentile(values, 0.50),
            "p95": percentile(values, 0.95),
            "p99": percentile(values, 0.99),
        }
    cached = [o.cached_tokens for o in ok if o.cached_tokens is not None]
    summary["cached_prompt_tokens"] = sum(cached) if cached else None  # as the server reports
    summary["errors"] = sorted({o.error for o in outcomes if o.error})[:10]
    return summary


def outcome_records(outcomes: Sequence[Replayed]) -> list[dict[str, Any]]:
    return [asdict(o) for o in outcomes]
