"""`steersman replay`: send a real workload to any OpenAI-compatible endpoint and measure it."""

from __future__ import annotations

import asyncio
import json
import random
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.harness.prefix import (
    conversations,
    load_hashed_trace,
    mooncake_items,
    work_items,
)
from steersman.control.harness.replay import outcome_records, replay, summarize
from steersman.control.harness.workloads import (
    WorkItem,
    build_workload,
    gamma_arrivals,
    load_trace,
    poisson_arrivals,
    trace_arrivals,
)
from steersman.control.serve.settings import Settings
from steersman.control.training.tiny_model import served_model
from steersman.data import PROMPT_SETS, TRACES, path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.tokens import TokenCounter


class Workload(StrEnum):
    prompts = "prompts"
    multiturn = "multiturn"
    mooncake_hashes = "mooncake_hashes"


class Arrivals(StrEnum):
    trace = "trace"
    poisson = "poisson"
    gamma = "gamma"


def replay_command(
    ctx: typer.Context,
    base_url: Annotated[
        str, typer.Option(help="Root URL of the endpoint (a vLLM server, or steersman).")
    ],
    model: Annotated[str, typer.Option(help="Model name to request.")] = "tiny",
    workload: Annotated[
        Workload,
        typer.Option(
            help="Independent prompts; multi-turn chats that resend their history (chat "
            "completions); or the hashed Mooncake trace, each hash id a fixed block of "
            "--block-tokens token ids (its own arrival shape at --rate)."
        ),
    ] = Workload.prompts,
    turns: Annotated[int, typer.Option(help="multiturn: turns per chat.", min=1)] = 4,
    block_tokens: Annotated[
        int, typer.Option(help="mooncake_hashes: tokens a hash id (512 in the trace).", min=1)
    ] = 16,
    rate: Annotated[float, typer.Option(help="Mean request rate, requests/s.", min=0.001)] = 1.0,
    requests: Annotated[int, typer.Option(help="Number of requests.", min=1)] = 100,
    arrivals: Annotated[Arrivals, typer.Option(help="Arrival process.")] = Arrivals.trace,
    trace: Annotated[
        str, typer.Option(help=f"Trace for --arrivals trace: {', '.join(TRACES)}.")
    ] = "azure_conv",
    cv: Annotated[float, typer.Option(help="Coefficient of variation for gamma arrivals.")] = 2.0,
    prompts: Annotated[
        str, typer.Option(help=f"Comma-separated prompt sets: {', '.join(PROMPT_SETS)}.")
    ] = "alpaca,codealpaca,alpaca_eval",
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Served model directory whose tokenizer counts the true lengths "
            "(default: the tiny demo model)."
        ),
    ] = None,
    max_model_len: Annotated[int, typer.Option(help="The served model's window.")] = 1024,
    max_tokens_cap: Annotated[int | None, typer.Option(help="Cap on any request's length.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals and the prompt draw.")] = 0,
    vllm: Annotated[
        bool, typer.Option(help="The endpoint is vLLM (per-token usage, priority).")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    out: Annotated[Path | None, typer.Option(help="Write one JSON line per request here.")] = None,
) -> None:
    """Replay real prompts at real (time-scaled) arrival times with max_tokens = true length and
    ignore_eos, and report TTFT, TPOT, E2E, QoE and failures."""
    settings: Settings = ctx.obj.settings()
    rng = random.Random(seed)
    model_dir = tokenizer or served_model(settings.data_dir)
    if workload is not Workload.prompts:
        items = _prefix_workload(
            workload, TokenCounter(model_dir), requests, rate, turns, block_tokens,
            max_model_len, seed, prompts,
        )  # fmt: skip
    else:
        items = _independent(
            arrivals, trace, requests, rate, cv, rng, prompts, model_dir, max_model_len,
            max_tokens_cap,
        )  # fmt: skip

    async def go():
        backend = VllmHttpBackend("target", base_url, vllm=vllm)
        try:
            return await replay(items, backend, model=model)
        finally:
            await backend.aclose()

    started = time.monotonic()
    outcomes = asyncio.run(go())
    summary = summarize(outcomes, time.monotonic() - started)
    if out is not None:
        out.write_text("".join(json.dumps(r) + "\n" for r in outcome_records(outcomes)))
    if as_json:
        typer.echo(json.dumps(summary))
        return
    table = Table("metric", "mean", "p50", "p95", "p99", title=f"replay of {len(items)} requests")
    for name in ("ttft_s", "tpot_s", "e2e_s", "qoe"):
        row = summary[name]
        table.add_row(
            name,
            *("-" if row[k] is None else f"{row[k]:.4f}" for k in ("mean", "p50", "p95", "p99")),
        )
    console = Console()
    console.print(table)
    console.print(
        f"succeeded {summary['succeeded']}/{summary['requests']}, exact lengths "
        f"{summary['exact_lengths']}, {summary['throughput_rps']} req/s",
        markup=False,
    )
    for error in summary["errors"]:
        console.print(f"error: {error}", markup=False)


def _records(prompts: str) -> list:
    records = []
    for name in (p.strip() for p in prompts.split(",") if p.strip()):
        if name not in PROMPT_SETS:
            raise typer.BadParameter(
                f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}",
                param_hint="--prompts",
            )
        records.extend(load_prompt_set(path(name))[0])
    return records


def _prefix_workload(
    workload, counter, requests, rate, turns, block_tokens, max_model_len, seed, prompts
) -> list[WorkItem]:
    if workload is Workload.multiturn:
        chats = conversations(
            _records(prompts),
            counter,
            count=max(1, -(-requests // turns)),
            turns=turns,
            think_s=2.0,
            max_model_len=max_model_len,
            seed=seed,
        )
        return work_items(chats[:requests], "multiturn", rate=rate)
    hashed = load_hashed_trace(path("mooncake_hashes"))
    raw, refused = mooncake_items(hashed, requests, block_tokens, max_model_len, tokens=True)
    if refused:
        typer.echo(
            f"{len(refused)} requests over the {max_model_len}-token window left out (vLLM "
            f"would refuse them), trace lines {refused[:5]}...",
            err=True,
        )
    return work_items(raw, "mooncake", rate=rate)


def _independent(
    arrivals, trace, requests, rate, cv, rng, prompts, model_dir, max_model_len, max_tokens_cap
) -> list[WorkItem]:
    if arrivals is Arrivals.trace:
        loaded = load_trace(path(trace))
        times = trace_arrivals(loaded, requests, rate, rng)
    elif arrivals is Arrivals.poisson:
        times = poisson_arrivals(requests, rate, rng)
    else:
        times = gamma_arrivals(requests, rate, cv, rng)
    records = _records(prompts)
    return build_workload(
        records,
        times,
        TokenCounter(model_dir),
        rng,
        max_model_len=max_model_len,
        max_tokens_cap=max_tokens_cap,
    )
