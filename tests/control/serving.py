"""A real steersman daemon (uvicorn on a loopback port) in a thread, for gateway tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from steersman.control.daemon import Daemon
from steersman.control.settings import Settings, load_settings
from tests.conftest import free_port, wait_until


def settings_for(tmp_path: Path, instances: list[dict[str, Any]], **extra: Any) -> Settings:
    overrides: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "telemetry": {"enabled": False},
        "instances": instances,
    }
    for key, value in extra.items():
        overrides[key] = {**overrides.get(key, {}), **value} if isinstance(value, dict) else value
    return load_settings(None, overrides, environ={})


@contextmanager
def running(settings: Settings) -> Iterator[tuple[Daemon, str]]:
    """The daemon serving on a free port; stopped (drained, checkpointed, flushed) on exit."""
    daemon = Daemon(settings)
    port = free_port()
    config = uvicorn.Config(daemon.app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="steersman-test-server", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, "the gateway to start")
    assert server.started, "the gateway did not start"
    try:
        yield daemon, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "the gateway did not stop"
