"""Fleets that differ and GPUs that slow down: policies side by side on simulated instances whose
GPUs report telemetry (``control/sim/gpu.py``), with the latency models learning and frozen.

Scenarios (instance 0 is the one that changes; the change comes after the warm-up):
- ``mixed``: the fleet as given (e.g. 4 x A100 + 4 x A30), every instance declared as the first
  profile (what an instance given only by URL is planned with), capacity at the SLO;
- ``throttle``: its clock capped at 60% from a third of the run on (a power cap, a slowdown);
- ``recover``: capped at 60% from the start, back to full clock at half the run;
- ``neighbour``: another tenant takes half its SMs from a third of the run on;
- ``fan``: its cooling at a quarter of normal from the start: it heats up and throttles itself;
- ``steady``: nothing changes: learning must cost nothing where nothing changes;
- ``quiet``: at light load, a neighbour takes half its SMs from the start and leaves at half the
  run: judged slow, instance 0 gets no requests that could show it is fast again, unless what its
  model learned fades (``steersman-remembers``: it does not).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from steersman.control.core.settings import DispatchSettings
from steersman.control.harness import bench
from steersman.control.harness.workloads import Trace
from steersman.control.sim.gpu import GpuEvent
from steersman.control.sim.profiles import StepModel, load_profile

SCENARIOS = ("mixed", "throttle", "recover", "neighbour", "fan", "steady", "quiet")
TRACKED = 0.10  # a model tracks a change once its step-time error stays under this
FLOOR_LEVEL = 0.05  # the first-token floor's load: requests hardly ever meet


def parse_fleet(text: str) -> tuple[StepModel, ...]:
    """``"4xa100-llama2-7b+4xa30-llama2-7b"``: profiles with counts, in order.

    >>> [p.name for p in parse_fleet("1xa100-llama2-7b+2xa30-llama2-7b")]
    ['a100-llama2-7b', 'a30-llama2-7b', 'a30-llama2-7b']
    >>> parse_fleet("2xa100-llama2-7b+x")
    Traceback (most recent call last):
    ...
    ValueError: fleet '2xa100-llama2-7b+x': part 'x' is not COUNTxPROFILE (e.g. 4xa100-llama2-7b)
    """
    out: list[StepModel] = []
    for part in text.split("+"):
        count, _, name = part.strip().partition("x")
        if not count.isdigit() or int(count) < 1 or not name:
            raise ValueError(
                f"fleet {text!r}: part {part!r} is not COUNTxPROFILE (e.g. 4xa100-llama2-7b)"
            )
        try:
            out.extend([load_profile(name)] * int(count))
        except ValueError as exc:
            raise ValueError(f"fleet {text!r}: {exc}") from None
    return tuple(out)


def scenario_fleet(
    scenario: str, profiles: tuple[StepModel, ...], steady: bench.Steady
) -> tuple[bench.Fleet, float | None]:
    """The fleet of a scenario and when its change happens (None: nothing changes then)."""
    third = steady.warmup_s + (steady.duration_s - steady.warmup_s) / 3
    half = steady.duration_s / 2
    events: dict[str, tuple[float | None, tuple[GpuEvent, ...]]] = {
        "mixed": (None, ()),
        "steady": (None, ()),
        "throttle": (third, (GpuEvent(third, clock_cap=0.6),)),
        "recover": (half, (GpuEvent(0.0, clock_cap=0.6), GpuEvent(half, clock_cap=1.0))),
        "neighbour": (third, (GpuEvent(third, contention=0.5),)),
        "fan": (None, (GpuEvent(0.0, cooling=0.25),)),
        "quiet": (half, (GpuEvent(0.0, contention=0.5), GpuEvent(half, contention=0.0))),
    }
    if scenario not in events:
        raise ValueError(f"unknown fleet scenario {scenario!r}: {', '.join(SCENARIOS)}")
    at, evs = events[scenario]
    prior = profiles[0] if scenario == "mixed" else None
    return bench.Fleet(profiles, {0: evs} if evs else {}, prior=prior), at


def variant_fleets(
    fleet: bench.Fleet, scenario: str = "", base: DispatchSettings | None = None
) -> dict[str, tuple[bench.Variant, bench.Fleet]]:
    v = bench.variants(base)
    out = {
        "least-load": (v["least-load"], fleet),
        "steersman": (v["steersman"], fleet),
        "steersman-frozen": (v["steersman"], replace(fleet, learn=False)),
    }
    if scenario == "quiet":
        out["steersman-remembers"] = (v["steersman"], replace(fleet, forget=False))
    return out


def tracking(learned: Sequence[tuple[float, int, float, float]], at: float) -> dict[str, Any]:
    """How long instance 0's latency model took to follow a change at ``at``. Its learned speed
    (``LatencyModel.speed``) is taken relative to the other instances' (the median of their
    latest: the serving stack they share moves them all), against the same ratio of the GPUs'
    true slowdowns; the error is that over its median in the 30 s before the change, minus one.
    Tracked at the first outcome after which 20 in a row are within ``TRACKED``.

    >>> before = [(t + d, k, 1.2, 1.0) for t in range(70, 100) for k, d in ((1, 0), (0, .5))]
    >>> after = [(100 + t + d, k, 1.2 * (min(1 + t / 10, 1.6) if k == 0 else 1), 1.6 if k == 0
    ...           else 1.0) for t in range(60) for k, d in ((1, 0), (0, .5))]
    >>> tracking(before + after, 100.0)
    {'requests': 5, 'seconds': 5.5, 'error_before': 0.0, 'error_after_200': None}
    """
    latest: dict[int, tuple[float, float]] = {}
    mine = []  # (time, relative speed over relative truth) at instance 0's outcomes
    for t, k, speed, truth in sorted(learned):
        latest[k] = (speed, truth)
        others = [v for j, v in latest.items() if j != 0]
        if k == 0 and others:
            f = speed / statistics.median(v[0] for v in others)
            truth_ratio = truth / statistics.median(v[1] for v in others)
            mine.append((t, f / truth_ratio))
    base = [r for t, r in mine if at - 30 <= t < at]
    after = [(t, r) for t, r in mine if t >= at]
    if not base or not after:
        return {"requests": None, "seconds": None}
    ref = statistics.median(base)
    errors = [abs(r / ref - 1) for _, r in after]
    found = next((i for i in range(len(errors) - 19) if max(errors[i : i + 20]) < TRACKED), None)
    return {
        "requests": found,
        "seconds": None if found is None else round(after[found][0] - at, 2),
        "error_before": round(statistics.fmean(abs(r / ref - 1) for r in base), 4),
        "error_after_200": round(statistics.fmean(errors[200:]), 4) if errors[200:] else None,
    }


@dataclass(frozen=True)
class FleetOptions:
    fleet: str = "4xa100-llama2-7b+4xa30-llama2-7b"
    homogeneous: str = "8xa100-llama2-7b"
    scenarios: tuple[str, ...] = SCENARIOS
    slo_ttft_s: float = 1.0
    level: float = 0.8  # the change scenarios' load, of least-load's capacity on the fleet
    quiet_level: float = 0.1  # the quiet scenario's
    steady: bench.Steady = field(default_factory=bench.Steady)
    seed: int = 0
    seeds: int = 5  # the steady scenario's arrival seeds (learning's cost judged on their mean)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)  # steersman's


def run(
    items: Sequence[bench.Item],
    trace: Trace,
    options: FleetOptions,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every scenario, every policy, on identical requests and arrivals."""
    mixed, homogeneous = parse_fleet(options.fleet), parse_fleet(options.homogeneous)
    steady = options.steady
    out: dict[str, Any] = {"options": _described(options), "scenarios": {}}
    base_capacity: float | None = None
    for scenario in options.scenarios:
        profiles = mixed if scenario == "mixed" else homogeneous
        fleet, at = scenario_fleet(scenario, profiles, steady)
        runs: dict[str, Any] = {}
        if scenario == "mixed":
            runs = _capacities(items, trace, fleet, options, say)
            out["mixed_parts"] = _parts(items, trace, profiles, options, say)
        else:
            if base_capacity is None:
                base_capacity = _capacity("least-load", items, trace, fleet, options)
                out["floor"] = _floor(items, trace, profiles, base_capacity, options)
            level = options.quiet_level if scenario == "quiet" else options.level
            rate = level * base_capacity
            for name, (variant, f) in variant_fleets(fleet, scenario, options.dispatch).items():
                r = bench.steady_run(name, variant, items, trace, rate, profiles[0],
                                     len(profiles), steady, seed=options.seed, fleet=f)  # fmt: skip
                runs[name] = _summary(r, at)
                say(_line(scenario, name, runs[name]))
            if scenario == "steady":  # the same policy without simulated GPUs or learning
                r = _untouched(items, trace, rate, profiles, options, options.seed)
                runs["steersman-no-telemetry"] = _summary(r, None)
                say(_line(scenario, "steersman-no-telemetry", runs["steersman-no-telemetry"]))
                runs["seeds"] = _seeds(items, trace, rate, fleet, profiles, options, runs)
            runs["rate_rps"], runs["level"] = round(rate, 3), level
        out["scenarios"][scenario] = runs
    return out


