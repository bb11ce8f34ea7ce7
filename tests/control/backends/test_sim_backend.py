"""The simulated instance in real time, behind the same interface as the HTTP backend."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from steersman.control.backends.base import GenerationRequest, GenerationResult, UpstreamRejected
from steersman.control.backends.sim import SimBackend
from steersman.control.sim.profiles import PROFILES

FAST = dataclasses.replace(PROFILES["cpu-tiny"], a=0.002, b=0.0, c=0.0, d=0.0)


async def _collect(backend, request):
    result = GenerationResult(request.request_id, backend.name, time.monotonic())
    events = [e async for e in backend.stream(request, result)]
    return result, events


def test_streams_exact_tokens_with_usage_and_modelled_timing():
    async def go():
        backend = SimBackend("sim-0", FAST, count_tokens=lambda text: len(text.split()))
        try:
            body = {"model": "tiny", "prompt": "one two three four", "max_tokens": 20}
            return await _collect(backend, GenerationRequest("a", "completion", body))
        finally:
            await backend.aclose()

    result, events = asyncio.run(go())
    assert result.ok and result.completion_tokens == 20 and result.prompt_tokens == 4
    assert [n for _, n in result.token_times] == list(range(1, 21))
    assert events[-1].data["choices"][0]["finish_reason"] == "length"
    # 20 steps of 2 ms each: never faster than the model says.
    assert result.e2e >= 20 * 0.002


def test_chat_chunks_and_a_shorter_true_length():
    async def go():
        backend = SimBackend("sim-0", FAST)
        try:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 50,
            }
            request = GenerationRequest("c", "chat", body, xargs={"sim_output_tokens": 7})
            return await _collect(backend, request)
        finally:
            await backend.aclose()

    result, events = asyncio.run(go())
    assert result.completion_tokens == 7
    assert events[0].data["object"] == "chat.completion.chunk"
    assert events[0].data["choices"][0]["delta"]["role"] == "assistant"


def test_concurrent_requests_share_steps():
    async def go():
        backend = SimBackend("sim-0", FAST)
        try:
            body = {"model": "tiny", "prompt": "x", "max_tokens": 30}
            return await asyncio.gather(
                *(
                    _collect(backend, GenerationRequest(f"r{i}", "completion", body))
                    for i in range(8)
                )
            ), backend.engine.stats.steps
        finally:
            await backend.aclose()

    results, steps = asyncio.run(go())
    assert all(r.completion_tokens == 30 for r, _ in results)
    assert steps < 8 * 30 / 2  # batched, not one request after another


def test_window_overflow_is_a_400_and_a_dropped_stream_frees_blocks():
    async def go():
        backend = SimBackend("sim-0", FAST)
        try:
            with pytest.raises(UpstreamRejected) as info:
                await _collect(
                    backend,
                    GenerationRequest(
                        "big", "completion", {"prompt": "x" * 8000, "max_tokens": 10}
                    ),
                )
            result = GenerationResult("d", "sim-0", time.monotonic())
            stream = backend.stream(
                GenerationRequest("d", "completion", {"prompt": "x", "max_tokens": 500}), result
            )
            async for _ in stream:
                break
            await stream.aclose()  # the client went away
            return info.value, backend.engine
        finally:
            await backend.aclose()

    error, engine = asyncio.run(go())
    assert error.status == 400 and "1024" in str(error)
    assert not engine.has_work() and engine.free_blocks == engine.model.num_blocks
