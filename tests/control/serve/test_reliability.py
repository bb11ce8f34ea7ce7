"""Faults survived and nothing lost: database outages under load, a daemon killed mid-flight,
failing telemetry, NaN predictions; prompts kept out of logs (and out of the history on request)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
import sqlite3
import subprocess
import threading
import time

import httpx
import pytest
from sqlalchemy import text

from steersman.control.backends.vllm_server import free_port
from steersman.control.serve.predictor import Predictor
from steersman.learners.batching import MicroBatcher
from steersman.storage.engine import make_engine
from tests.conftest import count, wait_until
from tests.control.serve.serving import running, settings_for
from tests.control.serve.test_daemon import start, write_config
from tests.control.serve.test_service import complete, service, sim

SIMS = [{"name": "sim-a", "sim": "cpu-tiny"}, {"name": "sim-b", "sim": "cpu-tiny"}]
MODEL = "steersman-sim"


async def load(url: str, n: int, tag: str, rate: float = 20.0) -> list[int]:
    """``n`` requests at ``rate`` per second; their HTTP statuses."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(k: int) -> int:
            await asyncio.sleep(k / rate)
            body = {"model": MODEL, "prompt": f"{tag} question {k}?", "max_tokens": 5 + k % 7}
            return (await client.post("/v1/completions", json=body)).status_code

        return list(await asyncio.gather(*(one(k) for k in range(n))))


@pytest.mark.postgres
def test_postgres_backends_terminated_under_load(tmp_path, pg_fresh_url, pg_admin):
    settings = settings_for(
        tmp_path, SIMS, storage={"url": pg_fresh_url, "retry_max_s": 0.5, "queue_size": 50}
    )
    with running(settings) as (daemon, url):
        result: list[int] = []
        sender = threading.Thread(target=lambda: result.extend(asyncio.run(load(url, 80, "pg"))))
        sender.start()
        pg_admin.cut_off(pg_fresh_url)  # new connections refused, existing ones killed
        sender.join(120)
        assert daemon.writer.stats.spilled + daemon.writer.stats.retries > 0
        pg_admin.restore(pg_fresh_url)
        assert daemon.writer.flush(60)
    assert result == [200] * 80  # no client request failed
    engine = make_engine(pg_fresh_url)
    assert count(engine) == 80
    engine.dispose()


def test_sqlite_locked_for_ten_seconds_under_load(tmp_path):
    db = tmp_path / "history.db"
    settings = settings_for(
        tmp_path,
        SIMS,
        storage={"url": f"sqlite:///{db}", "sqlite_busy_timeout_ms": 100, "retry_max_s": 0.5},
    )
    with running(settings) as (daemon, url):
        blocker = sqlite3.connect(db, timeout=30)
        blocker.execute("BEGIN EXCLUSIVE")  # nobody else may read or write
        locked_at = time.monotonic()
        statuses = asyncio.run(load(url, 60, "lock"))
        assert daemon.writer.stats.retries > 0
        time.sleep(max(0.0, 10 - (time.monotonic() - locked_at)))  # the outage lasts 10 s
        blocker.rollback()
        blocker.close()
        assert daemon.writer.flush(60)
    assert statuses == [200] * 60
    engine = make_engine(f"sqlite:///{db}")
    assert count(engine) == 60
    engine.dispose()


