"""The HTTP backend and the metrics parser against two real vLLM CPU servers."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from steersman.control.backends.base import (
    GenerationRequest,
    GenerationResult,
    InstanceUnavailable,
    UpstreamRejected,
)
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.learners.tokens import TokenCounter
from steersman.telemetry.vllm_metrics import scrape

pytestmark = pytest.mark.vllm


async def _run(
    backend: VllmHttpBackend, request: GenerationRequest
) -> tuple[GenerationResult, int]:
    result = GenerationResult(request.request_id, backend.name, time.monotonic())
    chunks = 0
    async for _ in backend.stream(request, result):
        chunks += 1
    return result, chunks


def test_completion_stream_has_exact_tokens_and_timing(vllm_servers, tiny_model):
    prompt = "Give three tips for staying healthy."

    async def go():
        backend = VllmHttpBackend("a", vllm_servers[0].url)
        try:
            assert await backend.health()
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 40, "ignore_eos": True}
            request = GenerationRequest("r1", "completion", body, priority=5, xargs={"pred": 37})
            return await _run(backend, request)
        finally:
            await backend.aclose()

    result, chunks = asyncio.run(go())
    assert result.ok and result.finish_reason == "length"
    assert result.completion_tokens == 40 and chunks >= 1
    # Token counts are in the served model's tokens: our counter agrees with the server.
    assert result.prompt_tokens == TokenCounter(tiny_model).count(prompt)
    # When the reader lags, vLLM merges tokens into fewer chunks; the per-chunk usage still
    # times every token: counts rise to exactly 40, times never go back.
    counts = [n for _, n in result.token_times]
    times = [t for t, _ in result.token_times]
    assert counts[-1] == 40 and counts == sorted(set(counts)) and counts[0] >= 1
    assert times == sorted(times) and len(counts) <= chunks
    assert 0 < result.ttft < result.e2e and result.tpot > 0
    assert TokenCounter(tiny_model).count(result.texts[0]) > 0


def test_chat_stream_on_the_second_server(vllm_servers):
    async def go():
        backend = VllmHttpBackend("b", vllm_servers[1].url)
        try:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 12,
                "ignore_eos": True,
            }
            return await _run(backend, GenerationRequest("r2", "chat", body, priority=0))
        finally:
            await backend.aclose()

    result, _ = asyncio.run(go())
    assert result.ok and result.completion_tokens == 12 and result.texts[0]


def test_a_request_the_server_refuses_is_a_4xx_not_an_outage(vllm_servers):
    async def go():
        backend = VllmHttpBackend("a", vllm_servers[0].url)
        try:
            body = {"model": "tiny", "prompt": "x", "max_tokens": 100_000}
            with pytest.raises(UpstreamRejected) as info:
                await _run(backend, GenerationRequest("r3", "completion", body))
            return info.value
        finally:
            await backend.aclose()

    error = asyncio.run(go())
    assert error.status == 400 and not error.retryable
    assert "1024" in str(error)  # the server names its context limit


def test_an_unreachable_instance_is_retryable_and_fast():
    async def go():
        backend = VllmHttpBackend("gone", "http://127.0.0.1:1", connect_timeout_s=0.5)
        try:
            assert not await backend.health(timeout_s=0.5)
            started = time.monotonic()
            with pytest.raises(InstanceUnavailable) as info:
                await _run(
                    backend, GenerationRequest("r4", "completion", {"model": "tiny", "prompt": "x"})
                )
            return info.value, time.monotonic() - started
        finally:
            await backend.aclose()

    error, took = asyncio.run(go())
    assert error.retryable and error.result is not None and error.result.error
    assert took < 5


def test_real_metrics_page_parses(vllm_servers):
    async def go():
        backend = VllmHttpBackend("a", vllm_servers[0].url)
        body = {"model": "tiny", "prompt": "Count to five.", "max_tokens": 8, "ignore_eos": True}
        try:
            await _run(backend, GenerationRequest("r5", "completion", body))
        finally:
            await backend.aclose()
        async with httpx.AsyncClient() as client:
            return await scrape(client, vllm_servers[0].url, timeout_s=5.0)

    m = asyncio.run(go())
    assert m.running == 0 and m.waiting == 0 and m.kv_cache_usage == 0
    assert m.block_size and m.num_gpu_blocks and m.num_gpu_blocks * m.block_size > 1000
    assert m.ttft is not None and m.ttft.count >= 1
    assert m.itl is not None and m.e2e is not None and m.preemptions_total == 0