def _untouched(items, trace, rate, profiles, options, seed) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    variant = bench.variants(options.dispatch)["steersman"]
    return bench.steady_run("steersman", variant, items, trace, rate, profiles[0], len(profiles),
                            options.steady, seed=seed)  # fmt: skip


def _seeds(items, trace, rate, fleet, profiles, options, runs) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The steady scenario's learning-against-untouched ratios over ``options.seeds`` arrival
    seeds: one run's tail moves by a few percent with any perturbation, so whether learning costs
    anything where nothing changes is judged on their mean."""
    pairs = [(runs["steersman"], runs["steersman-no-telemetry"])]
    steersman = bench.variants(options.dispatch)["steersman"]
    for seed in range(options.seed + 1, options.seed + options.seeds):
        r = bench.steady_run("steersman", steersman, items, trace, rate, profiles[0],
                             len(profiles), options.steady, seed=seed, fleet=fleet)  # fmt: skip
        pairs.append((r, _untouched(items, trace, rate, profiles, options, seed)))
    out: dict[str, Any] = {"seeds": len(pairs)}
    for key in ("ttft_p99_s", "e2e_mean_s", "norm_mean_s"):
        ratios = [a[key] / b[key] for a, b in pairs if b[key]]
        out[key] = {
            "mean": round(statistics.fmean(ratios), 4),
            "min": round(min(ratios), 4),
            "max": round(max(ratios), 4),
        }
    return out


def _capacities(items, trace, fleet, options, say) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    runs: dict[str, Any] = {}
    near = None
    for name, (variant, f) in variant_fleets(fleet, base=options.dispatch).items():
        rate = _capacity(name, items, trace, f, options, near=near, variant=variant)
        near = near or rate
        r = bench.steady_run(name, variant, items, trace, 0.8 * near, f.profiles[0],
                             len(f.profiles), options.steady, seed=options.seed,
                             fleet=f)  # fmt: skip
        runs[name] = {"capacity_rps": round(rate, 3), "at_0.8": _summary(r, None)}
        say(f"mixed {name:<18} capacity {rate:.2f} req/s; at 0.8x least-load's: "
            + _line("", "", runs[name]["at_0.8"]))  # fmt: skip
    return runs


def _floor(items, trace, profiles, capacity, options) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Least-load's first tokens on the healthy fleet for the change scenarios' own requests,
    arriving ``level / FLOOR_LEVEL`` times as far apart (the run and its warm-up stretched as
    much, so the same requests are measured): each prompt's prefill with next to nothing beside
    it, which no dispatch rule goes below at any load."""
    stretch = options.level / FLOOR_LEVEL
    s = options.steady
    steady = replace(s, duration_s=stretch * s.duration_s, warmup_s=stretch * s.warmup_s)
    rate = FLOOR_LEVEL * capacity
    least_load = bench.variants(options.dispatch)["least-load"]
    r = bench.steady_run("least-load", least_load, items, trace, rate, profiles[0], len(profiles),
                         steady, seed=options.seed, fleet=bench.Fleet(profiles))  # fmt: skip
    keys = ("ttft_p50_s", "ttft_p99_s", "measured")
    return {"level": FLOOR_LEVEL, "rate_rps": round(rate, 3), **{k: r[k] for k in keys}}


