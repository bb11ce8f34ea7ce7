"""The whole loop against two real vLLM CPU servers, with the official openai client."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from sqlalchemy import text

from steersman.storage.engine import make_engine
from steersman.telemetry.vllm_metrics import scrape
from tests.conftest import wait_until
from tests.control.serve.serving import running, settings_for

pytestmark = pytest.mark.vllm


@pytest.fixture
def gateway(vllm_servers, tiny_model, tmp_path):
    instances = [
        {"name": f"vllm-{k}", "url": s.url, "profile": "cpu-tiny", "max_in_flight": 4}
        for k, s in enumerate(vllm_servers)
    ]
    settings = settings_for(tmp_path, instances, predictor={"tokenizer_dir": str(tiny_model)})
    with running(settings) as (daemon, url):
        yield settings, daemon, url


def test_openai_client_through_steersman_to_vllm(gateway):
    settings, daemon, url = gateway

    async def traffic():
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        prompts = [f"List {k + 2} fruits." for k in range(6)]

        async def plain(k, prompt):
            r = await client.completions.create(
                model="tiny", prompt=prompt, max_tokens=8 + k, extra_body={"ignore_eos": True}
            )
            return r.usage.completion_tokens

        async def streamed(k, prompt):
            stream = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8 + k,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            return sum([1 async for c in stream if c.choices and c.choices[0].delta.content])

        jobs = [plain(k, p) for k, p in enumerate(prompts[:3])]
        jobs += [streamed(k, p) for k, p in enumerate(prompts[3:])]
        return await asyncio.gather(*jobs)

    counts = asyncio.run(traffic())
    assert counts[:3] == [8, 9, 10]
    assert all(c >= 1 for c in counts[3:])
    metrics = httpx.get(f"{url}/metrics").text
    assert 'steersman_requests_total{instance="vllm-0",outcome="ok",policy="predictive"}' in metrics
    assert daemon.writer.flush(20)
    engine = make_engine(settings.database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT request_id, instance, prompt_tokens, actual_tokens, scheduled_prediction, "
                "ttft_s, e2e_s, tpot_s, qoe, miss, finish_reason, error FROM requests"
            )
        ).all()
    engine.dispose()
    assert len(rows) == 6
    assert {r.instance for r in rows} == {"vllm-0", "vllm-1"}
    for r in rows:
        assert r.error is None and r.finish_reason == "length"
        assert r.prompt_tokens > 0 and r.actual_tokens in range(8, 11)
        assert 0 < r.ttft_s < r.e2e_s and r.tpot_s > 0 and r.qoe > 0
        assert r.scheduled_prediction >= 1 and r.miss is not None


def test_prompt_over_the_window_is_a_400_naming_the_limit(gateway):
    _, _, url = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt="story " * 3000, max_tokens=4)
    assert "maximum context length is" in str(caught.value)
    assert caught.value.body["code"] == "context_length_exceeded"


def test_client_leaving_mid_stream_cancels_the_upstream_request(gateway, vllm_servers):
    _, daemon, url = gateway
    body = {
        "model": "tiny",
        "prompt": "Write an essay.",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert next(response.iter_lines()).startswith("data: {")
    # the response is closed here, mid-stream

    def upstream_idle() -> bool:
        running = 0.0
        for server in vllm_servers:
            m = asyncio.run(_scrape(server.url))
            running += m.running or 0
        core = daemon.service.scheduler
        return running == 0 and not any(core.in_flight(n) for n in daemon.service.instances)

    wait_until(upstream_idle, 30, "vLLM to drop the abandoned request")
    assert daemon.writer.flush(20)
    engine = make_engine(daemon.settings.database_url)
    with engine.connect() as conn:
        error, actual = conn.execute(text("SELECT error, actual_tokens FROM requests")).one()
    engine.dispose()
    assert error == "client disconnected" and actual is None


async def _scrape(url: str):
    async with httpx.AsyncClient() as client:
        return await scrape(client, url, timeout_s=5.0)
