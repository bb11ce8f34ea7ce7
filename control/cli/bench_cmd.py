"""`steersman bench`: policies compared side by side; writes results.json, report.md and plots."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from steersman.control.backends.vllm_server import ServerFailed, SetupError
from steersman.control.backends.vllm_server import vllm_python as checked_vllm_python
from steersman.control.serve.settings import Settings
from steersman.control.training.tiny_model import served_model
from steersman.learners.tokens import TokenCounter


class Suite(StrEnum):
    sim = "sim"
    real = "real"
    all = "all"


def bench_command(
    ctx: typer.Context,
    suite: Annotated[Suite, typer.Option(help="Simulated cluster, real vLLM CPU, or both.")] = (
        Suite.sim
    ),
    out: Annotated[Path, typer.Option(help="Directory for report.md, results.json, plots.")] = (
        Path("bench-out")
    ),
    profile: Annotated[str, typer.Option(help="sim: GPU profile.")] = "a100-llama2-7b",
    instances: Annotated[int, typer.Option(help="sim: instances.", min=1)] = 8,
    requests: Annotated[int, typer.Option(help="sim: requests per run.", min=100)] = 10000,
    levels: Annotated[str, typer.Option(help="sim: load levels, shares of capacity.")] = (
        "0.6,0.8,0.95"
    ),
    sweep: Annotated[str, typer.Option(help="sim: shares of capacity for the SLO sweep.")] = (
        "0.9,1.0,1.05,1.1,1.2,1.3"
    ),
    cap: Annotated[int, typer.Option(help="Requests steersman keeps at each instance.")] = 256,
    slo_ttft: Annotated[float, typer.Option(help="SLO: P99 TTFT bound in seconds.")] = 1.0,
    real_rate: Annotated[float, typer.Option(help="real: requests/s.")] = 2.0,
    real_duration: Annotated[float, typer.Option(help="real: seconds of trace.")] = 60.0,
    vllm_python: Annotated[
        str, typer.Option(envvar="STEERSMAN_VLLM_PYTHON", help="real: vLLM CPU Python.")
    ] = ".vllm-venv/bin/python",
    train_budget: Annotated[
        float, typer.Option(help="Most seconds to train the length model, the first time.")
    ] = 180.0,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Round-robin, least-load, predictive, predictive without the controller, and the oracle,
    on identical workloads; the exact command is written into the report."""
    from steersman.control.harness import plots
    from steersman.control.harness.bench import POLICIES
    from steersman.control.training.bundled import ensure_length_model

    settings: Settings = ctx.obj.settings()
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if suite in (Suite.real, Suite.all):
        try:
            vllm_python = str(checked_vllm_python(vllm_python))
        except SetupError as exc:
            console.print(f"error: {exc}", markup=False)
            raise typer.Exit(2) from None
    out.mkdir(parents=True, exist_ok=True)
    model_dir = served_model(settings.data_dir)
    counter = TokenCounter(model_dir)
    length_model = ensure_length_model(settings.data_dir, counter, budget_s=train_budget)
    results: dict[str, Any] = {
        "command": "steersman " + shlex.join(sys.argv[1:]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "length_model": str(length_model),
    }
    if suite in (Suite.sim, Suite.all):
        console.print(f"sim suite: {instances} x {profile}, {requests} requests", markup=False)
        results["sim"] = _sim_suite(
            console, counter, length_model, profile, instances, requests, levels, sweep, cap,
            slo_ttft, seed, out, plots, POLICIES,
        )  # fmt: skip
    if suite in (Suite.real, Suite.all):
        console.print(f"real suite: 2 vLLM CPU servers, {real_rate} req/s", markup=False)
        try:
            results["real"] = _real_suite(
                settings, counter, model_dir, length_model, vllm_python, real_rate, real_duration,
                seed, out, plots, POLICIES,
            )  # fmt: skip
        except (SetupError, ServerFailed) as exc:
            console.print(f"error: {exc}", markup=False)
            raise typer.Exit(1) from None
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "report.md").write_text(report(results))
    typer.echo(str(out / "report.md"))


