"""`steersman serve` as operators run it: a subprocess, drained by SIGTERM, restored on restart."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import tomli_w
from sqlalchemy import text

from steersman.storage.engine import make_engine
from tests.conftest import free_port, wait_until

STEERSMAN = str(Path(sys.executable).with_name("steersman"))
MODEL = "steersman-sim"


def write_config(tmp_path: Path, port: int) -> Path:
    config = {
        "data_dir": str(tmp_path / "data"),
        "log_level": "INFO",
        "telemetry": {"enabled": False},
        "gateway": {"port": port, "drain_timeout_s": 20},
        "jobs": {"checkpoint_interval_s": 0.5},
        "instances": [
            {"name": "sim-a", "sim": "cpu-tiny"},
            {"name": "sim-b", "sim": "cpu-tiny", "max_in_flight": 4},
        ],
    }
    path = tmp_path / "steersman.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def start(config: Path, url: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [STEERSMAN, "--config", str(config), "serve"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "steersman serve to answer /health")
    return proc


def test_sigterm_drains_in_flight_requests_and_restart_restores_state(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path, port)
    log = tmp_path / "serve.log"
    proc = start(config, url, log)
    try:
        client = httpx.Client(base_url=url, timeout=30)
        for k in range(6):
            body = {"model": MODEL, "prompt": f"Say {k} things.", "max_tokens": 4 + k}
            assert client.post("/v1/completions", json=body).status_code == 200
        learned = client.get("/admin/state").json()["predictor"]["n"]
        assert learned == 6

        streamed: list[bytes] = []
        first = threading.Event()

        def long_request() -> None:
            body = {
                "model": MODEL,
                "prompt": "Tell a long story.",
                "max_tokens": 300,
                "stream": True,
            }
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line:
                        streamed.append(line.encode())
                    first.set()

        reader = threading.Thread(target=long_request)
        reader.start()
        assert first.wait(30)
        proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    # The in-flight stream finished completely during the drain.
    assert streamed[-1] == b"data: [DONE]"
    assert sum(1 for line in streamed if line.startswith(b"data: {")) == 300
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'steersman.db'}")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT actual_tokens, error FROM requests")).all()
    engine.dispose()
    assert len(rows) == 7 and all(r.error is None for r in rows)
    assert sorted(r.actual_tokens for r in rows)[-1] == 300
    assert (tmp_path / "data" / "checkpoints" / "state.pkl").exists()

    proc = start(config, url, log)
    try:
        state = httpx.get(f"{url}/admin/state", timeout=10).json()
        assert state["predictor"]["n"] == 7  # the corrector came back from the checkpoint
        assert state["mode"] == "NORMAL"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    # The INFO log is steersman's own: uvicorn's start-up lines and the libraries' are below
    # the default `log_libraries = "WARNING"`.
    info = [line for line in log.read_text().splitlines() if "INFO" in line]
    assert any(" INFO steersman." in line and "serving 2 instance(s)" in line for line in info)
    assert [line for line in info if " INFO steersman." not in line] == []
