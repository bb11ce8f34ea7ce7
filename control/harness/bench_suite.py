"""The simulated suite of `steersman bench`: for each profile, every policy's capacity at the SLO,
then every scenario (steady load levels, a burst beyond capacity, bursty gamma arrivals) run by
every policy on the identical requests and arrivals."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steersman.control.core.settings import DispatchSettings
from steersman.control.harness import bench, plots
from steersman.control.harness.workloads import Trace, burst_arrivals
from steersman.control.sim.profiles import StepModel

Say = Callable[[str], None]


@dataclass(frozen=True)
class SimOptions:
    instances: int = 8
    requests: int = 5000  # the burst scenario's; capacity and steady levels run for a duration
    lengths: str = "prompts"  # or "trace"
    scenarios: tuple[str, ...] = ("steady:0.8", "steady:0.95", "burst", "gamma2", "gamma4")
    policies: tuple[str, ...] = bench.STANDARD
    slo_ttft_s: float = 1.0
    goodput: tuple[float, float] = (1.0, 0.1)
    burst_s: float = 60.0
    # Runs of the burst, each from another point of the trace: how deep an overload goes depends
    # on where it lands (least-load's normalized latency on 8 A30s runs from 0.029 to 0.081
    # s/token across points), so a few runs would measure the points, not the policies.
    burst_repeats: int = 12
    seed: int = 0
    steady: bench.Steady = field(default_factory=bench.Steady)
    # The served model's validation errors: the corrector's bands before outcomes, as the
    # daemon adopts them (None: a factor of 2 until a class has outcomes).
    band_errors: tuple[float, ...] | None = None
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # capacity searches at once
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)  # steersman's


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
    variants = {p: bench.variants(options.dispatch)[p] for p in options.policies}
    steady = options.steady
    capacity: dict[str, float] = {}

    def search(name: str, near: float | None) -> Search:
        return Search(name, variants[name], items, trace, profile, k, options, near)

    raw: dict[str, float] = {}

    def found(name: str, rate: float) -> None:
        raw[name], capacity[name] = rate, round(rate, 2)
        say(f"{profile_name}: capacity of {name} at P99 TTFT <= {options.slo_ttft_s:g} s: "
            f"{capacity[name]} req/s")  # fmt: skip

    # The prediction-free baseline first; the others are searched near it, side by side in
    # worker processes (each search is independent and deterministic).
    first = "least-load" if "least-load" in variants else next(iter(variants))
    found(first, search(first, None)())
    rest = [p for p in variants if p != first]
    with worker_pool(options.workers) as pool:
        searches = [search(p, raw[first]) for p in rest]  # the very rate, not its rounding
        for name, rate in zip(rest, pool.map(Search.__call__, searches), strict=True):
            found(name, rate)
    capacity = {p: capacity[p] for p in variants}
    base = raw.get("least-load") or max(raw.values())
    scenarios = []
    for scenario in options.scenarios:
        runs = {}
        for name, variant in variants.items():
            run, detail = scenario_run(
                scenario, name, variant, items, trace, base, profile, options
            )
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
        "steady_state": {
            "duration_s": steady.duration_s,
            "warmup_s": steady.warmup_s,
            "growth": steady.growth,
        },
        "kv_capacity_tokens": profile.num_blocks * profile.block_size,
        "capacity_at_slo_rps": capacity,
        "scenarios": scenarios,
    }


def scenario_run(
    scenario: str,
    name: str,
    variant: bench.Variant,
    items: Sequence[bench.Item],
    trace: Trace,
    capacity: float,
    profile: StepModel,
    options: SimOptions,
) -> tuple[dict[str, Any], str]:
    """One policy in a scenario, at rates relative to ``capacity`` (least-load's, at the SLO):
    steady levels and gamma arrivals measured at steady state; the burst, a fixed span of
    ``options.requests`` requests whose queue builds and drains."""
    k, steady, errors = options.instances, options.steady, options.band_errors
    if scenario.startswith("steady:"):
        level = float(scenario.split(":")[1])
        run = bench.steady_run(name, variant, items, trace, level * capacity, profile, k, steady,
                               seed=options.seed, goodput=options.goodput,
                               band_errors=errors)  # fmt: skip
        return run, f"{level:.0%} of capacity, steady state"
    if scenario.startswith("gamma"):
        rate, seed = 0.8 * capacity, options.seed
        run = bench.steady_run(name, variant, items, trace, rate, profile, k, steady,
                               kind=scenario, seed=seed, goodput=options.goodput,
                               band_errors=errors)  # fmt: skip
        return run, f"gamma arrivals, CV {scenario[5:]}, 80% of capacity, steady state"
    if scenario == "burst":
        n = len(items)
        low, high = 0.7 * capacity, 1.5 * capacity
        start = 0.3 * n / low
        length = min(options.burst_s, 0.45 * n / high)  # the burst fits in the requests
        repeats = options.burst_repeats
        detail = (
            f"0.7x capacity, {length:.0f} s at 1.5x from {start:.0f} s, mean of {repeats} runs "
            "from different points of the trace"
        )
        bursts = [
            Burst(name, variant, items, trace, profile, options, (low, high, start, length), seed)
            for seed in range(options.seed, options.seed + repeats)
        ]
        with worker_pool(min(options.workers, repeats)) as pool:
            runs = list(pool.map(Burst.__call__, bursts))
        out = mean_run(runs)
        out["norm_mean_by_run"] = [r["norm_mean_s"] for r in runs]
        return out, detail
    raise ValueError(check_scenario(scenario) or scenario)


def mean_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one policy as one: the mean of each figure (an overload is chaotic: a float's
    last digit in one prediction changes which request is preempted, and a single run's figures
    by several percent); per-request lists pooled, the first run's time series for plots.

    >>> mean_run([{"policy": "a", "p99": 1.0, "all": [1]}, {"policy": "a", "p99": 3.0, "all": [2]}])
    {'policy': 'a', 'p99': 2.0, 'all': [1, 2], 'repeats': 2}
    """
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        values = [r[key] for r in runs]
        if isinstance(value, bool) or key in ("samples", "ttft_by_arrival"):
            out[key] = value
        elif isinstance(value, int | float) and all(isinstance(v, int | float) for v in values):
            mean = sum(values) / len(values)
            out[key] = round(mean, 4) if isinstance(value, float) else round(mean, 1)
        elif isinstance(value, list):
            out[key] = [x for v in values for x in v]
        else:
            out[key] = value
    out["repeats"] = len(runs)
    return out


@dataclass(frozen=True)
class Search:
    """One policy's capacity search, as a worker process receives it."""

    name: str
    variant: bench.Variant
    items: Sequence[bench.Item]
    trace: Trace
    profile: StepModel
    instances: int
    options: SimOptions
    near: float | None

    def __call__(self) -> float:
        o = self.options
        return bench.capacity(
            self.name, self.variant, self.items, self.trace, self.profile, self.instances,
            o.slo_ttft_s, o.steady, start=10.0, near=self.near, seed=o.seed,
            band_errors=o.band_errors,
        )  # fmt: skip


@dataclass(frozen=True)
class Burst:
    """One run of the burst from one point of the trace, as a worker process receives it."""

    name: str
    variant: bench.Variant
    items: Sequence[bench.Item]
    trace: Trace
    profile: StepModel
    options: SimOptions
    shape: tuple[float, float, float, float]  # base rate, burst rate, burst start, burst length
    seed: int

    def __call__(self) -> dict[str, Any]:
        o = self.options
        unit = bench.unit_arrivals("trace", self.trace, len(self.items), self.seed)
        times = burst_arrivals(unit, *self.shape)
        return bench.run_sim(self.name, self.variant, self.items, times, self.profile,
                             o.instances, goodput=o.goodput, band_errors=o.band_errors)  # fmt: skip


def worker_pool(workers: int) -> Any:
    """Worker processes (forked: they inherit the workload), or this process for one."""
    if workers <= 1:
        return _InProcess()
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))