def test_sigkill_then_restart_restores_state_and_replays_spilled_rows(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path, port)
    config.write_text(
        config.read_text()
        + "\n[storage]\nqueue_size = 1\nsqlite_busy_timeout_ms = 50\nretry_max_s = 0.2\n"
    )
    db = tmp_path / "data" / "steersman.db"
    checkpoint = tmp_path / "data" / "checkpoints" / "state.pkl"
    log = tmp_path / "serve.log"
    proc = start(config, url, log)
    try:
        assert asyncio.run(load(url, 10, "before")) == [200] * 10
        seen = httpx.get(f"{url}/admin/state").json()["predictor"]["n"]
        written = checkpoint.stat().st_mtime if checkpoint.exists() else 0.0

        def newer_checkpoint() -> bool:
            return checkpoint.exists() and checkpoint.stat().st_mtime > written

        wait_until(newer_checkpoint, 10, "a checkpoint after the first requests")
        # Rows are written behind the requests: on a busy machine one of these could still be
        # queued when the database goes away, and would spill with the outage's.
        engine = make_engine(f"sqlite:///{db}")
        wait_until(lambda: count(engine) == 10, 30, "the rows before the outage to be committed")
        # The database goes away: the next rows can only spill (the queue holds one).
        blocker = sqlite3.connect(db, timeout=30)
        blocker.execute("BEGIN EXCLUSIVE")
        assert asyncio.run(load(url, 10, "during")) == [200] * 10

        def spilled_requests() -> int:
            lines = []
            for file in (tmp_path / "data" / "spill").glob("*.jsonl"):
                try:
                    lines += file.read_text().splitlines()
                except FileNotFoundError:  # renamed for a replay attempt meanwhile: look again
                    return -1
            try:
                return sum(1 for line in lines if json.loads(line)["table"] == "requests")
            except json.JSONDecodeError:  # a line being appended right now: look again
                return -1

        # Rows reach the spill file a flush interval after their request; what the kill may
        # lose is only what has not: wait until all ten are on disk, then kill.
        wait_until(lambda: spilled_requests() == 10, 60, "the rows of the outage to spill")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        blocker.rollback()
        blocker.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert count(engine) == 10  # rows committed before the outage are intact
    proc = start(config, url, log)
    try:
        state = httpx.get(f"{url}/admin/state").json()
        assert state["predictor"]["n"] >= seen  # learned state came back from the checkpoint

        def replayed() -> bool:
            return count(engine) == 20

        wait_until(replayed, 30, "the spilled rows to be replayed")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        engine.dispose()


def test_failing_telemetry_and_nan_predictions_do_not_stop_the_loop():
    def broken() -> dict:
        raise RuntimeError("NVML exploded")

    async def main():
        batcher = MicroBatcher(lambda texts: [math.nan] * len(texts))
        svc, record = service(
            [sim("a")], predictor=Predictor(batcher, deadline_s=1.0), telemetry=broken
        )
        try:
            chunks = await complete(svc, "r1", 4)
        finally:
            batcher.close()
        return record, chunks, batcher

    record, chunks, batcher = asyncio.run(main())
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    row = record.rows["requests"][0]
    assert row["error"] is None and row["predictor_path"] == "fast"  # NaN: not used as a base
    assert math.isfinite(row["scheduled_prediction"]) and row["base_prediction"] is None
    assert batcher.stats.invalid == 1
    assert not any(k.startswith("gpu_") for k in row["features"])


def test_prompts_stay_out_of_logs_and_optionally_out_of_the_history(tmp_path, caplog):
    secret = "the-launch-code-is-0451"
    settings = settings_for(tmp_path, SIMS, storage={"store_prompts": False}, log_level="DEBUG")
    caplog.set_level(logging.DEBUG)
    with running(settings) as (daemon, url):
        client = httpx.Client(base_url=url, timeout=30)
        body = {"model": MODEL, "prompt": f"Tell me {secret}", "max_tokens": 3}
        assert client.post("/v1/completions", json=body).status_code == 200
        bad = {"model": "nope", "prompt": f"Tell me {secret}", "max_tokens": 3}
        assert client.post("/v1/completions", json=bad).status_code == 404
        assert daemon.writer.flush(10)
    assert secret not in caplog.text
    engine = make_engine(settings.database_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT prompt_text, prompt_sha256, features FROM requests")).all()
    engine.dispose()
    assert len(rows) == 2
    for prompt_text, sha, features in rows:
        assert prompt_text is None and len(sha) == 64
        assert secret not in str(features)


def test_config_show_never_prints_secrets(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text(
        '[gateway]\napi_keys = ["sk-live-123"]\nadmin_api_keys = ["adm-456"]\n'
        '[storage]\nurl = "postgresql://ops:hunter2@db:5432/prod"\n'
        '[[instances]]\nurl = "http://gpu1:8000"\napi_key = "inst-789"\n'
    )
    import sys
    from pathlib import Path

    steersman = str(Path(sys.executable).with_name("steersman"))
    shown = subprocess.run(
        [steersman, "--config", str(config), "config", "show"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    for secret in ("sk-live-123", "adm-456", "hunter2", "inst-789"):
        assert secret not in shown.stdout + shown.stderr
    assert "***" in shown.stdout


def test_defaults_bind_loopback():
    settings = settings_for(__import__("pathlib").Path("/tmp"), [])
    assert settings.gateway.host == "127.0.0.1"
    assert settings.dashboard.host == "127.0.0.1"
