"""The simulated suite of `steersman bench`: for each profile, every policy's capacity at the SLO,
then every scenario (steady load levels, a burst beyond capacity, bursty gamma arrivals) run by
every policy on the identical requests and arrivals."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steersman.control.harness import bench, plots
from steersman.control.harness.workloads import Trace, burst_arrivals
from steersman.control.sim.profiles import StepModel

Say = Callable[[str], None]


@dataclass(frozen=True)
class SimOptions:
    instances: int = 8
    requests: int = 5000
    lengths: str = "prompts"  # or "trace"
    scenarios: tuple[str, ...] = ("steady:0.8", "steady:0.95", "burst", "gamma2", "gamma4")
    policies: tuple[str, ...] = bench.STANDARD
    slo_ttft_s: float = 1.0
    goodput: tuple[float, float] = (1.0, 0.1)
    burst_s: float = 60.0
    seed: int = 0


def run_profile(
    profile_name: str,
    profile: StepModel,
    items: Sequence[bench.Item],
    trace: Trace,
    options: SimOptions,
    out: Path,
    say: Say,
) -> dict[str, Any]:
    n, k = len(items), options.instances
    variants = {p: bench.variants()[p] for p in options.policies}
    unit = bench.unit_arrivals("trace", trace, n, options.seed)
    capacity = {}
    for name, variant in variants.items():
        capacity[name] = round(
            bench.capacity(name, variant, items, unit, profile, k, options.slo_ttft_s, 10.0), 2
        )
        say(
            f"{profile_name}: capacity of {name} at P99 TTFT <= {options.slo_ttft_s:g} s: "
            f"{capacity[name]} req/s"
        )
    base = capacity.get("least-load") or max(capacity.values())
    scenarios = []
    for scenario in options.scenarios:
        times, detail = arrivals(scenario, trace, n, base, options)
        runs = {}
        for name, variant in variants.items():
            run = bench.run_sim(name, variant, items, times, profile, k, goodput=options.goodput)
            runs[name] = run
            say(line(profile_name, scenario, run))
        if scenario == "burst":
            plots.over_time(
                out / f"{profile_name}_burst.png", runs, f"{profile_name} x {k}: {detail}"
            )
        if scenario.startswith("steady"):
            plots.cdf(
                out / f"{profile_name}_{scenario.replace(':', '_')}_e2e_cdf.png",
                {p: r["e2e_all"] for p, r in runs.items()},
                f"E2E latency, {profile_name} x {k}, {detail}",
                "seconds",
            )
        scenarios.append(
            {"scenario": scenario, "detail": detail, "runs": [strip(r) for r in runs.values()]}
        )
    plots.bars(
        out / f"{profile_name}_capacity.png",
        capacity,
        f"Capacity at P99 TTFT <= {options.slo_ttft_s:g} s ({profile_name} x {k})",
        "requests/s",
    )
    return {
        "profile": profile_name,
        "instances": k,
        "requests": n,
        "kv_capacity_tokens": profile.num_blocks * profile.block_size,
        "capacity_at_slo_rps": capacity,
        "scenarios": scenarios,
    }


def arrivals(
    scenario: str, trace: Trace, n: int, capacity: float, options: SimOptions
) -> tuple[list[float], str]:
    """Arrival times for a scenario, relative to ``capacity`` (least-load's, at the SLO)."""
    unit = bench.unit_arrivals("trace", trace, n, options.seed)
    if scenario.startswith("steady:"):
        level = float(scenario.split(":")[1])
        return [u / (level * capacity) for u in unit], f"{level:.0%} of capacity"
    if scenario == "burst":
        low, high = 0.7 * capacity, 1.5 * capacity
        start = 0.3 * n / low
        length = min(options.burst_s, 0.45 * n / high)  # the burst fits in the requests
        detail = f"0.7x capacity, {length:.0f} s at 1.5x from {start:.0f} s"
        return burst_arrivals(unit, low, high, start, length), detail
    if scenario.startswith("gamma"):
        rate = 0.8 * capacity
        gamma = bench.unit_arrivals(scenario, trace, n, options.seed)
        return [u / rate for u in gamma], f"gamma arrivals, CV {scenario[5:]}, 80% of capacity"
    raise ValueError(f"unknown scenario {scenario!r}: steady:LEVEL, burst, gamma2 or gamma4")


def strip(run: dict[str, Any]) -> dict[str, Any]:
    drop = ("_all", "samples", "ttft_by_arrival")
    return {k: v for k, v in run.items() if not k.endswith(drop)}


def line(profile: str, scenario: str, r: dict[str, Any]) -> str:
    return (
        f"{profile} {scenario:<11} {r['policy']:<14} ttft p50 {r['ttft_p50_s']} p99 "
        f"{r['ttft_p99_s']}  e2e mean {r['e2e_mean_s']} p99 {r['e2e_p99_s']}  norm "
        f"{r['norm_mean_s']}  preempt {r['preemptions']}  wall {r['wall_s']} s"
    )