class _InProcess:
    def __enter__(self) -> _InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Callable[..., Any], *args: Any) -> Any:
        return map(fn, *args)


def check_scenario(scenario: str) -> str | None:
    """Why a scenario name is not one (None when it is).

    >>> check_scenario("steady:0.8"), check_scenario("gamma4"), check_scenario("steady:x")
    (None, None, "unknown scenario 'steady:x': steady:LEVEL, burst, gamma2 or gamma4")
    """
    if scenario in ("burst", "gamma2", "gamma4"):
        return None
    if scenario.startswith("steady:"):
        try:
            if float(scenario.split(":", 1)[1]) > 0:
                return None
        except ValueError:
            pass
    return f"unknown scenario {scenario!r}: steady:LEVEL, burst, gamma2 or gamma4"


def strip(run: dict[str, Any]) -> dict[str, Any]:
    drop = ("_all", "samples", "ttft_by_arrival")
    return {k: v for k, v in run.items() if not k.endswith(drop)}


def line(profile: str, scenario: str, r: dict[str, Any]) -> str:
    return (
        f"{profile} {scenario:<11} {r['policy']:<14} ttft p50 {r['ttft_p50_s']} p99 "
        f"{r['ttft_p99_s']}  e2e mean {r['e2e_mean_s']} p99 {r['e2e_p99_s']}  norm "
        f"{r['norm_mean_s']}  preempt {r['preemptions']}  wall {r['wall_s']} s"
    )
