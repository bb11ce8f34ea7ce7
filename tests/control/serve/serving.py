"""Settings and a running daemon for gateway tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from steersman.control.serve.daemon import Daemon, serving
from steersman.control.serve.settings import Settings, load_settings


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
    """The daemon serving on a free loopback port; drained, checkpointed and flushed on exit."""
    daemon = Daemon(settings)
    with serving(daemon) as url:
        yield daemon, url
