"""Fuzzing the gateway with hypothesis: whatever arrives, no 5xx, no crash, OpenAI error shape."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.control.serve.serving import running, settings_for

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", "robot"]) | JSON,
        "content": st.text(max_size=60) | JSON,
    },
)
FIELDS = {
    "model": st.sampled_from(["steersman-sim", "nope"]) | JSON,
    "prompt": st.text(max_size=80) | st.lists(st.text(max_size=20), max_size=3) | JSON,
    "messages": st.lists(MESSAGE, max_size=3) | JSON,
    "max_tokens": st.integers(min_value=-5, max_value=2000) | st.integers() | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}) | JSON,
    "temperature": st.floats(allow_nan=False, allow_infinity=False) | JSON,
    "n": st.integers(-2, 3) | JSON,
    "vllm_xargs": JSON,
    "priority": JSON,
}
BODY = st.fixed_dictionaries({}, optional=FIELDS)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    # A simulated instance that steps in microseconds, so long generations cost nothing.
    profile = tmp / "fast.json"
    profile.write_text(
        json.dumps(
            {"name": "fast-sim", "a": 1e-6, "b": 0.0, "c": 0.0, "d": 0.0, "num_blocks": 100000,
             "max_model_len": 1024}
        )
    )  # fmt: skip
    settings = settings_for(tmp, [{"name": "fast", "sim": str(profile)}])
    with running(settings) as (_, url), httpx.Client(base_url=url, timeout=30) as client:
        yield client


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=BODY, chat=st.booleans())
def test_json_bodies(gateway, body, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    check(gateway.post(path, json=body))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=300), chat=st.booleans())
def test_raw_bytes(gateway, raw, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    check(gateway.post(path, content=raw, headers={"content-type": "application/json"}))


@pytest.mark.parametrize("max_tokens", [0, -1, 10**12, 2**63, "many", 1.5])
def test_absurd_max_tokens(gateway, max_tokens):
    body = {"model": "steersman-sim", "prompt": "hi", "max_tokens": max_tokens}
    response = gateway.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "steersman-sim", "prompt": "hi", "max_tokens": NaN}',
        b'{"model": "steersman-sim", "prompt": "hi", "temperature": Infinity, "max_tokens": 2}',
        b'{"model": "steersman-sim", "prompt": "\\ud800", "max_tokens": 2}',
        b'{"model": "steersman-sim", "prompt": "hi", "max_tokens": 2',
        b"[]",
        b"null",
        b'{"model": "steersman-sim", "messages": [{"role": "user"}]}',
    ],
)
def test_odd_json(gateway, raw):
    check(gateway.post("/v1/completions", content=raw))
    check(gateway.post("/v1/chat/completions", content=raw))
