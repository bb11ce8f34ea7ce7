"""`steersman dashboard`: the Streamlit app on a read-only connection to the SQL history."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

import steersman.dashboard
from steersman.control.serve.settings import Settings

APP = Path(steersman.dashboard.__file__).with_name("app.py")


def streamlit_command(url: str, host: str, port: int, refresh_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.address={host}",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--global.developmentMode=false",
        "--client.toolbarMode=viewer",  # no Deploy button or developer menu for operators
        "--",
        "--db",
        url,
        "--refresh",
        str(refresh_s),
    ]


def dashboard_command(
    ctx: typer.Context,
    db: Annotated[str | None, typer.Option("--db", help="Database URL (storage.url).")] = None,
    host: Annotated[str | None, typer.Option(help="Address (dashboard.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (dashboard.port).", min=0)] = None,
) -> None:
    """Open the monitoring dashboard: mode, predictions, controller, GPUs, instances, models."""
    settings: Settings = ctx.obj.settings(db=db)
    d = settings.dashboard
    command = streamlit_command(
        settings.database_url, host or d.host, d.port if port is None else port, d.refresh_s
    )
    typer.echo(f"dashboard on http://{host or d.host}:{d.port if port is None else port}", err=True)
    sys.stderr.flush()
    # Become Streamlit: a supervisor's SIGTERM then reaches the server itself, leaving no orphan.
    os.execv(command[0], command)
