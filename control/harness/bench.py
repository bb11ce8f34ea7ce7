"""`steersman bench`: policies side by side on the same workload, in one run.

Suite ``sim``: a cluster of simulated instances with a GPU profile in virtual time, the Azure
conversation trace time-scaled to load levels of the cluster's capacity, held-out prompts with
their true lengths. Suite ``real``: two vLLM CPU servers behind the daemon, one load level.
Every policy sees the identical arrivals, prompts and lengths (fixed seeds).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from steersman.control.core.scheduler import Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.control.harness.workloads import WorkItem, build_workload, load_trace, trace_arrivals
from steersman.control.sim.driver import CoreDriver
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.profiles import StepModel
from steersman.control.sim.virtual import run_cluster
from steersman.control.training.bundled import bundled_records, held_out
from steersman.data import path
from steersman.learners.corrector import BASE_KEY, LengthCorrector
from steersman.learners.features import request_features
from steersman.learners.tokens import TokenCounter
from steersman.storage.query import percentile

POLICIES = ("round-robin", "least-load", "predictive", "predictive-no-controller", "oracle")
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


@dataclass
class SimWorkload:
    items: list[WorkItem]  # arrival_s at a mean rate of 1 request/s
    features: dict[str, dict[str, Any]]  # by request id, with RoBERTa's base prediction


def sim_workload(
    counter: TokenCounter,
    predict_log: Callable[[list[str]], list[float]] | None,
    n: int,
    max_model_len: int,
    seed: int,
) -> SimWorkload:
    rng = random.Random(seed)
    times = trace_arrivals(load_trace(path("azure_conv")), n, 1.0, rng)
    _, prompts = held_out(bundled_records())
    items = build_workload(prompts, times, counter, rng, max_model_len=max_model_len)
    bases: list[float | None] = [None] * len(items)
    if predict_log is not None:
        logs: list[float] = []
        texts = [i.prompt for i in items]
        for start in range(0, len(texts), 64):
            logs.extend(predict_log(texts[start : start + 64]))
        bases = [math.expm1(v) for v in logs]
    features = {}
    for item, base in zip(items, bases, strict=True):
        x: dict[str, Any] = dict(request_features(item.prompt, prompt_tokens=item.prompt_tokens))
        if base is not None and math.isfinite(base):
            x[BASE_KEY] = base
        features[_rid(item)] = x
    return SimWorkload(items, features)


def _rid(item: WorkItem) -> str:
    return f"r{item.index}"


def make_driver(
    policy: str, workload: SimWorkload, profile: StepModel, cap: int
) -> tuple[CoreDriver, str]:
    """(driver, engine scheduling policy). Baselines dispatch on arrival to FCFS engines, as a
    load balancer in front of stock vLLM does; steersman queues with caps and sets priorities."""
    step = profile.coefficients()
    if policy in ("round-robin", "least-load"):
        core = Scheduler(
            DispatchSettings(policy=policy),
            ControllerSettings(),
            admission="none",
            priorities=False,
        )
        return CoreDriver(core, step), "fcfs"
    if policy == "oracle":
        core = Scheduler(DispatchSettings(policy="oracle"), ControllerSettings())
        return CoreDriver(core, step, cap=cap), "priority"
    controller = ControllerSettings(enabled=policy == "predictive")
    core = Scheduler(DispatchSettings(policy="predictive"), controller, corrector=LengthCorrector())
    return CoreDriver(core, step, features=workload.features, cap=cap), "priority"


def run_sim(
    policy: str,
    workload: SimWorkload,
    profile: StepModel,
    instances: int,
    rate: float,
    cap: int,
) -> dict[str, Any]:
    driver, engine_policy = make_driver(policy, workload, profile, cap)
    requests = [
        SimRequest(_rid(i), i.arrival_s / rate, i.prompt_tokens, i.true_tokens)
        for i in workload.items
    ]
    engines = [SimEngine(profile, engine_policy) for _ in range(instances)]
    started = time.perf_counter()
    run = run_cluster(requests, engines, driver)
    wall = time.perf_counter() - started
    ttft = [r.first_token_at - r.arrival for r in run.finished if r.first_token_at is not None]
    e2e = [r.finished_at - r.arrival for r in run.finished if r.finished_at is not None]
    s = driver.scheduler.stats
    return {
        "policy": policy,
        "rate_rps": round(rate, 3),
        "requests": len(requests),
        "finished": len(run.finished),
        "wall_s": round(wall, 2),
        **_quantiles("ttft", ttft),
        **_quantiles("e2e", e2e),
        "preemptions": sum(e.stats.preemptions for e in engines),
        "fallbacks": s.fallbacks,
        "fallback_share": round(s.fallback_decisions / max(s.decisions, 1), 3),
        "within_30": round(1 - s.misses / s.scored, 3) if s.scored else None,
        "ttft_all": ttft,
        "e2e_all": e2e,
    }


def _quantiles(name: str, values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        f"{name}_mean_s": round(sum(values) / len(values), 4) if values else None
    }
    for label, q in QUANTILES.items():
        value = percentile(values, q)
        out[f"{name}_{label}_s"] = None if value is None else round(value, 4)
    return out


def capacity(
    workload: SimWorkload, profile: StepModel, instances: int, slo_ttft_p99_s: float
) -> float:
    """Round-robin's capacity: the highest arrival rate (to 2%) at which it keeps P99 TTFT
    within the bound. Load levels are shares of it, so "95%" is near where queues start."""

    def ok(rate: float) -> bool:
        run = run_sim("round-robin", workload, profile, instances, rate, cap=0)
        return run["ttft_p99_s"] is not None and run["ttft_p99_s"] <= slo_ttft_p99_s

    low, high = 1.0, 2.0
    while ok(high):  # double until the bound breaks
        low, high = high, high * 2
    while high / low > 1.02:
        mid = (low * high) ** 0.5
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def capacity_at_slo(runs: list[dict[str, Any]], policy: str, slo_ttft_p99_s: float) -> float | None:
    """The highest swept rate at which ``policy`` kept P99 TTFT within the bound (and every
    lower rate did too)."""
    best = None
    for run in sorted((r for r in runs if r["policy"] == policy), key=lambda r: r["rate_rps"]):
        p99 = run["ttft_p99_s"]
        if p99 is None or p99 > slo_ttft_p99_s:
            break
        best = run["rate_rps"]
    return best
