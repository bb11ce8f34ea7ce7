"""`steersman bench`: policies compared side by side; writes results.json, report.md and plots."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from steersman.control.backends.vllm_server import ServerFailed, SetupError
from steersman.control.backends.vllm_server import vllm_python as checked_vllm_python
from steersman.control.cli.progress import StepProgress
from steersman.control.serve.settings import Settings
from steersman.control.training.tiny_model import served_model
from steersman.learners.tokens import TokenCounter

BUNDLED_TRACES = ("azure_conv", "azure_code", "mooncake")
HASHED = "mooncake_hashes"  # the Mooncake trace with its prefix-block hash ids


class Suite(StrEnum):
    sim = "sim"
    real = "real"
    fleet = "fleet"
    qoe = "qoe"
    all = "all"


class RealWorkload(StrEnum):
    burst = "burst"
    multiturn = "multiturn"
    envoy = "envoy"  # the burst, through the gateway and through Envoy + steersman's picker


class Lengths(StrEnum):
    prompts = "prompts"
    trace = "trace"


def bench_command(
    ctx: typer.Context,
    suite: Annotated[
        Suite,
        typer.Option(
            help="Simulated cluster, real vLLM CPU, simulated fleets whose GPUs differ or slow "
            "down (fleet), streamed QoE side by side (qoe: --profile, default the A30 and the "
            "A100), or all four."
        ),
    ] = Suite.sim,
    out: Annotated[Path, typer.Option(help="Directory for report.md, results.json, plots.")] = (
        Path("bench-out")
    ),
    profile: Annotated[
        list[str] | None,
        typer.Option(help="sim: a profile name or a calibration .json (repeatable)."),
    ] = None,
    trace: Annotated[
        str,
        typer.Option(
            help="sim: arrivals (and with --lengths trace, lengths): azure_conv, azure_code, "
            "mooncake, or a CSV arrival_s,input_tokens,output_tokens; mooncake_hashes: the "
            "Mooncake conversations with their shared prefixes (prefix-aware policies compared)."
        ),
    ] = "azure_conv",
    block_tokens: Annotated[
        int, typer.Option(help="sim, mooncake_hashes: tokens a hash id (512 in the trace).", min=1)
    ] = 64,
    lengths: Annotated[
        Lengths,
        typer.Option(
            help="sim: real held-out prompts with their real response lengths and the length "
            "model's predictions, or the trace's own lengths with predictions that carry the "
            "length model's measured error."
        ),
    ] = Lengths.prompts,
    instances: Annotated[int, typer.Option(help="sim: instances.", min=1)] = 8,
    requests: Annotated[
        int, typer.Option(help="sim: requests of the burst (and the workload's pool).", min=100)
    ] = 5000,
    steady_s: Annotated[
        float,
        typer.Option(
            help="sim: simulated seconds of arrivals at each rate of the capacity search and the "
            "steady levels (steady state, whatever the cluster holds).",
            min=30,
        ),
    ] = 180.0,
    warmup_s: Annotated[
        float, typer.Option(help="sim: the first seconds of each, left out of the figures.", min=0)
    ] = 45.0,
    scenarios: Annotated[
        str, typer.Option(help="sim: steady:LEVEL (share of capacity), burst, gamma2, gamma4.")
    ] = "steady:0.8,steady:0.95,burst,gamma2,gamma4",
    policies: Annotated[
        str,
        typer.Option(
            help="sim: the policies compared, comma-separated (default: all of them, or with "
            "mooncake_hashes the prefix-aware set); least-load is always among them."
        ),
    ] = "",
    slo_ttft: Annotated[float, typer.Option(help="SLO of the capacity: P99 TTFT in s.")] = 1.0,
    goodput_ttft: Annotated[float, typer.Option(help="Goodput: TTFT at most this (s).")] = 1.0,
    goodput_tpot: Annotated[float, typer.Option(help="Goodput: TPOT at most this (s).")] = 0.1,
    real_requests: Annotated[int, typer.Option(help="real: requests in the burst.")] = 200,
    real_seconds: Annotated[float, typer.Option(help="real: seconds they arrive in.")] = 10.0,
    real_repeats: Annotated[int, typer.Option(help="real: repeats of each policy.", min=1)] = 3,
    real_kv_blocks: Annotated[
        int, typer.Option(help="real: KV blocks of 128 tokens per server (memory-bound).", min=8)
    ] = 24,
    real_workload: Annotated[
        RealWorkload,
        typer.Option(
            help="real: a burst of independent prompts, multi-turn chats that resend their "
            "history (prefix-aware policies compared), or the burst through the gateway and "
            "through a real Envoy with steersman as its endpoint picker (envoy)."
        ),
    ] = RealWorkload.burst,
    vllm_python: Annotated[
        str, typer.Option(envvar="STEERSMAN_VLLM_PYTHON", help="real: vLLM CPU Python.")
    ] = ".vllm-venv/bin/python",
    train_budget: Annotated[
        float, typer.Option(help="Most seconds to train the length model, the first time.")
    ] = 180.0,
    fleet: Annotated[
        str, typer.Option(help="fleet: a mixed fleet, COUNTxPROFILE joined by +.")
    ] = "4xa100-llama2-7b+4xa30-llama2-7b",
    homogeneous: Annotated[
        str, typer.Option(help="fleet: the fleet whose instance 0 throttles, recovers, ...")
    ] = "8xa100-llama2-7b",
    fleet_scenarios: Annotated[
        str,
        typer.Option(
            help="fleet: mixed, throttle, recover, neighbour, fan, steady, quiet (all of them)."
        ),
    ] = "mixed,throttle,recover,neighbour,fan,steady,quiet",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Stock vLLM behind round-robin and least-load, vLLM priority with steersman's predictions,
    steersman, steersman with the true lengths and with a predictor that knows nothing, on
    identical workloads; the exact command is written into the report."""
    from steersman.control.harness import bench_report
    from steersman.control.harness.bench import Steady
    from steersman.control.harness.bench_suite import SimOptions
    from steersman.control.training.bundled import ensure_length_model

    settings: Settings = ctx.obj.settings()
    console = Console(stderr=True, highlight=False, soft_wrap=True)

    def fail(message: str, code: int) -> typer.Exit:
        console.print(f"error: {message}", markup=False)
        return typer.Exit(code)

    try:
        checks = _checked(suite, profile or ["a30-llama2-7b"], trace, scenarios, vllm_python)
        checks["policies"] = _policies(policies)
        if suite in (Suite.fleet, Suite.all):
            checks["fleet"] = _fleet_options(
                fleet, homogeneous, fleet_scenarios, slo_ttft, steady_s, warmup_s, seed
            )
    except (SetupError, ValueError) as exc:
        raise fail(str(exc), 2) from None
    out.mkdir(parents=True, exist_ok=True)
    model_dir = served_model(settings.data_dir)
    counter = TokenCounter(model_dir)
    with StepProgress(console, "length model", info="cached or training") as progress:

        def tick(step: int, total: int, info: dict) -> None:
            progress.update(completed=step, total=total, info=f"loss {info['loss']:.3f}")

        demo_model = ensure_length_model(
            settings.data_dir, counter, budget_s=train_budget, progress=tick
        )
    length_model = demo_model.directory
    console.print(f"length model: {length_model}, {demo_model.describe()}", markup=False)
    results: dict[str, Any] = {
        "command": "steersman " + shlex.join(sys.argv[1:]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "length_model": str(length_model),
        "length_model_base": demo_model.describe(),
        # steersman's [dispatch] settings where the configuration changed them: the policies run
        # as the operator would run them (vLLM's priority policy with the same aging)
        "dispatch_changed": settings.dispatch.model_dump(exclude_defaults=True),
    }
    if suite in (Suite.sim, Suite.all):
        options = SimOptions(
            instances=instances,
            requests=requests,
            scenarios=checks["scenarios"],
            slo_ttft_s=slo_ttft,
            goodput=(goodput_ttft, goodput_tpot),
            seed=seed,
            steady=Steady(duration_s=steady_s, warmup_s=min(warmup_s, steady_s / 2)),
            dispatch=settings.dispatch,
        )
        results["sim"] = _sim_suite(
            console, counter, length_model, checks, lengths, block_tokens, options, out
        )
    if suite in (Suite.fleet, Suite.all):
        fleet_options = replace(checks["fleet"], dispatch=settings.dispatch)
        results["fleet"] = _fleet_suite(
            console, counter, length_model, checks["trace"], fleet_options, requests
        )
    if suite in (Suite.qoe, Suite.all):
        results["qoe"] = _qoe_suite(
            console,
            counter,
            length_model,
            checks["trace"],
            profile,
            requests,
            seed,
            settings.dispatch,
        )
    if suite in (Suite.real, Suite.all):
        try:
            results["real"] = _real_suite(
                settings,
                counter,
                model_dir,
                length_model,
                checks["vllm_python"],
                real_requests,
                real_seconds,
                real_repeats,
                real_kv_blocks,
                real_workload,
                seed,
                out,
            )
        except (SetupError, ServerFailed) as exc:
            raise fail(str(exc), 1) from None
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "report.md").write_text(bench_report.report(results))
    typer.echo(str(out / "report.md"))