def _sim_suite(
    console, counter, length_model, profile_name, instances, n, levels, sweep, cap, slo, seed,
    out, plots, policies,
) -> dict[str, Any]:  # fmt: skip
    from steersman.control.harness import bench
    from steersman.control.sim.profiles import load_profile
    from steersman.learners.hf import RobertaLengthModel

    profile = load_profile(profile_name)
    model = RobertaLengthModel.load(length_model)
    workload = bench.sim_workload(counter, model.predict_log, n, profile.max_model_len, seed)
    capacity = bench.capacity(workload, profile, instances, slo)
    console.print(f"capacity {capacity:.1f} req/s", markup=False)
    level_runs: list[dict[str, Any]] = []
    for level in _floats(levels):
        for policy in policies:
            run = bench.run_sim(policy, workload, profile, instances, capacity * level, cap)
            run["level"] = level
            level_runs.append(run)
            console.print(_line(run), markup=False)
    sweep_runs = []
    for level in _floats(sweep):
        for policy in policies:
            run = bench.run_sim(policy, workload, profile, instances, capacity * level, cap)
            run["level"] = level
            sweep_runs.append(_strip(run))
    top = max(_floats(levels))
    at_top = {r["policy"]: r for r in level_runs if r["level"] == top}
    plots.cdf(
        out / "sim_e2e_cdf.png",
        {p: r["e2e_all"] for p, r in at_top.items()},
        f"E2E latency at {top:.0%} of capacity ({instances} x {profile_name})",
        "seconds",
    )
    plots.cdf(
        out / "sim_ttft_cdf.png",
        {p: r["ttft_all"] for p, r in at_top.items()},
        f"TTFT at {top:.0%} of capacity",
        "seconds",
    )
    level_runs = [_strip(r) for r in level_runs]
    plots.versus_load(out / "sim_p99_e2e.png", level_runs + sweep_runs, "e2e_p99_s",
                      "P99 E2E vs load", "seconds")  # fmt: skip
    plots.versus_load(out / "sim_p99_ttft.png", level_runs + sweep_runs, "ttft_p99_s",
                      "P99 TTFT vs load", "seconds")  # fmt: skip
    slo_capacity = {p: bench.capacity_at_slo(sweep_runs, p, slo) for p in policies}
    plots.bars(out / "sim_capacity.png", slo_capacity,
               f"Capacity at P99 TTFT <= {slo:g} s", "requests/s")  # fmt: skip
    top_runs = {r["policy"]: r for r in level_runs if r["level"] == top}

    def ratio(a: str, b: str, metric: str) -> float | None:
        x, y = top_runs[a][metric], top_runs[b][metric]
        return round(x / y, 3) if x and y else None

    rr_capacity = slo_capacity.get("round-robin")
    return {
        "profile": profile_name,
        "instances": instances,
        "requests": len(workload.items),
        "capacity_rps": round(capacity, 2),
        "cap": cap,
        "slo_ttft_p99_s": slo,
        "levels": level_runs,
        "sweep": sweep_runs,
        "capacity_at_slo_rps": slo_capacity,
        "ratios_at_top_level": {
            "p99_e2e_predictive_vs_round_robin": ratio("predictive", "round-robin", "e2e_p99_s"),
            "p99_e2e_predictive_vs_least_load": ratio("predictive", "least-load", "e2e_p99_s"),
            "p99_e2e_predictive_vs_oracle": ratio("predictive", "oracle", "e2e_p99_s"),
            "capacity_predictive_vs_round_robin": (
                round(slo_capacity["predictive"] / rr_capacity, 3)
                if slo_capacity.get("predictive") and rr_capacity
                else None
            ),
        },
    }


