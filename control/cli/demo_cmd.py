"""`steersman demo`: the whole loop working on a machine with no GPU, in minutes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from steersman.control.backends.vllm_server import ServerFailed, SetupError
from steersman.control.backends.vllm_server import vllm_python as checked_vllm_python
from steersman.control.cli.progress import StepProgress
from steersman.control.serve.settings import Settings
from steersman.control.training.tiny_model import served_model
from steersman.learners.tokens import TokenCounter

if TYPE_CHECKING:
    from steersman.control.harness.replay import Replayed
    from steersman.control.serve.daemon import Daemon


class BackendKind(StrEnum):
    vllm = "vllm"
    sim = "sim"


class Front(StrEnum):
    gateway = "gateway"
    envoy = "envoy"


PolicyName = StrEnum(  # type: ignore[misc]
    "PolicyName",
    {
        p.replace("-", "_"): p
        for p in ("predictive", "least-load", "round-robin", "random", "oracle")
    },
)


def demo_command(
    ctx: typer.Context,
    backend: Annotated[
        BackendKind, typer.Option(help="Two vLLM CPU servers, or two simulated instances.")
    ] = BackendKind.vllm,
    duration: Annotated[
        float, typer.Option(help="Seconds of trace to replay.", min=5, max=3600)
    ] = 120.0,
    rate: Annotated[float, typer.Option(help="Mean request rate, requests/s.", min=0.1)] = 2.0,
    policy: Annotated[PolicyName, typer.Option(help="Dispatch policy.")] = PolicyName.predictive,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals and the prompt draw.")] = 0,
    vllm_python: Annotated[
        str,
        typer.Option(
            envvar="STEERSMAN_VLLM_PYTHON",
            help="Python of the vLLM CPU environment (scripts/install_vllm_cpu.sh).",
        ),
    ] = ".vllm-venv/bin/python",
    train_budget: Annotated[
        float, typer.Option(help="Most seconds to train the length model, the first time.")
    ] = 180.0,
    front: Annotated[
        Front,
        typer.Option(
            help="What clients reach: steersman's gateway, or a real Envoy with "
            "steersman as its endpoint picker (vLLM servers only)."
        ),
    ] = Front.gateway,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Build the models, start two servers and the daemon, replay a real trace with real
    prompts, show live progress and a summary; stop everything it started."""
    from steersman.control.harness.demo import (  # the daemon's imports, only for this command
        DemoConfig,
        demo_workload,
        run_demo,
    )
    from steersman.control.serve.daemon import GatewayFailed
    from steersman.control.training.bundled import ensure_length_model

    settings: Settings = ctx.obj.settings()
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if front is Front.envoy and backend is not BackendKind.vllm:
        console.print("error: --front envoy needs --backend vllm: Envoy routes to real servers")
        raise typer.Exit(2)
    if backend is BackendKind.vllm:
        try:
            vllm_python = str(checked_vllm_python(vllm_python))
        except SetupError as exc:
            console.print(f"error: {exc} (or run `steersman demo --backend sim`)", markup=False)
            raise typer.Exit(2) from None
    data_dir = settings.data_dir
    console.print("building or reusing the tiny served model ...", markup=False)
    model_dir = served_model(data_dir)
    counter = TokenCounter(model_dir)
    with StepProgress(console, "length model", info="cached or training") as progress:

        def tick(step: int, total: int, info: dict) -> None:
            progress.update(completed=step, total=total, info=f"loss {info['loss']:.3f}")

        demo_model = ensure_length_model(data_dir, counter, budget_s=train_budget, progress=tick)
    length_model = demo_model.directory
    verb = "trained" if demo_model.trained_now else "reusing"
    console.print(f"length model: {verb} {length_model}, {demo_model.describe()}", markup=False)
    items = demo_workload(counter, rate, duration, seed)
    run_dir = data_dir / "demo" / f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{backend.value}"
    # The servers share the machine's cores with the daemon: at nice 10 the length model's few
    # milliseconds per request do not wait behind decode steps (they would miss the deadline).
    config = DemoConfig(
        backend.value, run_dir, model_dir, length_model, vllm_python, policy.value,
        front=front.value, server_nice=10,
    )  # fmt: skip
    console.print(
        f"starting {backend.value} instances and the daemon; replaying {len(items)} requests "
        f"over {duration:g} s at {rate:g} req/s",
        markup=False,
    )
    with StepProgress(console, "requests", total=len(items), info="starting") as progress:
        state: dict[str, Daemon] = {}
        failed = 0

        def done(outcome: Replayed) -> None:
            nonlocal failed
            failed += 0 if outcome.ok else 1
            info = ""
            if "daemon" in state:
                # The daemon serves on its own thread: read single values, never walk its
                # containers (they change under a reader here).
                core = state["daemon"].service.scheduler
                score = getattr(core.corrector, "score", None)
                within = score.hit_rate.get() if score is not None and score.count else None
                info = (
                    f"mode {core.state.mode}  queue {core.depth}  "
                    f"within-30% {'-' if within is None else f'{within:.2f}'}  failed {failed}"
                )
            progress.update(advance=1, info=info)

        try:
            summary = run_demo(
                config,
                settings,
                items,
                on_outcome=done,
                on_serving=lambda d: state.update(daemon=d),
            )
        except (SetupError, ServerFailed, GatewayFailed) as exc:
            progress.remove()  # nothing ran: no progress to show
            error = exc
        else:
            error = None
    if error is not None:
        console.print(f"error: {error}", markup=False)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    _print_summary(Console(), summary)


def _print_summary(console: Console, s: dict) -> None:
    title = f"steersman demo ({s['backend']}, {s['policy']}, through {s['front']})"
    table = Table("", "value", title=title)
    p = s["prediction"]
    rows = [
        ("requests", f"{s['succeeded']}/{s['requests']} succeeded, {s['failed']} failed"),
        ("TTFT P50 / P99 (s)", f"{s['ttft_p50_s']} / {s['ttft_p99_s']}"),
        ("E2E P50 / P99 (s)", f"{s['e2e_p50_s']} / {s['e2e_p99_s']}"),
        ("QoE mean", str(s["qoe_mean"])),
        ("predictions within 30%", f"{p['within_30']} of {p['scored']} (MAE {p['mae_tokens']})"),
        ("predictor paths", ", ".join(f"{k}: {v}" for k, v in sorted(p["paths"].items()))),
        ("fallbacks", str(p["fallbacks"])),
        ("compensation changes", str(p["compensation_changes"])),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for error in s["errors"]:
        console.print(f"error: {error}", markup=False)
    console.print(f"history: {s['database']}", markup=False)
    console.print(f"dashboard: {s['dashboard']}", markup=False)
