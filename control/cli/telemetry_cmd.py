"""`steersman telemetry`: live GPU readings per GPU, like a small `nvidia-smi dmon`."""

from __future__ import annotations

import json
import threading
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from steersman.control.serve.settings import Settings
from steersman.telemetry.gpus import make_sampler
from steersman.telemetry.readings import GpuReading


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}"


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(readings: dict[int, GpuReading]) -> Table:
    table = Table(
        "gpu",
        "method",
        "sm%",
        "occ%",
        "temp C",
        "sm MHz",
        "power W",
        "mem GiB",
        "throttle",
        "errors",
    )
    for index, r in sorted(readings.items()):
        mem = (
            f"{r.memory_used_bytes / 2**30:.1f}/{r.memory_total_bytes / 2**30:.0f}"
            if r.memory_used_bytes is not None and r.memory_total_bytes
            else "-"
        )
        table.add_row(
            str(index),
            r.method,
            _pct(r.sm_activity),
            _pct(r.sm_occupancy),
            _num(r.temperature_c),
            _num(r.sm_clock_mhz),
            _num(r.power_w, "{:.1f}"),
            mem,
            "-" if r.throttle_reasons is None else hex(r.throttle_reasons),
            ",".join(r.errors) or "-",
        )
    return table


def telemetry(
    ctx: typer.Context,
    once: Annotated[
        bool, typer.Option("--once", help="Print one reading per GPU and exit.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    seconds: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: until Ctrl-C).")
    ] = None,
) -> None:
    """Live GPU readings; says plainly when no GPU telemetry is available (exit 0 either way)."""
    settings: Settings = ctx.obj.settings()
    sampler = make_sampler(settings.telemetry)
    status = sampler.start()
    out = Console(soft_wrap=True)
    if not status.available:
        if as_json:
            typer.echo(json.dumps({"available": False, "reason": status.reason}))
        else:
            out.print(f"no GPU telemetry available: {status.reason}", markup=False)
        sampler.stop()
        return
    pause = threading.Event()
    try:
        # The first SM activity needs a GPM pair gpm_span_s apart: wait for it on every GPU
        # (bounded, so a GPU whose readings fail still gets printed, with its errors).
        t = settings.telemetry
        deadline = time.monotonic() + max(2.0, 10 * (t.gpm_span_s + t.period_s))
        while time.monotonic() < deadline:
            latest = sampler.latest()
            if len(latest) == status.gpus and all(
                r.sm_activity is not None or r.errors for r in latest.values()
            ):
                break
            pause.wait(t.period_s)
        waited = 0.0
        while True:
            readings = sampler.latest()
            if as_json:
                typer.echo(
                    json.dumps(
                        {
                            "available": True,
                            "gpus": [
                                r.as_dict() | {"features": sampler.features(i)}
                                for i, r in sorted(readings.items())
                            ],
                        }
                    )
                )
            else:
                out.print(_table(readings))
            if once or (seconds is not None and waited >= seconds):
                break
            pause.wait(1.0)
            waited += 1.0
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
