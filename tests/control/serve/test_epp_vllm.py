"""steersman as the endpoint picker behind a real Envoy, in front of two vLLM CPU servers: the
official openai client through Envoy, the history as the gateway writes it, Envoy's failure
modes with the picker down."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from sqlalchemy import text

from steersman.control.backends.envoy_proxy import EnvoyProxy
from steersman.control.backends.vllm_server import free_port
from steersman.storage.engine import make_engine
from tests.conftest import wait_until
from tests.control.serve.serving import running, settings_for

pytestmark = pytest.mark.vllm


def _address(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


@pytest.fixture
def picker(vllm_servers, tiny_model, tmp_path):
    instances = [
        {"name": f"vllm-{k}", "url": s.url, "profile": "cpu-tiny", "max_in_flight": 2}
        for k, s in enumerate(vllm_servers)
    ]
    settings = settings_for(
        tmp_path,
        instances,
        predictor={"tokenizer_dir": str(tiny_model)},
        epp={"enabled": True, "port": 0},
        gateway={"max_body_bytes": 4096},
    )
    with running(settings) as (daemon, url):
        servers = [_address(s.url) for s in vllm_servers]
        picked = f"127.0.0.1:{daemon.epp_port}"
        proxy = lambda **kw: EnvoyProxy(picked, servers, tmp_path / "envoy", **kw)  # noqa: E731
        yield settings, daemon, proxy, url  # url: the same loop's own gateway


@pytest.mark.parametrize(
    "mode",
    [{}, {"fail_open": True}, {"observe": True}],
    ids=["full-duplex", "buffered", "observed-answers"],
)
def test_openai_client_through_envoy_and_the_picker(picker, mode):
    settings, daemon, proxy, gateway = picker
    with proxy(**mode) as envoy:
        counts = asyncio.run(_traffic(envoy.url))
        # The picker's own gateway serves too: steersman carries those bytes itself.
        direct = httpx.post(
            f"{gateway}/v1/completions",
            json={"model": "tiny", "prompt": "Hi", "max_tokens": 5, "ignore_eos": True},
            timeout=120,
        )
    assert direct.status_code == 200 and direct.json()["usage"]["completion_tokens"] == 5
    assert counts == [6, 7, 8, 9, 6, 7, 8, 9]
    engine = make_engine(settings.database_url)
    query = "SELECT instance, actual_tokens, ttft_s, error FROM requests WHERE error IS NULL"
    wait_until(lambda: len(engine.connect().execute(text(query)).fetchall()) >= 9, timeout=30)
    rows = engine.connect().execute(text(query)).fetchall()
    engine.dispose()
    assert sorted(r.actual_tokens for r in rows) == sorted([*counts, 5])
    assert {r.instance for r in rows} <= {"vllm-0", "vllm-1"}
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in rows)
    # Every request was the core's: none is left in flight once the answers are in.
    assert sum(daemon.service.scheduler.in_flight(n) for n in ("vllm-0", "vllm-1")) == 0


async def _traffic(url: str) -> list[int]:
    """Four plain completions and four streamed chats at once; their completion tokens."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)

    async def plain(k):
        r = await client.completions.create(
            model="tiny", prompt=f"Count to {k + 3}.", max_tokens=6 + k,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return r.usage.completion_tokens

    async def streamed(k):
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"Name {k + 2} birds."}],
            max_tokens=6 + k, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    return await asyncio.gather(*[plain(k) for k in range(4)], *[streamed(k) for k in range(4)])


BAD = [
    pytest.param(b"{not json", 400, None, id="not JSON"),
    pytest.param(b'{"model": "tiny", "max_tokens": 4}', 400, "prompt", id="no prompt"),
    pytest.param(b'{"model": "tiny", "prompt": ""}', 400, "prompt", id="empty prompt"),
    pytest.param(b'{"model": "nope", "prompt": "Hi"}', 404, "model", id="unknown model"),
    pytest.param(b'{"model": "tiny", "prompt": "' + b"x" * 5000 + b'"}', 413, None, id="too big"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_the_picker_refuses_bad_input_in_openai_shape(picker, body, status, param):
    _, _, proxy, _ = picker
    with proxy() as envoy:
        response = httpx.post(
            f"{envoy.url}/v1/completions", content=body, timeout=30,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        fine = httpx.post(
            f"{envoy.url}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2},
            timeout=60,
        )  # fmt: skip
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
    assert fine.status_code == 200  # the picker serves on


@pytest.mark.parametrize("fail_open", [True, False])
def test_envoy_with_the_picker_down(vllm_servers, tmp_path, fail_open):
    servers = [_address(s.url) for s in vllm_servers]
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    with EnvoyProxy(down, servers, tmp_path / "envoy", fail_open=fail_open) as envoy:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4}
        responses = [
            httpx.post(f"{envoy.url}/v1/completions", json=body, timeout=60) for _ in range(3)
        ]
    if fail_open:
        assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
        assert all(r.json()["usage"]["completion_tokens"] >= 1 for r in responses)
    else:
        assert all(500 <= r.status_code < 600 for r in responses)
