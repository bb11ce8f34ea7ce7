"""Two steersman replicas in front of the same two vLLM CPU servers, with one PostgreSQL history:
one is stopped mid-load (as Kubernetes stops a pod: SIGTERM, then it drains); the client sends
what could not start to the other. Nothing is lost, nothing hangs, every answer has its row."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from types import SimpleNamespace

import httpx
import pytest
import tomli_w
from sqlalchemy import text

from steersman.storage.engine import make_engine
from steersman.storage.spill import SpillDir
from tests.conftest import free_port
from tests.control.serve.test_daemon import start

pytestmark = [pytest.mark.vllm, pytest.mark.postgres]

REQUESTS = 36


def _replica(tmp_path, name: str, servers, tokenizer, db_url: str) -> tuple[str, subprocess.Popen]:
    port = free_port()
    config = {
        "data_dir": str(tmp_path / name),
        "replica": name,
        "log_level": "INFO",
        "telemetry": {"enabled": False, "scrape_interval_s": 0.25},
        "storage": {"url": db_url, "flush_interval_s": 0.2},
        "gateway": {"port": port, "drain_timeout_s": 60},
        "predictor": {"tokenizer_dir": str(tokenizer)},
        "instances": [
            {"name": f"vllm-{k}", "url": s.url, "profile": "cpu-tiny", "max_in_flight": 3}
            for k, s in enumerate(servers)
        ],
    }
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps(config))
    url = f"http://127.0.0.1:{port}"
    return url, start(path, url, tmp_path / f"{name}.log")


async def _listening(client: httpx.AsyncClient, url: str) -> bool:
    try:
        await client.get(f"{url}/health", headers={"connection": "close"})
    except httpx.TransportError:
        return False
    return True


def test_stopping_one_replica_under_load_loses_nothing(
    vllm_servers, tiny_model, tmp_path, pg_fresh_url
):
    replicas = [_replica(tmp_path, f"r{k}", vllm_servers, tiny_model, pg_fresh_url) for k in (0, 1)]
    urls = [url for url, _ in replicas]
    stopping = replicas[0][1]
    answered: dict[int, str] = {}
    retried: list[int] = []

    async def one(client: httpx.AsyncClient, k: int) -> None:
        body = {"model": "tiny", "prompt": f"Item {k}: tell a story.", "max_tokens": 24,
                "ignore_eos": True}  # fmt: skip
        for attempt in range(4):  # the replica this client prefers, then the other
            url = urls[(k + attempt) % 2]
            try:
                r = await client.post(f"{url}/v1/completions", json=body)
            except httpx.TransportError:  # the replica is gone: it never started this one
                retried.append(k)
                continue
            assert r.status_code == 200, r.text
            answered[k] = r.json()["id"]
            assert r.json()["usage"]["completion_tokens"] == 24
            return
        raise AssertionError(f"request {k} found no replica")

    async def load() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5)) as client:
            first = [asyncio.create_task(one(client, k)) for k in range(REQUESTS // 2)]
            while len(answered) < 6:
                await asyncio.sleep(0.05)  # polls the client's own progress, not the server's
            stopping.send_signal(signal.SIGTERM)  # under load: some of r0's requests in flight
            while await _listening(client, urls[0]):  # it stops taking new ones, then drains
                await asyncio.sleep(0.05)
            rest = [asyncio.create_task(one(client, k)) for k in range(REQUESTS // 2, REQUESTS)]
            await asyncio.gather(*first, *rest)

    try:
        asyncio.run(load())
        assert stopping.wait(90) == 0  # drained and flushed
    finally:
        for _, proc in replicas:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(90)
    assert sorted(answered) == list(range(REQUESTS))  # 0 lost, none hung
    assert retried  # some did meet the stopped replica, and went to the other
    engine = make_engine(pg_fresh_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT request_id, actual_tokens, error FROM requests")
        ).fetchall()
        replicas_saved = {r[0] for r in conn.execute(text("SELECT replica FROM checkpoints"))}
    engine.dispose()
    by_id = {r.request_id: r for r in rows}
    # A replica that cannot reach the history in time (a busy machine) spills its rows to its
    # data directory, to be replayed when it starts again: kept, not lost.
    for replica in ("r0", "r1"):
        spill = tmp_path / replica / "spill"
        for file in sorted({*SpillDir(spill).pending(), *spill.glob("*.jsonl")}):
            for line in SpillDir.read(file):
                if line.table == "requests" and line.row is not None:
                    by_id.setdefault(line.row["request_id"], SimpleNamespace(**line.row))
    assert set(answered.values()) <= set(by_id)  # every answer has its row
    assert all(by_id[i].actual_tokens == 24 and by_id[i].error is None for i in answered.values())
    assert replicas_saved == {"r0", "r1"}
