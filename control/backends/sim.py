"""A simulated vLLM instance behind the backend interface, in real time (no HTTP, no model)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from steersman.control.backends.base import (
    GenerationRequest,
    GenerationResult,
    StreamEvent,
    UpstreamRejected,
)
from steersman.control.core.qoe_rule import expectation
from steersman.control.core.settings import QoeSettings
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.profiles import StepModel


def _prompt_text(request: GenerationRequest) -> str:
    if request.kind == "chat":
        messages = request.body.get("messages") or []
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = request.body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


class SimBackend:
    """Steps a SimEngine on the event loop, sleeping each step's modelled duration, and streams
    vLLM-shaped chunks with per-chunk usage. Its engine schedules as vLLM does with steersman's
    scheduler class. A request generates ``max_tokens`` tokens (as with
    ``ignore_eos``), or ``vllm_xargs["sim_output_tokens"]`` when given and smaller."""

    def __init__(
        self,
        name: str,
        model: StepModel,
        *,
        policy: str = "steersman",
        count_tokens: Callable[[str], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        model_name: str = "steersman-sim",
        qoe: QoeSettings | None = None,
    ) -> None:
        self.name = name
        self.model_name = model_name
        self.engine = SimEngine(model, policy, qoe=qoe)
        self._count = count_tokens or (lambda text: max(1, len(text) // 4))
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.healthy = True

    async def _run(self) -> None:
        while True:
            plan = self.engine.plan(self._clock()) if self.engine.has_work() else None
            if plan is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(plan.duration)
            self.engine.finish(plan, self._clock())

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[StreamEvent]:
        body = request.body
        prompt_tokens = self._count(_prompt_text(request))
        output = int(body.get("max_tokens") or 16)
        if request.xargs and "sim_output_tokens" in request.xargs:
            output = max(1, min(output, int(request.xargs["sim_output_tokens"])))
        limit = self.engine.model.max_model_len
        if prompt_tokens + output > limit:
            message = (
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + output} tokens ({prompt_tokens} in the "
                f"messages, {output} in the completion)."
            )
            result.error = f"{self.name}: HTTP 400: {message}"
            raise UpstreamRejected(result.error, 400, {"error": {"message": message}})
        queue: asyncio.Queue[tuple[float, int]] = asyncio.Queue()
        sim = SimRequest(
            request.request_id,
            self._clock(),
            prompt_tokens,
            output,
            priority=request.priority or 0,
            predicted=_predicted(request.xargs),
            expectation=_expectation(request.xargs),
            on_token=lambda r, t: queue.put_nowait((t, r.generated)),
        )
        delay = self.engine.model.admission(self.engine.has_work())
        if delay > 0:
            await asyncio.sleep(delay)
        self.engine.add(sim)
        self._ensure_running()
        self._wake.set()
        chat = request.kind == "chat"
        created = int(time.time())
        try:
            while True:
                t, n = await queue.get()
                last = n >= output
                data = _chunk(request, chat, created, n, prompt_tokens, last)
                result.account(data, t)
                yield StreamEvent(t, data)
                if last:
                    result.finished_at = t
                    return
        finally:
            if sim.finished_at is None:
                self.engine.abort(sim)  # the caller stopped listening: free its KV blocks

    async def health(self, timeout_s: float = 1.0) -> bool:
        return self.healthy

    async def models(self) -> list[dict[str, Any]]:
        card = {"id": self.model_name, "object": "model", "owned_by": "steersman"}
        return [{**card, "max_model_len": self.engine.model.max_model_len}]

    def load(self) -> tuple[float, int]:
        """(KV-cache usage, waiting requests), read straight from the engine."""
        return self.engine.kv_usage(), self.engine.waiting

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _predicted(xargs: dict[str, Any] | None) -> float | None:
    """steersman's predicted length, as its vLLM scheduler class reads it."""
    value = (xargs or {}).get("steersman_predicted_tokens")
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def _expectation(xargs: dict[str, Any] | None) -> tuple[float, float] | None:
    """Its reader's (TTFT, pace), as steersman's vLLM scheduler class reads them (None: the
    QoE rule leaves the request alone, as the class does)."""
    return expectation(xargs or {})


def _chunk(
    request: GenerationRequest, chat: bool, created: int, n: int, prompt_tokens: int, last: bool
) -> dict[str, Any]:
    finish = "length" if last else None
    if chat:
        delta: dict[str, Any] = {"content": f" t{n}"}
        if n == 1:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": f" t{n}", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {
        "id": f"sim-{request.request_id}",
        "object": kind,
        "created": created,
        "model": request.body.get("model", "sim"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        },
    }