def _real_suite(
    settings, counter, model_dir, length_model, vllm_python, rate, duration, seed, out, plots,
    policies,
) -> dict[str, Any]:  # fmt: skip
    from steersman.control.harness.bench_real import run_real
    from steersman.control.harness.demo import DemoConfig, demo_workload

    items = demo_workload(counter, rate, duration, seed)
    run_dir = settings.data_dir / "bench" / f"{datetime.now(UTC):%Y%m%d-%H%M%S}"
    config = DemoConfig("vllm", run_dir, model_dir, length_model, vllm_python)
    runs = run_real(config, settings, items, list(policies))
    plots.cdf(out / "real_e2e_cdf.png", {r["policy"]: r["e2e_all"] for r in runs},
              f"E2E latency, 2 vLLM CPU servers, {rate:g} req/s", "seconds")  # fmt: skip
    plots.cdf(out / "real_ttft_cdf.png", {r["policy"]: r["ttft_all"] for r in runs},
              f"TTFT, 2 vLLM CPU servers, {rate:g} req/s", "seconds")  # fmt: skip
    return {"rate_rps": rate, "requests": len(items), "runs": [_strip(r) for r in runs]}


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _strip(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if not k.endswith("_all")}


def _line(run: dict[str, Any]) -> str:
    return (
        f"{run['level']:.2f} {run['policy']:<26} ttft p99 {run['ttft_p99_s']}  "
        f"e2e p50 {run['e2e_p50_s']} p99 {run['e2e_p99_s']}  wall {run['wall_s']} s"
    )


def report(results: dict[str, Any]) -> str:
    lines = ["# steersman bench", "", f"Command: `{results['command']}`", ""]
    lines.append(f"Started {results['started_at']}; length model `{results['length_model']}`.")
    sim = results.get("sim")
    if sim:
        lines += [
            "",
            f"## Simulated cluster: {sim['instances']} x {sim['profile']}",
            "",
            f"{sim['requests']} requests of the Azure conversation trace with held-out prompts "
            f"and their true lengths. Capacity {sim['capacity_rps']} req/s: the highest rate at "
            f"which round-robin keeps P99 TTFT <= {sim['slo_ttft_p99_s']} s; load levels are "
            f"shares of it. steersman keeps at most {sim['cap']} requests per instance.",
            "",
            _table(sim["levels"], with_level=True),
            "",
            f"Capacity at the SLO (P99 TTFT <= {sim['slo_ttft_p99_s']} s), req/s: "
            + ", ".join(f"{p} {v}" for p, v in sim["capacity_at_slo_rps"].items()),
            "",
            "Ratios at the highest level: "
            + ", ".join(f"{k} {v}" for k, v in sim["ratios_at_top_level"].items()),
            "",
            "![E2E CDF](sim_e2e_cdf.png) ![TTFT CDF](sim_ttft_cdf.png)",
            "![P99 E2E vs load](sim_p99_e2e.png) ![P99 TTFT vs load](sim_p99_ttft.png)",
            "![Capacity at the SLO](sim_capacity.png)",
        ]
    real = results.get("real")
    if real:
        lines += [
            "",
            f"## Real vLLM CPU: 2 servers, {real['rate_rps']} req/s, {real['requests']} requests",
            "",
            _real_table(real["runs"]),
            "",
            "![E2E CDF](real_e2e_cdf.png) ![TTFT CDF](real_ttft_cdf.png)",
        ]
    return "\n".join(lines) + "\n"


def _table(runs: list[dict[str, Any]], with_level: bool) -> str:
    head = "| load | policy | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 | E2E mean | fallback share |"
    rows = [head, "|" + "---|" * 8]
    for r in runs:
        rows.append(
            f"| {r['level']:.0%} ({r['rate_rps']:.0f}/s) | {r['policy']} | {r['ttft_p50_s']} | "
            f"{r['ttft_p99_s']} | {r['e2e_p50_s']} | {r['e2e_p99_s']} | {r['e2e_mean_s']} | "
            f"{r['fallback_share']} |"
        )
    return "\n".join(rows)


def _real_table(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| policy | ok | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 | within 30% | fallbacks |",
        "|" + "---|" * 8,
    ]
    for r in runs:
        p = r["prediction"]
        rows.append(
            f"| {r['policy']} | {r['succeeded']}/{r['requests']} | {r['ttft_p50_s']} | "
            f"{r['ttft_p99_s']} | {r['e2e_p50_s']} | {r['e2e_p99_s']} | {p['within_30']} | "
            f"{p['fallbacks']} |"
        )
    return "\n".join(rows)
