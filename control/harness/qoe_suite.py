"""Streamed quality of experience side by side (`steersman bench --suite qoe`): per profile, each
policy's QoE capacity (the highest steady rate at which 95% of streams reach QoE 0.9, Andes'
criterion) and an overload (``overload`` x least-load's QoE capacity for ``overload_s``, then
back to ``base`` x), on identical requests and arrivals. The QoE rule (``core.qoe_rule``) runs in
``andes`` (no length predictions, behind least-load) and ``steersman-qoe`` (steersman's
dispatch and vLLM order, every request sent to an engine at once, where the rule sees it);
``-lengths`` weighs stalls by predicted lengths; ``-pausing`` may also pause a stream once."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from steersman.control.core.settings import DispatchSettings
from steersman.control.harness import bench
from steersman.control.harness.bench_suite import worker_pool
from steersman.control.harness.workloads import Trace, burst_arrivals
from steersman.control.sim.profiles import StepModel, load_profile

POLICIES = (
    "least-load",
    "vllm-priority",
    "steersman",
    "andes",
    "steersman-qoe",
    "steersman-qoe-lengths",
    "andes-pausing",
    "steersman-qoe-pausing",
)
FIGURES = (
    "qoe_mean", "qoe_p10", "qoe_below_0_9", "qoe_at_least_0_5", "ttft_p50_s", "ttft_p99_s",
    "e2e_mean_s", "e2e_p99_s", "norm_mean_s", "preemptions", "finished", "requests",
)  # fmt: skip


@dataclass(frozen=True)
class QoeOptions:
    profiles: tuple[str, ...] = ("a30-llama2-7b", "a100-llama2-7b")
    instances: int = 8
    policies: tuple[str, ...] = POLICIES
    overload: float = 2.0
    overload_s: float = 60.0
    base: float = 0.7
    lead_s: float = 30.0  # at ``base`` before the overload
    steady: bench.Steady = field(default_factory=lambda: bench.Steady(120.0, 30.0))
    seed: int = 0
    workers: int = 2
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)  # steersman's


@dataclass(frozen=True)
class _Search:
    name: str
    items: Sequence[bench.Item]
    trace: Trace
    profile: StepModel
    options: QoeOptions
    near: float | None

    def __call__(self) -> float:
        o = self.options
        variant = bench.variants(o.dispatch)[self.name]
        return bench.capacity(
            self.name, variant, self.items, self.trace, self.profile, o.instances, math.inf,
            o.steady, start=10.0, near=self.near, seed=o.seed, meets=bench.qoe_objective,
        )  # fmt: skip


def run(
    items_by_profile: dict[str, Sequence[bench.Item]],
    trace: Trace,
    options: QoeOptions,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"options": _described(options), "profiles": []}
    for name in options.profiles:
        profile, items = load_profile(name), items_by_profile[name]
        capacity = _capacities(items, trace, profile, options, say)
        base = capacity["least-load"]
        times = overload_arrivals(trace, base, options)
        cycled = [items[i % len(items)] for i in range(len(times))]
        overload: dict[str, Any] = {}
        policies = bench.variants(options.dispatch)
        for policy in options.policies:
            r = bench.run_sim(policy, policies[policy], cycled, times, profile,
                              options.instances)  # fmt: skip
            overload[policy] = {k: r[k] for k in FIGURES}
            say(line(name, policy, overload[policy]))
        out["profiles"].append(
            {"profile": name, "qoe_capacity_rps": capacity, "overload": overload}
        )
    return out


def overload_arrivals(trace: Trace, capacity: float, options: QoeOptions) -> list[float]:
    """The trace's shape at ``base`` x capacity for ``lead_s``, ``overload`` x for
    ``overload_s``, then ``base`` x again for as long again as the overload lasted, so the
    backlog it left can drain while requests still arrive."""
    o = options
    low, high = o.base * capacity, o.overload * capacity
    n = math.ceil(low * o.lead_s + high * o.overload_s + low * 2 * o.overload_s)
    unit = bench.unit_arrivals("trace", trace, n, o.seed)
    return burst_arrivals(unit, low, high, o.lead_s, o.overload_s)


def _capacities(
    items: Sequence[bench.Item],
    trace: Trace,
    profile: StepModel,
    options: QoeOptions,
    say: Callable[[str], None],
) -> dict[str, float]:
    first = _Search("least-load", items, trace, profile, options, None)()
    out = {"least-load": round(first, 2)}
    say(f"{profile.name}: QoE capacity of least-load: {out['least-load']} req/s")
    rest = [p for p in options.policies if p != "least-load"]
    with worker_pool(options.workers) as pool:
        searches = [_Search(p, items, trace, profile, options, first) for p in rest]
        for name, rate in zip(rest, pool.map(_Search.__call__, searches), strict=True):
            out[name] = round(rate, 2)
            say(f"{profile.name}: QoE capacity of {name}: {out[name]} req/s")
    return out


def _described(o: QoeOptions) -> dict[str, Any]:
    return {
        "profiles": list(o.profiles),
        "instances": o.instances,
        "policies": list(o.policies),
        "overload": o.overload,
        "overload_s": o.overload_s,
        "base": o.base,
        "lead_s": o.lead_s,
        "steady_state": {"duration_s": o.steady.duration_s, "warmup_s": o.steady.warmup_s},
    }


def line(profile: str, policy: str, r: dict[str, Any]) -> str:
    return (
        f"{profile} overload {policy:<22} QoE mean {r['qoe_mean']} p10 {r['qoe_p10']} "
        f"<0.9 {r['qoe_below_0_9']}  ttft p99 {r['ttft_p99_s']}  e2e p99 {r['e2e_p99_s']}  "
        f"preempt {r['preemptions']}"
    )
