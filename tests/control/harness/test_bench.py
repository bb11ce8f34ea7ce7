"""The simulated bench's yardstick: capacity measured at steady state, whatever the request count
or what the cluster holds; arrivals that outlast the trace; a rate whose queue grows refused."""

from __future__ import annotations

import math
import random

import pytest

from steersman.control.harness import bench
from steersman.control.harness.bench_suite import SimOptions, scenario_run
from steersman.control.harness.workloads import load_trace
from steersman.control.sim.profiles import PROFILES
from steersman.data import path
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY
from steersman.learners.metrics import error_quantiles

TRACE = load_trace(path("azure_conv"))
A30 = PROFILES["a30-llama2-7b"]
STEADY = bench.Steady(duration_s=150, warmup_s=30)


def pool(n: int, seed: int, sigma: float = 0.4) -> list[bench.Item]:
    """Requests of a chat service's lengths, predicted within a factor of about ``e ** sigma``."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        out = int(min(3000, max(1, rng.lognormvariate(5.3, 1.0))))
        prompt = int(min(1000, max(4, rng.lognormvariate(4.5, 0.8))))
        items.append(bench.Item(prompt, out, {BASE_KEY: out * rng.lognormvariate(0, sigma)}))
    return items


def validation(items: list[bench.Item]) -> list[float] | None:
    """What a validation on these would say of the predictor's errors."""
    return error_quantiles(
        [math.log1p(i.features[BASE_KEY]) for i in items],
        [math.log1p(i.output_tokens) for i in items],
    )


def test_arrivals_beyond_the_trace_take_it_again():
    n = 3 * len(TRACE.rows)
    unit = bench.unit_arrivals("trace", TRACE, n, seed=0)
    assert len(unit) == n and unit == sorted(unit)
    assert n / unit[-1] == pytest.approx(1.0, rel=0.01)  # a mean rate of one a second
    assert unit == bench.unit_arrivals("trace", TRACE, n, seed=0)


@pytest.fixture(scope="module")
def least_load_capacity() -> float:
    variant = bench.variants()["least-load"]
    return bench.capacity("least-load", variant, pool(400, 1), TRACE, A30, 2, 1.0, STEADY)


def test_capacity_does_not_depend_on_how_many_requests_the_workload_holds(least_load_capacity):
    variant = bench.variants()["least-load"]
    other = bench.capacity("least-load", variant, pool(1600, 2), TRACE, A30, 2, 1.0, STEADY,
                           near=least_load_capacity)  # fmt: skip
    assert 2 < least_load_capacity < 40  # two memory-bound A30s
    assert other == pytest.approx(least_load_capacity, rel=0.1)


def test_above_capacity_the_backlog_grows_and_the_rate_is_refused(least_load_capacity):
    variant = bench.variants()["least-load"]
    items = pool(400, 1)
    run = bench.steady_run("least-load", variant, items, TRACE, 0.6 * least_load_capacity, A30,
                           2, STEADY)  # fmt: skip
    assert run["stable"] and run["ttft_p99_s"] <= 1.0
    assert run["window_s"] == [30, 150] and run["measured"] < run["requests"]
    over = bench.steady_run("least-load", variant, items, TRACE, 2 * least_load_capacity, A30,
                            2, STEADY)  # fmt: skip
    assert not over["stable"]


def _streamed(stalls=()) -> bench.SimRequest:
    r = bench.SimRequest("r", 0.0, prompt_tokens=10, output_tokens=50, generated=50)
    r.first_token_at, r.finished_at, r.stalls = 0.5, 10.0, list(stalls)
    return r


def test_qoe_counts_the_pause_a_preemption_made():
    kept_pace = bench._qoe(_streamed())
    paused = bench._qoe(_streamed([(1.0, 8.0, 5)]))  # 5 tokens by 1 s, nothing until 8 s
    assert kept_pace == 1.0
    assert paused < 0.9


def test_qoe_figures_count_who_fell_behind():
    fine, stalled = _streamed(), _streamed([(1.0, 8.0, 5)])
    out = bench.measure([fine, stalled], {}, (1.0, 0.1))
    assert out["qoe_below_0_9"] == 0.5 and out["qoe_at_least_0_5"] >= 0.5
    assert out["qoe_p10"] < out["qoe_mean"] < 1.0


QOE_POLICIES = (
    "andes",
    "steersman-qoe",
    "steersman-qoe-lengths",
    "andes-pausing",
    "steersman-qoe-pausing",
)


@pytest.mark.parametrize("policy", QOE_POLICIES)
def test_the_qoe_rule_runs_in_every_engine_of_its_policies(policy):
    assert bench.variants()[policy].qoe.enabled
    others = [v for p, v in bench.variants().items() if p not in QOE_POLICIES]
    assert all(v.qoe is None for v in others)


