"""`steersman calibrate`: fit the simulator's step-time model to a live vLLM instance."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated

import httpx
import typer

from steersman.control.harness.calibrate import busy_clock_mhz, measure_and_fit
from steersman.telemetry.gpus import make_sampler
from steersman.telemetry.settings import TelemetrySettings
from steersman.telemetry.vllm_metrics import ScrapeError, scrape


def calibrate_command(
    base_url: Annotated[str, typer.Option(help="Root URL of the vLLM server.")],
    out: Annotated[Path, typer.Option(help="Profile file to write.")] = Path("profile.json"),
    name: Annotated[str, typer.Option(help="Profile name.")] = "calibrated",
    model: Annotated[str, typer.Option(help="Served model name.")] = "tiny",
    max_model_len: Annotated[int, typer.Option(help="The server's --max-model-len.")] = 1024,
    repeats: Annotated[
        int, typer.Option(min=1, help="Measurements per point; their median is fitted.")
    ] = 3,
    gpu: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="NVML index of the GPU the server runs on: the profile keeps the SM clock it "
            "held while busy (the latency model's reference clock).",
        ),
    ] = None,
) -> None:
    """Measure prefill, decode and join times and write a simulator profile (JSON)."""
    rows: list[dict] = []
    sampler = None
    if gpu is not None:
        sampler = make_sampler(TelemetrySettings(), sink=rows.append)
        status = sampler.start()
        if not status.available or gpu >= status.gpus:
            sampler.stop()
            reason = status.reason if not status.available else f"{status.gpus} GPU(s) found"
            typer.echo(
                f"calibration failed: --gpu {gpu}: cannot read that GPU ({reason})", err=True
            )
            raise typer.Exit(1)

    async def capacity() -> int:
        async with httpx.AsyncClient() as client:
            metrics = await scrape(client, base_url, timeout_s=5.0)
        if not metrics.num_gpu_blocks or not metrics.block_size:
            return 8192
        return metrics.num_gpu_blocks * metrics.block_size // 16  # in 16-token blocks

    try:
        blocks = asyncio.run(capacity())
        profile, samples = measure_and_fit(
            base_url, model, name, num_blocks=blocks, max_model_len=max_model_len, repeats=repeats
        )
    except (ScrapeError, RuntimeError) as exc:
        typer.echo(f"calibration failed: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        if sampler is not None:
            sampler.stop()
    if gpu is not None:
        clock = busy_clock_mhz(rows, gpu)
        if clock is None:
            typer.echo(
                f"GPU {gpu} was never busy while measured: the profile keeps the boost clock",
                err=True,
            )
        else:
            profile = replace(profile, clock_mhz=round(clock, 1))
    profile.save(out)
    typer.echo(
        json.dumps({"profile": asdict(profile), "samples": [asdict(s) for s in samples]}, indent=1)
    )
