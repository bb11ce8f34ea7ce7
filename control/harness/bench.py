"""`steersman bench --suite sim`: policies side by side on identical simulated workloads.

A cluster of simulated vLLM instances (a GPU profile, or a calibrated one) runs in virtual time
behind the one scheduling core, under every policy in turn, with the same arrivals and the same
requests (fixed seeds). Requests are real held-out prompts with their real response lengths and
the length model's predictions (``lengths="prompts"``), or a trace's own input and output
lengths with predictions that carry the length model's measured error (``lengths="trace"``).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from steersman.control.core.qoe import qoe
from steersman.control.core.scheduler import Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings, QoeSettings
from steersman.control.harness.prefix import HashedTrace, mooncake_items
from steersman.control.harness.workloads import (
    Trace,
    build_workload,
    gamma_arrivals,
    trace_arrivals,
)
from steersman.control.sim.driver import CoreDriver
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.gpu import GpuEvent, SimGpu, SimGpuSource, spec_for
from steersman.control.sim.profiles import StepModel
from steersman.control.sim.virtual import run_cluster
from steersman.control.training.bundled import bundled_records, held_out
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY, LengthCorrector
from steersman.learners.features import request_features
from steersman.learners.latency import LatencyModel
from steersman.learners.metrics import error_quantiles
from steersman.learners.tokens import TokenCounter
from steersman.storage.query import percentile
from steersman.telemetry.sampler import Sampler

# The length model's ``predict_with_vectors``: log1p(tokens) per text, and its vector or None.
Predict = Callable[[list[str]], tuple[list[float], list[Any]]]
QOE_ON = QoeSettings(enabled=True)
QOE_PAUSING = QoeSettings(enabled=True, max_pauses=1)
QOE_LENGTHS = QoeSettings(enabled=True, predicted_lengths=True)
CONSTANT_TOKENS = 128.0  # what a predictor that knows nothing says: the corrector's prior


@dataclass(frozen=True)
class Variant:
    """A policy as deployed: steersman's core settings and the engines' scheduling policy."""

    dispatch: DispatchSettings
    engine: str  # "fcfs" | "priority" | "steersman" (steersman's vLLM scheduler class)
    predictor: str  # "none" | "learned" | "truth" | "constant"
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    priorities: bool = True
    qoe: QoeSettings | None = None  # the engines' streamed-QoE rule (core.qoe_rule)


def variants(base: DispatchSettings | None = None, engine: str = "steersman") -> dict[str, Variant]:
    """The policies compared: what operators run today (stock vLLM FCFS behind round-robin or
    least-load), vLLM's priority policy fed with steersman's predictions but no steersman
    queue, steersman complete (with vLLM's priority policy, and with steersman's scheduler class),
    and steersman with the class and the true lengths (the bound) or with a
    predictor that knows nothing (what the predictions themselves earn); and, for workloads that
    share prefixes, a router by prefix affinity in front of stock vLLM. ``base``: the `[dispatch]`
    settings steersman runs with (the defaults, or an operator's); the other policies take what
    they share with it (the aging that vLLM's priority policy reads) and set what defines them.

    >>> v = variants(DispatchSettings(aging_s=16))
    >>> v["steersman"].dispatch.aging_s, v["vllm-priority"].dispatch.aging_s
    (16.0, 16.0)
    >>> v["vllm-priority"].dispatch.policy, v["vllm-priority"].dispatch.admission
    ('least-load', 'none')
    """
    base = base or DispatchSettings()

    def dispatch(**changes: str) -> DispatchSettings:
        return base.model_copy(update=changes)

    lb = {"admission": "none"}
    out = {
        "round-robin": Variant(
            dispatch(policy="round-robin", **lb), "fcfs", "none", priorities=False
        ),
        "least-load": Variant(
            dispatch(policy="least-load", **lb), "fcfs", "none", priorities=False
        ),
        "vllm-priority": Variant(
            dispatch(policy="least-load", engine_order="always", **lb), "priority", "learned"
        ),
        # As deployed by default: vLLM's built-in priority policy fed steersman's priorities.
        "steersman": Variant(base, "priority", "learned"),
        # With steersman's vLLM scheduler class: what the class adds.
        "steersman-class": Variant(base, engine, "learned"),
        "oracle": Variant(
            dispatch(policy="oracle"), engine, "truth", ControllerSettings(enabled=False)
        ),
        # vllm-priority with the true lengths: what the order inside vLLM alone makes of perfect
        # predictions, against which steersman's queue and dispatch are judged.
        "vllm-priority-oracle": Variant(
            dispatch(policy="least-load", engine_order="always", **lb),
            "priority",
            "truth",
            ControllerSettings(enabled=False),
        ),
        "constant": Variant(base, engine, "constant"),
        "prefix-affinity": Variant(
            dispatch(policy="prefix-affinity", **lb), "fcfs", "none", priorities=False
        ),
    }
    # Andes as published: least-load with the QoE rule in every engine, no length predictions;
    # steersman with the rule, every request sent to an engine at once (admission none) where
    # the rule sees it, dispatch and vLLM's base order still by the predictions. -lengths: the
    # rule weighs stalls by predicted length; -pausing: it may pause a stream once, as Andes does.
    andes = replace(out["least-load"], qoe=QOE_ON)
    qoe = Variant(dispatch(**lb), "priority", "learned", qoe=QOE_ON)
    out.update(
        {
            "andes": andes,
            "steersman-qoe": qoe,
            "steersman-qoe-lengths": replace(qoe, qoe=QOE_LENGTHS),
            "andes-pausing": replace(andes, qoe=QOE_PAUSING),
            "steersman-qoe-pausing": replace(qoe, qoe=QOE_PAUSING),
        }
    )
    return out


# The policies compared by default; with prefixes in the workload, prefix-affinity joins them.
STANDARD = (
    "round-robin",
    "least-load",
    "vllm-priority",
    "steersman",
    "steersman-class",
    "oracle",
    "constant",
)
PREFIX = ("round-robin", "least-load", "prefix-affinity", "steersman", "oracle")


@dataclass(frozen=True)
class Fleet:
    """Instances that differ or change: a profile each, on a simulated GPU that reports
    telemetry, with ``events`` (instance -> its GPU's events: a throttle, a noisy neighbour);
    ``prior``, what the core is told each instance is (the profile a URL-only instance gets:
    None is each one's own); ``learn``: the latency models learn from outcomes and telemetry
    (False: frozen at the priors); ``forget``: what they learned fades while an instance
    finishes nothing (False: kept until outcomes change it)."""

    profiles: tuple[StepModel, ...]
    events: dict[int, tuple[GpuEvent, ...]] = field(default_factory=dict)
    prior: StepModel | None = None
    learn: bool = True
    forget: bool = True

    def engines(self, variant: Variant) -> list[SimEngine]:
        out = []
        for k, profile in enumerate(self.profiles):
            gpu = SimGpu(spec_for(profile.name), list(self.events.get(k, ())), index=k)
            aging = variant.dispatch.aging_s
            out.append(SimEngine(profile, variant.engine, aging, gpu=gpu, qoe=variant.qoe))
        return out

    def driver(self, core: Scheduler, engines: list[SimEngine], features: dict) -> CoreDriver:
        priors = [self.prior or p for p in self.profiles]
        steps = [p.coefficients() for p in priors]
        if not self.learn:
            return CoreDriver(core, steps, features=features)
        keep = {} if self.forget else {"forget_after_s": math.inf}
        models = [
            LatencyModel(p.coefficients(), reference_clock_mhz=spec_for(p.name).boost_mhz, **keep)
            for p in priors
        ]
        source = SimGpuSource(list(engines))
        source.open()
        sampler = Sampler(source, host="sim", clock=lambda: 0.0, wall=lambda: 0.0)
        return CoreDriver(core, steps, features=features, latency=models, sampler=sampler)


@dataclass(frozen=True)
class Item:
    prompt_tokens: int
    output_tokens: int
    features: dict[str, Any]  # with the base prediction under BASE_KEY
    prefix: tuple[int, ...] = ()  # segment hashes of the prompt and response (core.prefix)
    segment_tokens: int = 0


def prompt_items(
    counter: TokenCounter, predict: Predict, n: int, max_model_len: int, seed: int
) -> list[Item]:
    """Held-out prompts with their real response lengths, the length model's predictions and,
    where it has them, the prompts' vectors (the corrector's similar-prompt prior reads them,
    as in the daemon)."""
    rng = random.Random(seed)
    _, prompts = held_out(bundled_records())
    work = build_workload(prompts, [0.0] * n, counter, rng, max_model_len=max_model_len)
    items = []
    for start in range(0, len(work), 64):
        batch = work[start : start + 64]
        logs, vectors = predict([w.prompt for w in batch])
        for w, log, vector in zip(batch, logs, vectors, strict=True):
            x = _features(w.prompt, w.prompt_tokens, math.expm1(log))
            if vector is not None:
                x[VECTOR_KEY] = vector
            items.append(Item(w.prompt_tokens, w.true_tokens, x))
    return items


def trace_items(
    trace: Trace, errors: Sequence[float], n: int, max_model_len: int, seed: int
) -> list[Item]:
    """A trace's own lengths (cut to the model's window), each with a prediction that is the
    true length times ``exp(e)``, ``e`` drawn from ``errors``: the length model's log errors on
    held-out prompts, so the predictions are as good, and as bad, as the model's."""
    rng = random.Random(seed)
    start = rng.randrange(0, max(1, len(trace.rows) - n))
    items = []
    for row in trace.rows[start : start + n]:
        prompt = min(max(row.input_tokens, 1), max_model_len - 2)
        output = max(1, min(row.output_tokens, max_model_len - prompt - 1))
        base = output * math.exp(rng.choice(errors)) if errors else None
        items.append(Item(prompt, output, {BASE_KEY: base} if base else {}))
    return items


def hashed_items(
    trace: HashedTrace,
    errors: Sequence[float],
    n: int,
    block_tokens: int,
    max_model_len: int,
    seed: int,
) -> tuple[list[Item], list[int]]:
    """The hashed Mooncake trace's first ``n`` requests with their shared prefixes (each hash id
    ``block_tokens`` tokens) and predictions carrying the length model's measured error;
    (items, lines refused for overflowing the window)."""
    rng = random.Random(seed)
    raw, refused = mooncake_items(trace, n, block_tokens, max_model_len)
    items = []
    for r in raw:
        features = {BASE_KEY: r.output_tokens * math.exp(rng.choice(errors))} if errors else {}
        items.append(Item(r.prompt_tokens, r.output_tokens, features, r.prefix, r.segment_tokens))
    return items, refused


def model_errors(counter: TokenCounter, predict: Predict, n: int, seed: int) -> list[float]:
    """``log(predicted / actual)`` of the length model on ``n`` held-out prompts."""
    items = prompt_items(counter, predict, n, 4096, seed)
    return [
        math.log(max(i.features.get(BASE_KEY, 1.0), 1.0) / max(i.output_tokens, 1)) for i in items
    ]


def band_seed(errors: Sequence[float]) -> list[float] | None:
    """What a validation would say of predictions that carry ``errors`` (``log(predicted /
    actual)``, as ``model_errors`` measures): the quantiles the corrector's bands start from.

    >>> band_seed([0.7] * 20)[:2]  # predicted twice the truth: the truth is below the point
    [-0.7, -0.7]
    """
    return error_quantiles([0.0] * len(errors), [-e for e in errors])


def unit_arrivals(kind: str, trace: Trace, n: int, seed: int) -> list[float]:
    """Arrival times at a mean rate of one request a second: the trace's shape ("trace"), or a
    gamma process with a coefficient of variation ("gamma2" is 2, "gamma4" is 4). More requests
    than the trace holds take it again from another point, one pass after the other."""
    rng = random.Random(seed)
    if kind.startswith("gamma"):
        return gamma_arrivals(n, 1.0, float(kind[5:]), rng)
    if kind != "trace":
        raise ValueError(f"unknown arrival process {kind!r}")
    out: list[float] = []
    while len(out) < n:
        take = min(n - len(out), len(trace.rows))
        part = trace_arrivals(trace, take, 1.0, rng)
        start = out[-1] + 1.0 if out else 0.0
        out.extend(start + t for t in part)
    return out


@dataclass(frozen=True)
class Steady:
    """How a rate is measured at steady state, whatever the cluster holds: arrivals for
    ``duration_s`` of simulated time (requests cycling through the workload's), the first
    ``warmup_s`` left out of every figure, and the rate refused as unstable when the backlog
    (requests waiting in steersman's queue and in the engines) still grows at the end: over
    the last fifth of the measured arrivals its mean exceeds ``growth`` times the first
    fifth's, plus one request per instance."""

    duration_s: float = 180.0
    warmup_s: float = 45.0
    growth: float = 1.5

    def window(self) -> tuple[float, float]:
        return (self.warmup_s, self.duration_s)

    def growing(self, samples: Sequence[tuple[float, int, int, float]], instances: int) -> bool:
        """Whether the backlog was still growing (``samples``: the driver's time, steersman's
        queue, the engines' queues, KV usage).

        >>> Steady(100, 0).growing([(t, 0, 2, 0.5) for t in range(100)], 8)
        False
        >>> Steady(100, 0).growing([(t, t, 0, 1.0) for t in range(100)], 8)
        True
        """
        lo, hi = self.window()
        fifth = (hi - lo) / 5
        first = [d + w for t, d, w, _ in samples if lo <= t < lo + fifth]
        last = [d + w for t, d, w, _ in samples if hi - fifth <= t < hi]
        if not first or not last:
            return False
        return statistics.fmean(last) > self.growth * statistics.fmean(first) + instances


def steady_run(
    name: str,
    variant: Variant,
    items: Sequence[Item],
    trace: Trace,
    rate: float,
    profile: StepModel,
    instances: int,
    steady: Steady,
    *,
    kind: str = "trace",
    seed: int = 0,
    goodput: tuple[float, float] = (1.0, 0.1),
    fleet: Fleet | None = None,
    band_errors: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One policy at ``rate`` for ``steady.duration_s`` of arrivals (the trace's shape, or a
    gamma process), measured over the requests that arrived after the warm-up."""
    n = max(2, math.ceil(rate * steady.duration_s))
    times = [u / rate for u in unit_arrivals(kind, trace, n, seed)]
    times = [t for t in times if t < steady.duration_s] or times[:2]
    cycled = [items[i % len(items)] for i in range(len(times))]
    run = run_sim(name, variant, cycled, times, profile, instances, goodput=goodput,
                  window=steady.window(), fleet=fleet, band_errors=band_errors)  # fmt: skip
    run["stable"] = not steady.growing(run["samples"], instances)
    run["window_s"] = list(steady.window())
    return run


def run_sim(
    name: str,
    variant: Variant,
    items: Sequence[Item],
    times: Sequence[float],
    profile: StepModel,
    instances: int,
    *,
    goodput: tuple[float, float] = (1.0, 0.1),
    window: tuple[float, float] | None = None,
    fleet: Fleet | None = None,
    band_errors: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One policy on one workload: every request's arrival at ``times[i]`` (seconds); the
    figures are over the requests that arrived within ``window`` (all of them without one).
    With a ``fleet``, its instances instead of ``instances`` of ``profile``; ``band_errors``:
    the served model's validation errors, its bands before outcomes (as the daemon adopts)."""
    requests, features = [], {}
    for i, (item, t) in enumerate(zip(items, times, strict=True)):
        rid = f"r{i}"
        requests.append(
            SimRequest(
                rid,
                t,
                item.prompt_tokens,
                item.output_tokens,
                prefix=item.prefix,
                segment_tokens=item.segment_tokens,
            )
        )
        if variant.predictor == "learned":
            features[rid] = item.features
        elif variant.predictor == "constant":
            features[rid] = {BASE_KEY: CONSTANT_TOKENS}
        elif variant.predictor == "truth":  # what a policy that predicts reads: the truth
            features[rid] = {BASE_KEY: float(item.output_tokens)}
    corrector = LengthCorrector() if variant.predictor == "learned" else None
    if corrector is not None:
        corrector.adopt_errors(band_errors)
    core = Scheduler(
        variant.dispatch, variant.controller, corrector=corrector, priorities=variant.priorities
    )
    if fleet is None:
        driver = CoreDriver(core, profile.coefficients(), features=features)
        aging = variant.dispatch.aging_s
        engines = [
            SimEngine(profile, variant.engine, aging, qoe=variant.qoe) for _ in range(instances)
        ]
    else:
        engines = fleet.engines(variant)
        driver = fleet.driver(core, engines, features)
    started = time.perf_counter()
    run = run_cluster(requests, engines, driver)
    measured = run.finished
    if window is not None:
        measured = [r for r in measured if window[0] <= r.arrival < window[1]]
    out = measure(measured, driver.dispatched, goodput)
    out["measured"] = len(measured)
    out["samples"] = driver.samples
    out["learned"] = driver.learned
    by: list[list[float]] = [[] for _ in engines]
    for r in measured:
        if r.first_token_at is not None:
            by[driver.served[r.id]].append(r.first_token_at - r.arrival)
    out["served_by"] = [len(t) for t in by]
    out["dispatch_all"] = [(r.arrival, driver.served[r.id]) for r in run.finished]
    out["ttft_p99_by_instance"] = [_round(percentile(t, 0.99)) for t in by]
    out["ttft_by_arrival"] = [
        (r.arrival, r.first_token_at - r.arrival) for r in run.finished if r.first_token_at
    ]
    s = core.stats
    out.update(
        policy=name,
        requests=len(requests),
        finished=len(run.finished),
        wall_s=round(time.perf_counter() - started, 2),
        preemptions=sum(e.stats.preemptions for e in engines),
        fallback_share=round(s.fallback_decisions / max(s.decisions, 1), 3),
        fallbacks=s.fallbacks,
        modes=driver.modes,
        within_30=round(1 - s.misses / s.scored, 3) if s.scored else None,
        kv_held=s.kv_held,
        kv_overrides=s.kv_overrides,
        prefix_hit_rate=_hit_rate(engines),
    )
    return out


def _hit_rate(engines: Sequence[SimEngine]) -> float | None:
    """Prompt tokens found in the engines' prefix caches over tokens looked up (vLLM's)."""
    queries = sum(e.cache.queries for e in engines if e.cache is not None)
    hits = sum(e.cache.hits for e in engines if e.cache is not None)
    return round(hits / queries, 4) if queries else None


def measure(
    done: Sequence[SimRequest], dispatched: dict[str, float], goodput: tuple[float, float]
) -> dict[str, Any]:
    """Latency percentiles, normalized latency, TPOT, goodput, QoE and where requests waited."""
    ttft = [r.first_token_at - r.arrival for r in done if r.first_token_at is not None]
    e2e = [r.finished_at - r.arrival for r in done if r.finished_at is not None]
    tpot = [_tpot(r) for r in done if r.generated > 1]
    norm = [(r.finished_at - r.arrival) / max(r.generated, 1) for r in done if r.finished_at]
    queue = [dispatched[r.id] - r.arrival for r in done if r.id in dispatched]
    engine = [r.started_at - r.queued_at for r in done if r.started_at is not None]
    ttft_ok, tpot_ok = goodput
    good = sum(
        1
        for r in done
        if r.first_token_at is not None
        and r.first_token_at - r.arrival <= ttft_ok
        and (r.generated <= 1 or _tpot(r) <= tpot_ok)
    )
    span = max((r.finished_at or 0.0) for r in done) - min(r.arrival for r in done) if done else 0
    out: dict[str, Any] = {}
    for label, values in (("ttft", ttft), ("e2e", e2e), ("norm", norm), ("tpot", tpot)):
        out.update(_stats(label, values))
    out["queue_wait_mean_s"] = _round(statistics.fmean(queue)) if queue else None
    out["engine_wait_mean_s"] = _round(statistics.fmean(engine)) if engine else None
    out["goodput_rps"] = round(good / span, 3) if span > 0 else None
    qoes = [q for r in done if (q := _qoe(r)) is not None]
    out["qoe_mean"] = _round(statistics.fmean(qoes)) if qoes else None
    out["qoe_p10"] = _round(percentile(qoes, 0.10))
    out["qoe_below_0_9"] = round(sum(q < 0.9 for q in qoes) / len(qoes), 4) if qoes else None
    out["qoe_at_least_0_5"] = round(sum(q >= 0.5 for q in qoes) / len(qoes), 4) if qoes else None
    out["ttft_all"], out["e2e_all"] = ttft, e2e
    return out


def _tpot(r: SimRequest) -> float:
    return (r.finished_at - r.first_token_at) / (r.generated - 1)  # type: ignore[operator]


def _qoe(r: SimRequest) -> float | None:
    """Andes' QoE with the tokens paced evenly between the first token, each pause (a
    preemption: nothing new until it has recomputed) and the last (the simulator takes runs of
    decode steps in one go and keeps no per-token times)."""
    if r.first_token_at is None or r.finished_at is None:
        return None
    points: list[tuple[float, int]] = []
    t0, n0 = r.first_token_at, 1
    for paused, resumed, had in (*r.stalls, (r.finished_at, r.finished_at, r.generated)):
        k = max(1, min(32, had - n0))
        points += [(t0 + (paused - t0) * i / k - r.arrival, n0 + round((had - n0) * i / k))
                   for i in range(k + 1)]  # fmt: skip
        t0, n0 = resumed, had + 1
    ttft, pace = r.expectation or (1.0, 0.2)
    return qoe(points, r.generated, expected_ttft=ttft, expected_pace=pace)


def _stats(label: str, values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        f"{label}_mean_s": _round(statistics.fmean(values)) if values else None
    }
    for q in (50, 90, 99):
        out[f"{label}_p{q}_s"] = _round(percentile(values, q / 100))
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def capacity(
    name: str,
    variant: Variant,
    items: Sequence[Item],
    trace: Trace,
    profile: StepModel,
    instances: int,
    slo_ttft_p99_s: float,
    steady: Steady,
    *,
    start: float = 1.0,
    near: float | None = None,
    seed: int = 0,
    fleet: Fleet | None = None,
    meets: Callable[[dict[str, Any]], bool] | None = None,
    band_errors: Sequence[float] | None = None,
) -> float:
    """The highest steady arrival rate (to 2%) at which the policy keeps P99 TTFT within the
    bound (or the run ``meets`` another objective: ``qoe_objective``) and its backlog from
    growing (``steady``). ``near``, another policy's capacity,
    starts the search at it and within a fifth of it (policies differ by less; the search
    widens when the answer is outside), so a policy that holds the SLO at that rate is found
    at least as capable."""

    @functools.cache
    def ok(rate: float) -> bool:
        run = steady_run(name, variant, items, trace, rate, profile, instances, steady,
                         seed=seed, fleet=fleet, band_errors=band_errors)  # fmt: skip
        if meets is not None:
            return run["stable"] and meets(run)
        p99 = run["ttft_p99_s"]
        return run["stable"] and p99 is not None and p99 <= slo_ttft_p99_s

    step = 2.0
    low, high = start / 2, start
    if near is not None:  # on the other policy's grid: a policy as good finds the same rate
        step = 1.2
        low, high = (near, near * step) if ok(near) else (near / step, near)
    while ok(high):
        low, high = high, high * step
    while not ok(low) and low > 1e-3:
        low, high = low / step, low
    while high / low > 1.02:
        mid = (low * high) ** 0.5
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def qoe_objective(run: dict[str, Any]) -> bool:
    """Andes' high-QoE criterion: at least 95% of streams reach QoE 0.9.

    >>> qoe_objective({"qoe_below_0_9": 0.04}), qoe_objective({"qoe_below_0_9": 0.2})
    (True, False)
    """
    share = run.get("qoe_below_0_9")
    return share is not None and share <= 0.05


def _features(prompt: str, prompt_tokens: int, base: float) -> dict[str, Any]:
    x: dict[str, Any] = dict(request_features(prompt, prompt_tokens=prompt_tokens))
    if math.isfinite(base):
        x[BASE_KEY] = base
    return x