def _checked(
    suite: Suite, profiles: list[str], trace: str, scenarios: str, vllm_python: str
) -> dict[str, Any]:
    """Everything a user typed, checked before anything runs (a profile or trace that does not
    parse is refused with its file, line and field)."""
    from steersman.control.harness.bench_suite import check_scenario
    from steersman.control.harness.prefix import arrival_trace, load_hashed_trace
    from steersman.control.harness.workloads import load_trace
    from steersman.control.sim.profiles import load_profile
    from steersman.data import path

    checks: dict[str, Any] = {"vllm_python": vllm_python}
    if suite in (Suite.sim, Suite.fleet, Suite.qoe, Suite.all):
        bundled = trace in BUNDLED_TRACES
        source = path(trace) if bundled or trace == HASHED else Path(trace)
        if not bundled and trace != HASHED and not source.exists():
            raise ValueError(
                f"--trace {trace}: no such file, and not one of {(*BUNDLED_TRACES, HASHED)}"
            )
        checks["trace_name"] = trace
        if trace == HASHED:
            checks["hashed"] = load_hashed_trace(source)
            checks["trace"] = arrival_trace(checks["hashed"])
        else:
            checks["trace"] = load_trace(source, strict=not bundled)
    if suite in (Suite.sim, Suite.qoe, Suite.all):
        checks["profiles"] = {name: load_profile(name) for name in profiles}
        checks["scenarios"] = tuple(s.strip() for s in scenarios.split(",") if s.strip())
        for scenario in checks["scenarios"]:
            if (problem := check_scenario(scenario)) is not None:
                raise ValueError(f"--scenarios: {problem}")
    if suite in (Suite.real, Suite.all):
        checks["vllm_python"] = str(checked_vllm_python(vllm_python))
    return checks


