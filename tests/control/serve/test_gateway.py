"""The gateway end to end against simulated instances, with the official openai client."""

from __future__ import annotations

import httpx
import openai
import pytest
from sqlalchemy import text

from steersman.storage.engine import make_engine
from tests.control.serve.serving import running, settings_for

SIMS = [{"name": "sim-a", "sim": "cpu-tiny"}, {"name": "sim-b", "sim": "cpu-tiny"}]
MODEL = "steersman-sim"


def _rows(settings, sql: str) -> list:
    engine = make_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)))
    finally:
        engine.dispose()


def test_openai_client_streaming_and_not(tmp_path):
    settings = settings_for(tmp_path, SIMS)
    with running(settings) as (daemon, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL]
        done = client.completions.create(model=MODEL, prompt="Name three colours.", max_tokens=7)
        assert done.usage.completion_tokens == 7
        assert done.choices[0].finish_reason == "length"
        assert done.choices[0].text.count(" t") == 7
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a Python function to add numbers."}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert content.count(" t") == 5
        assert chunks[-1].usage.completion_tokens == 5
        assert all(c.id == chunks[0].id for c in chunks)
        # Longer than the window (1024 simulated tokens): the instance's 400, passed through.
        with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):
            client.completions.create(model=MODEL, prompt="word " * 2000, max_tokens=4)
        daemon.writer.flush(10)
        rows = _rows(
            settings,
            "SELECT request_class, actual_tokens, instance, policy, predictor_path, "
            "scheduled_prediction, ttft_s, e2e_s, qoe, error FROM requests ORDER BY id",
        )
    assert len(rows) == 3
    assert "1024" in rows[2].error
    rows = rows[:2]
    assert [r.actual_tokens for r in rows] == [7, 5]
    assert rows[1].request_class == "code"
    for r in rows:
        assert r.error is None and r.instance in ("sim-a", "sim-b")
        assert r.policy == "predictive" and r.predictor_path == "fast"
        assert 0 < r.ttft_s <= r.e2e_s and 0 < r.qoe <= 1
        assert 1 <= r.scheduled_prediction <= 7 or r.actual_tokens == 5


def test_bad_requests_get_openai_errors(tmp_path):
    settings = settings_for(tmp_path, SIMS, gateway={"max_body_bytes": 4096})
    with running(settings) as (daemon, url):
        post = httpx.Client(base_url=url, timeout=10).post
        cases = [
            (post("/v1/completions", content=b"{not json"), 400, None),
            (post("/v1/completions", json={"model": MODEL}), 400, "prompt"),
            (post("/v1/completions", json={"model": MODEL, "prompt": ""}), 400, "prompt"),
            (
                post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": -3}),
                400,
                "max_tokens",
            ),
            (
                post("/v1/completions", json={"model": MODEL, "prompt": 5}),
                400,
                "prompt",
            ),
            (post("/v1/chat/completions", json={"model": MODEL, "messages": []}), 400, "messages"),
            (
                post("/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 2}),
                404,
                "model",
            ),
            (post("/v1/completions", content=b'{"model": "\xff\xfe"}'), 400, None),
            (post("/v1/completions", content=b"x" * 5000), 413, None),
        ]
        for response, status, param in cases:
            assert response.status_code == status, response.text
            error = response.json()["error"]
            assert error["message"] and error["type"]
            if param:
                assert error["param"].startswith(param), error
        assert post(
            "/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2}
        ).is_success
        daemon.writer.flush(10)


def test_api_keys(tmp_path):
    settings = settings_for(
        tmp_path, SIMS, gateway={"api_keys": ["inference-key"], "admin_api_keys": ["admin-key"]}
    )
    with running(settings) as (_, url):
        client = httpx.Client(base_url=url, timeout=10)
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        assert client.post("/v1/completions", json=body).status_code == 401
        bad = {"Authorization": "Bearer wrong"}
        assert client.post("/v1/completions", json=body, headers=bad).status_code == 401
        good = {"Authorization": "Bearer inference-key"}
        assert client.post("/v1/completions", json=body, headers=good).status_code == 200
        assert client.get("/admin/state", headers=good).status_code == 403
        admin = {"Authorization": "Bearer admin-key"}
        assert client.get("/admin/state", headers=admin).json()["mode"] == "NORMAL"
        assert client.get("/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


def test_metrics_and_admin_state(tmp_path):
    settings = settings_for(tmp_path, SIMS)
    with running(settings) as (_, url):
        client = httpx.Client(base_url=url, timeout=10)
        for _ in range(3):
            client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
        metrics = client.get("/metrics")
        state = client.get("/admin/state").json()
    assert metrics.headers["content-type"].startswith("text/plain")
    text_ = metrics.text
    assert 'steersman_requests_total{instance="sim-a",outcome="ok",policy="predictive"}' in text_
    assert "steersman_decision_seconds_count 3.0" in text_
    assert 'steersman_mode{mode="NORMAL"} 1.0' in text_
    assert "steersman_prediction_error_ratio_bucket" in text_
    # the core's admission counts, the same as /admin/state's
    assert f"steersman_kv_overrides_total {float(state['kv_overrides'])}" in text_
    assert f"steersman_kv_held_total {float(state['kv_held'])}" in text_
    assert state["mode"] == "NORMAL" and state["miss_streak"] >= 0
    assert [i["name"] for i in state["instances"]] == ["sim-a", "sim-b"]
    assert state["predictor"]["n"] == 3


def test_streamed_qoe_expectations_from_settings_and_headers(tmp_path):
    code = {"ttft_s": 3.0, "pace_s": 0.05}
    settings = settings_for(tmp_path, SIMS, qoe={"enabled": True, "classes": {"code": code}})
    with running(settings) as (daemon, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        client.completions.create(model=MODEL, prompt="Name three colours.", max_tokens=4)
        client.completions.create(model=MODEL, prompt="Write a Python function to sort.",
                                  max_tokens=4)  # fmt: skip
        client.completions.create(
            model=MODEL,
            prompt="Name three colours.",
            max_tokens=4,
            extra_headers={"x-steersman-expected-ttft": "0.5", "x-steersman-expected-pace": "0.1"},
        )
        post = httpx.Client(base_url=url, timeout=10).post
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        for header, value in [
            ("x-steersman-expected-ttft", "soon"),
            ("x-steersman-expected-pace", "0"),
            ("x-steersman-expected-pace", "inf"),
            ("x-steersman-expected-ttft", "1e9"),
        ]:
            response = post("/v1/completions", json=body, headers={header: value})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == header and repr(value) in error["message"]
        daemon.writer.flush(10)
        rows = _rows(
            settings,
            "SELECT request_class, expected_ttft_s, expected_pace_s, qoe, error FROM requests "
            "ORDER BY id",
        )
    assert [(r.expected_ttft_s, r.expected_pace_s) for r in rows[:3]] == [
        (1.0, 0.2),  # the settings' default
        (3.0, 0.05),  # its class's
        (0.5, 0.1),  # the client's own
    ]
    assert rows[1].request_class == "code"
    assert all(0 < r.qoe <= 1 and r.error is None for r in rows[:3])
    assert len(rows) == 7 and all("header x-steersman-expected" in r.error for r in rows[3:])