def test_a_run_records_when_the_controller_changed_mode_and_why():
    times = [0.5 * k for k in range(300)]
    constant = bench.run_sim("constant", bench.variants()["constant"], pool(300, 3), times, A30, 2)
    assert constant["modes"] and constant["fallbacks"] >= 1
    first = constant["modes"][0]
    assert first[2] == "FALLBACK" and first[1] >= 1  # after outcomes were scored
    assert "misses" in first[3] or "rank" in first[3]
    truth = bench.run_sim("oracle", bench.variants()["oracle"], pool(300, 3), times, A30, 2)
    assert truth["modes"] == [] and truth["fallbacks"] == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_bands_seeded_from_the_models_validation_spare_a_wide_predictor_a_cold_fallback(seed):
    """A predictor off by a factor of e**1.5 at one sigma misses the default band (x2) five times
    in its first outcomes; told what its validation measured, it is judged against that."""
    times = [0.25 * k for k in range(400)]
    items, steersman = pool(400, seed, sigma=1.5), bench.variants()["steersman"]
    cold = bench.run_sim("steersman", steersman, items, times, A30, 2)
    assert cold["fallbacks"] >= 1 and cold["modes"][0][1] <= 25
    errors = validation(pool(400, seed + 100, sigma=1.5))
    seeded = bench.run_sim("steersman", steersman, items, times, A30, 2, band_errors=errors)
    assert seeded["fallbacks"] == 0 and seeded["modes"] == []
    # A constant model that claims a good validation is caught as soon as without one.
    constant = [bench.Item(i.prompt_tokens, i.output_tokens, {BASE_KEY: 128.0}) for i in items]
    good = validation(pool(400, seed + 100, sigma=0.4))
    caught = bench.run_sim("steersman", steersman, constant, times, A30, 2, band_errors=good)
    plain = bench.run_sim("steersman", steersman, constant, times, A30, 2)
    assert caught["fallbacks"] >= 1 and caught["modes"][0][1] <= plain["modes"][0][1]


@pytest.mark.parametrize("scenario", ["steady:0.5", "burst"])
def test_every_scenario_of_the_suite_starts_its_bands_from_the_models_validation(scenario):
    """As the daemon does: the wide predictor above falls back from a factor-of-2 band, not
    from the bands its validation measured, in the steady runs and the burst alike."""
    items, steersman = pool(400, 1, sigma=1.5), bench.variants()["steersman"]
    errors = tuple(validation(pool(400, 101, sigma=1.5)) or ())
    steady = bench.Steady(duration_s=100.0, warmup_s=20.0)

    def run(band_errors: tuple[float, ...] | None) -> dict:
        options = SimOptions(instances=2, requests=400, steady=steady, burst_repeats=1,
                             band_errors=band_errors)  # fmt: skip
        return scenario_run(scenario, "steersman", steersman, items, TRACE, 4.0, A30, options)[0]

    assert run(None)["fallbacks"] >= 1
    assert errors and run(errors)["fallbacks"] == 0


def test_vllm_priority_oracle_orders_vllm_by_the_true_lengths_whatever_the_model_said():
    times = [0.05 * k for k in range(400)]  # 20 req/s on two A30s: a queue builds
    items = pool(400, 5)
    wrong = [bench.Item(i.prompt_tokens, i.output_tokens, {BASE_KEY: 1.0}) for i in items]
    oracle = bench.variants()["vllm-priority-oracle"]
    told = bench.run_sim("vllm-priority-oracle", oracle, items, times, A30, 2)
    misled = bench.run_sim("vllm-priority-oracle", oracle, wrong, times, A30, 2)
    for key in ("norm_mean_s", "ttft_p99_s", "served_by", "preemptions"):
        assert told[key] == misled[key]
    assert told["kv_held"] == 0 and told["fallbacks"] == 0  # no steersman queue, no controller
    fcfs = bench.run_sim("least-load", bench.variants()["least-load"], items, times, A30, 2)
    assert told["norm_mean_s"] < fcfs["norm_mean_s"]  # shortest first inside vLLM


def test_the_prompts_vectors_reach_the_corrector_through_the_simulated_core():
    """A base model that says the same of every prompt; the vectors tell long from short, and the
    similar-prompt prior learns which is which from the outcomes."""
    rng = random.Random(6)
    items = []
    for _ in range(400):
        long = rng.random() < 0.3
        vector = [1.0, rng.random() * 0.2] if long else [rng.random() * 0.2, 1.0]
        out = rng.randint(600, 1200) if long else rng.randint(5, 60)
        items.append(bench.Item(200, out, {BASE_KEY: 150.0, VECTOR_KEY: vector}))
    blind = [bench.Item(i.prompt_tokens, i.output_tokens, {BASE_KEY: 150.0}) for i in items]
    times = [0.1 * k for k in range(400)]  # 10 req/s on two A30s: a queue builds
    steersman = bench.variants()["steersman"]
    seen = bench.run_sim("steersman", steersman, items, times, A30, 2)
    not_seen = bench.run_sim("steersman", steersman, blind, times, A30, 2)
    assert seen["norm_mean_s"] < 0.9 * not_seen["norm_mean_s"], (seen, not_seen)


def test_the_burst_runs_each_point_of_the_trace_once_the_same_in_worker_processes():
    """Each repeat of the burst lands on another point of the trace, and a worker pool changes
    none of the figures (each run is deterministic wherever it runs)."""
    items, least_load = pool(400, 3), bench.variants()["least-load"]

    def burst(workers: int) -> dict:
        options = SimOptions(instances=2, requests=400, burst_repeats=3, workers=workers)
        return scenario_run("burst", "least-load", least_load, items, TRACE, 4.0, A30, options)[0]

    alone, pooled = burst(1), burst(2)
    assert alone["repeats"] == 3 and len(alone["norm_mean_by_run"]) == 3
    assert len(set(alone["norm_mean_by_run"])) == 3  # three points, three overloads
    assert pooled["norm_mean_by_run"] == alone["norm_mean_by_run"]
    mean = sum(alone["norm_mean_by_run"]) / 3
    assert pooled["norm_mean_s"] == alone["norm_mean_s"] == pytest.approx(mean, abs=1e-4)