def _fleet_options(
    mixed: str,
    homogeneous: str,
    scenarios: str,
    slo_ttft: float,
    steady_s: float,
    warmup_s: float,
    seed: int,
) -> Any:
    from steersman.control.harness import fleet
    from steersman.control.harness.bench import Steady

    steady = Steady(duration_s=steady_s, warmup_s=min(warmup_s, steady_s / 2))
    names = tuple(s.strip() for s in scenarios.split(",") if s.strip())
    for flag, text in (("--fleet", mixed), ("--homogeneous", homogeneous)):
        try:
            profiles = fleet.parse_fleet(text)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    for name in names:
        try:
            fleet.scenario_fleet(name, profiles, steady)
        except ValueError as exc:
            raise ValueError(f"--fleet-scenarios: {exc}") from None
    return fleet.FleetOptions(mixed, homogeneous, names, slo_ttft, steady=steady, seed=seed)


def _fleet_suite(console, counter, length_model, trace, options, requests) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The trace's lengths, predicted with the length model's measured error."""
    from steersman.control.harness import bench, fleet
    from steersman.learners.hf import LengthModel

    model = LengthModel.load(length_model)
    errors = bench.model_errors(counter, model.predict_with_vectors, 1000, options.seed + 1)
    profiles = fleet.parse_fleet(f"{options.fleet}+{options.homogeneous}")
    window = min(p.max_model_len for p in profiles)
    items = bench.trace_items(trace, errors, requests, window, options.seed)
    console.print(f"fleet: {options.fleet}; {options.homogeneous}", markup=False)
    return fleet.run(items, trace, options, say=lambda text: console.print(text, markup=False))


def _qoe_suite(  # type: ignore[no-untyped-def]
    console, counter, length_model, trace, profiles, requests, seed, dispatch
) -> dict[str, Any]:
    """The trace's lengths, predicted with the length model's measured error."""
    from steersman.control.harness import bench, qoe_suite
    from steersman.control.sim.profiles import load_profile
    from steersman.learners.hf import LengthModel

    model = LengthModel.load(length_model)
    errors = bench.model_errors(counter, model.predict_with_vectors, 1000, seed + 1)
    options = qoe_suite.QoeOptions(seed=seed, dispatch=dispatch)
    if profiles:
        options = replace(options, profiles=tuple(profiles))
    items = {
        name: bench.trace_items(trace, errors, requests, load_profile(name).max_model_len, seed)
        for name in options.profiles
    }
    return qoe_suite.run(items, trace, options, say=lambda text: console.print(text, markup=False))


def _policies(text: str) -> tuple[str, ...]:
    """The --policies asked for, least-load among them (scenario rates are relative to it)."""
    from steersman.control.harness.bench import variants

    names = [p.strip() for p in text.split(",") if p.strip()]
    known = variants()
    for name in names:
        if name not in known:
            raise ValueError(f"--policies: unknown policy {name!r}; known: {', '.join(known)}")
    if names and "least-load" not in names:
        names.insert(0, "least-load")
    return tuple(names)


def _sim_suite(
    console, counter, length_model, checks, lengths, block_tokens, options, out
) -> dict[str, Any]:
    from steersman.control.harness import bench
    from steersman.control.harness.bench_suite import run_profile
    from steersman.control.serve.served_model import validation_errors
    from steersman.learners.hf import LengthModel

    model = LengthModel.load(length_model)
    hashed = checks.get("hashed")
    if hashed is not None:
        lengths = Lengths.trace
    seed = options.seed
    errors = None
    band_errors = validation_errors(length_model)
    if lengths is Lengths.trace:
        errors = bench.model_errors(counter, model.predict_with_vectors, 1000, seed + 1)
        band_errors = bench.band_seed(errors)
    options = replace(
        options,
        lengths=lengths.value,
        policies=checks["policies"] or (bench.STANDARD if hashed is None else bench.PREFIX),
        band_errors=tuple(band_errors) if band_errors else None,
    )
    n, instances = options.requests, options.instances
    trace = checks["trace"]
    profiles, refused = [], {}
    for name, profile in checks["profiles"].items():
        if hashed is not None:
            window = profile.max_model_len
            items, refused[name] = bench.hashed_items(hashed, errors, n, block_tokens, window, seed)
        elif errors is None:
            window = profile.max_model_len
            items = bench.prompt_items(counter, model.predict_with_vectors, n, window, seed)
        else:
            items = bench.trace_items(trace, errors, n, profile.max_model_len, seed)
        label = Path(name).stem
        console.print(f"sim: {instances} x {label}, {len(items)} requests", markup=False)
        profiles.append(
            run_profile(
                label,
                profile,
                items,
                trace,
                options,
                out,
                lambda text: console.print(text, markup=False),
            )
        )
    prefixes = {}
    if hashed is not None:
        prefixes = {
            "block_tokens": block_tokens,
            "scaling": f"each hash id (512 tokens in the trace) is {block_tokens} tokens",
            "refused_over_window": {name: len(lines) for name, lines in refused.items()},
            "skipped_lines": len(hashed.skipped),
        }
    return {
        "trace": checks["trace_name"],
        **prefixes,
        "lengths": lengths.value,
        "slo_ttft_p99_s": options.slo_ttft_s,
        "goodput": {"ttft_s": options.goodput[0], "tpot_s": options.goodput[1]},
        "profiles": profiles,
    }


def _real_suite(
    settings,
    counter,
    model_dir,
    length_model,
    vllm_python,
    n,
    seconds,
    repeats,
    blocks,
    workload,
    seed,
    out,
) -> dict[str, Any]:
    from steersman.control.harness import plots
    from steersman.control.harness.bench_real import (
        MULTITURN,
        THROUGH_ENVOY,
        VARIANTS,
        burst_workload,
        multiturn_workload,
        run_real,
    )
    from steersman.control.harness.demo import DemoConfig

    if workload is RealWorkload.multiturn:
        items, policies = multiturn_workload(counter, n, seconds, seed), list(MULTITURN)
    elif workload is RealWorkload.envoy:
        items, policies = burst_workload(counter, n, seconds, seed), list(THROUGH_ENVOY)
    else:
        items, policies = burst_workload(counter, n, seconds, seed), list(VARIANTS)
    run_dir = settings.data_dir / "bench" / f"{datetime.now(UTC):%Y%m%d-%H%M%S}"
    args = DemoConfig.server_args
    if workload is not RealWorkload.multiturn:  # memory-bound, as on a GPU; chats keep it all
        args = (*args, "--num-gpu-blocks-override", str(blocks))
    config = DemoConfig("vllm", run_dir, model_dir, length_model, vllm_python, server_args=args)
    runs = run_real(config, settings, items, policies, repeats)
    plots.cdf(
        out / "real_e2e_cdf.png",
        {r["policy"]: r["e2e_all"] for r in runs},
        f"E2E latency, 2 vLLM CPU servers, {len(items)} {workload.value} requests",
        "seconds",
    )
    return {
        "workload": workload.value,
        "requests": len(items),
        "seconds": seconds,
        "repeats": repeats,
        "kv_blocks": blocks if workload is not RealWorkload.multiturn else None,
        "runs": [{k: v for k, v in r.items() if not k.endswith("_all")} for r in runs],
    }