def _parts(items, trace, profiles, options, say) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Least-load's capacity on each kind of the mixed fleet alone, and their sum: about what the
    whole fleet can carry at the SLO, however its requests are shared out."""
    kinds: dict[str, list[StepModel]] = {}
    for p in profiles:
        kinds.setdefault(p.name, []).append(p)
    parts = {}
    for name, group in kinds.items():
        label = f"{len(group)}x{name}"
        rate = _capacity("least-load", items, trace, bench.Fleet(tuple(group)), options)
        parts[label] = round(rate, 3)
        say(f"mixed, {label} alone: least-load capacity {rate:.2f} req/s")
    parts["sum"] = round(sum(parts.values()), 3)
    return parts


def _capacity(
    name: str,
    items: Sequence[bench.Item],
    trace: Trace,
    fleet: bench.Fleet,
    options: FleetOptions,
    *,
    near: float | None = None,
    variant: bench.Variant | None = None,
) -> float:
    variant = variant or bench.variants(options.dispatch)[name]
    p = fleet.profiles
    return bench.capacity(name, variant, items, trace, p[0], len(p), options.slo_ttft_s,
                          options.steady, start=10.0, near=near, seed=options.seed,
                          fleet=fleet)  # fmt: skip


def _summary(run: dict[str, Any], at: float | None) -> dict[str, Any]:
    keys = ("ttft_p50_s", "ttft_p99_s", "e2e_mean_s", "e2e_p99_s", "norm_mean_s", "stable",
            "measured", "preemptions", "served_by")  # fmt: skip
    out = {k: run[k] for k in keys}
    if at is not None and run["learned"]:
        out["tracking"] = tracking(run["learned"], at)
    if at is not None:
        after = [k for t, k in run["dispatch_all"] if t >= at]
        out["instance0_after_change"] = after.count(0)
    mine = [(f, truth) for _, k, f, truth in run["learned"] if k == 0]
    if mine:
        out["instance0_speed_end"] = round(mine[-1][0], 4)
        out["instance0_slowdown_end"] = round(mine[-1][1], 4)
    return out


def _line(scenario: str, name: str, r: dict[str, Any]) -> str:
    track = r.get("tracking", {}).get("requests")
    return (
        f"{scenario} {name:<22} ttft p99 {r['ttft_p99_s']} e2e mean {r['e2e_mean_s']} "
        f"stable {r['stable']} served {r['served_by']}"
        + (f" tracked after {track} requests" if track is not None else "")
    )


def _described(options: FleetOptions) -> dict[str, Any]:
    s = options.steady
    return {
        "fleet": options.fleet,
        "homogeneous": options.homogeneous,
        "slo_ttft_p99_s": options.slo_ttft_s,
        "level": options.level,
        "quiet_level": options.quiet_level,
        "steady_state": {"duration_s": s.duration_s, "warmup_s": s.warmup_s, "growth": s.growth},
        "seed": options.seed,
        "seeds": options.seeds,
    }
