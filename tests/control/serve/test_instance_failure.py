"""SIGKILL one of two real vLLM CPU servers under load: retried or cleanly failed, never hung,
marked down, readmitted when it answers again, and every request in the history."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from sqlalchemy import text

from steersman.storage.engine import make_engine
from tests.conftest import wait_until
from tests.control.serve.serving import running, settings_for

pytestmark = pytest.mark.vllm
SENT = 36


async def stream_one(client: httpx.AsyncClient, k: int, delay: float) -> str:
    """'ok', or 'error' when the stream carried an error event or the request was refused."""
    await asyncio.sleep(delay)
    body = {
        "model": "tiny",
        "prompt": f"Count to {k}.",
        "max_tokens": 60 + 5 * (k % 8),
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            assert response.json()["error"]["message"]  # a clear error, OpenAI's shape
            return "error"
        outcome = "cut"
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return outcome if outcome == "error" else "ok"
            if line.startswith("data: {") and "error" in json.loads(line[6:]):
                assert json.loads(line[6:])["error"]["message"]
                outcome = "error"
        return outcome


def test_sigkill_one_server_under_load(vllm_servers, tiny_model, tmp_path):
    victim = vllm_servers[1]
    instances = [
        {"name": f"vllm-{k}", "url": s.url, "profile": "cpu-tiny", "max_in_flight": 4}
        for k, s in enumerate(vllm_servers)
    ]
    settings = settings_for(
        tmp_path,
        instances,
        gateway={"read_timeout_s": 30},
        service={"health_interval_s": 0.5},
        dispatch={"policy": "round-robin"},  # the victim surely gets its share
        predictor={"tokenizer_dir": str(tiny_model)},
    )
    outcomes: list[str] = []
    with running(settings) as (daemon, url):

        async def load() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=90) as client:
                results = await asyncio.gather(
                    *(stream_one(client, k, k * 0.3) for k in range(SENT))
                )
            outcomes.extend(results)

        sender = threading.Thread(target=lambda: asyncio.run(load()))
        sender.start()
        core = daemon.service.scheduler
        wait_until(
            lambda: any(produced > 0 for produced in core.running("vllm-1").values()),
            60,
            "a request streaming from the victim",
        )
        victim.kill()
        wait_until(lambda: not daemon.service.instances["vllm-1"].healthy, 30, "victim marked down")
        sender.join(180)
        assert not sender.is_alive(), "a request hung past its deadline"
        retries = daemon.service.metrics.retries._value.get()
        victim.start()
        victim.wait_healthy(timeout_s=600)
        wait_until(lambda: daemon.service.instances["vllm-1"].healthy, 30, "victim readmitted")
        state = httpx.get(f"{url}/admin/state").json()
        assert all(i["healthy"] for i in state["instances"])
        assert daemon.writer.flush(30)
        engine = make_engine(settings.database_url)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT instance, error FROM requests")).all()
            events = conn.execute(
                text("SELECT reason FROM controller_events WHERE kind = 'instance'")
            ).all()
        engine.dispose()
    counts = {o: outcomes.count(o) for o in ("ok", "error", "cut")}
    print(f"instance failure: sent {SENT}, {counts}, retried {retries:.0f}, rows {len(rows)}")
    assert len(outcomes) == SENT and counts["cut"] == 0  # every stream ended in [DONE]
    assert counts["error"] >= 1  # the streams cut by the kill said so
    assert counts["ok"] >= SENT // 2
    assert len(rows) == SENT  # every request, served or not, has its row
    assert sum(1 for r in rows if r.error) == counts["error"]
    assert any("vllm-1 marked down" in r.reason for r in events)
    assert any("vllm-1 readmitted" in r.reason for r in events)
