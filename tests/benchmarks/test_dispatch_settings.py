"""benchmarks.dispatch_settings: a changed setting runs beside the default, validated first."""

from __future__ import annotations

import doctest
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.dispatch_settings
from benchmarks.dispatch_settings import FIGURES, changed, compare, noisy
from steersman.control.harness import bench
from steersman.control.harness.bench_suite import SimOptions, scenario_run
from steersman.control.harness.workloads import load_trace
from steersman.control.sim.profiles import load_profile
from steersman.data import path
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY

ROOT = Path(__file__).resolve().parents[2]
STEERSMAN = bench.variants()["steersman"]


@pytest.mark.parametrize(
    ("assignments", "named"),
    [
        ("admission=sometimes", "dispatch.admission = 'sometimes'"),
        ("no_such_setting=1", "dispatch.no_such_setting = '1'"),
        ("aging_s=0", "dispatch.aging_s = '0'"),
        ("ttft_weight", "'ttft_weight': expected field=value"),
    ],
)
def test_a_wrong_setting_is_refused_naming_it(assignments, named):
    with pytest.raises(ValueError, match=named):
        changed(STEERSMAN, assignments)


def test_variants_run_side_by_side_and_only_a_real_change_moves_the_figures():
    profile, trace = load_profile("a30-llama2-7b"), load_trace(path("azure_conv"))
    items = bench.trace_items(trace, [-0.7, 0.0, 0.7], 400, profile.max_model_len, seed=0)
    policies = {
        "least-load": bench.variants()["least-load"],
        "steersman": STEERSMAN,
        "steersman ttft_weight=3": changed(STEERSMAN, "ttft_weight=3"),  # the default again
        "steersman admission=none": changed(STEERSMAN, "admission=none"),
    }
    rows = {r["policy"]: r for r in compare(policies, items, trace, profile, "burst", 6.0,
                                             seeds=[0, 1], instances=2)}  # fmt: skip
    assert list(rows) == list(policies)
    assert rows["least-load"]["to_least-load"] == {f: 1.0 for f in FIGURES}
    default, same, other = (rows[p] for p in list(policies)[1:])
    for figure in FIGURES:
        assert len(default[figure]) == 2
        assert same[figure] == default[figure]  # deterministic, and the same settings
    # Without the KV admission every request goes to vLLM at once: the burst runs otherwise.
    assert other["norm_mean_s"] != default["norm_mean_s"]
    # Each ratio comes with its interval over the seeds, which holds the ratio itself.
    assert rows["least-load"]["to_least-load_90%"] == {f: [1.0, 1.0] for f in FIGURES}
    for row in (default, other):
        for figure, (lo, hi) in row["to_least-load_90%"].items():
            assert lo <= row["to_least-load"][figure] <= hi


def test_capacity_is_searched_per_policy_near_the_one_given():
    profile, trace = load_profile("a30-llama2-7b"), load_trace(path("azure_conv"))
    items = bench.trace_items(trace, [-0.7, 0.0, 0.7], 300, profile.max_model_len, seed=0)
    policies = {"least-load": bench.variants()["least-load"], "round-robin":
                bench.variants()["round-robin"]}  # fmt: skip
    rows = compare(policies, items, trace, profile, "capacity", 8.0, seeds=[0], instances=2)
    ll, rr = rows
    assert set(ll) >= {"capacity_rps", "capacity_rps_mean", "to_least-load"}
    assert "ttft_p99_s" not in ll
    assert ll["to_least-load"] == {"capacity_rps": 1.0}
    assert ll["capacity_rps_mean"] > 0
    # Round-robin ignores load: it holds the SLO no higher than least-load does.
    assert rr["to_least-load"]["capacity_rps"] <= 1.0


def test_the_docstring_examples_hold():
    result = doctest.testmod(benchmarks.dispatch_settings, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_noisy_predictions_err_by_the_spread_asked_and_carry_no_vectors():
    items = [bench.Item(20, 1 + k % 900, {BASE_KEY: 50.0, VECTOR_KEY: [0.1, 0.2]})
             for k in range(4000)]  # fmt: skip
    for sigma in (0.3, 0.9):
        got = noisy(items, sigma, seed=1)
        errors = [math.log(g.features[BASE_KEY] / g.output_tokens) for g in got]
        assert abs(statistics.pstdev(errors) - sigma) < 0.05 * sigma
        assert abs(statistics.fmean(errors)) < 0.05
        assert all(VECTOR_KEY not in g.features for g in got)
        assert [g.output_tokens for g in got] == [i.output_tokens for i in items]
    assert noisy(items, 0.5, seed=1) == noisy(items, 0.5, seed=1)  # the same draws each run
    assert items[0].features[BASE_KEY] == 50.0  # the items given are left as they were


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--scenario", "steady:x"], "--scenario: unknown scenario 'steady:x'"),
        (["--profile", "nope"], "--profile: unknown simulator profile 'nope'"),
        (["--policies", "fastest"], "--policies: unknown policy 'fastest'"),
        (["--set", "max_hold_s=-1"], "--set dispatch.max_hold_s = '-1'"),
        (["--vary", "steersman,fastest"], "--vary: unknown policy 'fastest'"),
        (["--vary", "vllm-priority", "--set", "aging_s=0"], "--set dispatch.aging_s = '0'"),
        (["--noise", "-1"], "--noise: -1.0 is not a spread"),
        (["--noise", "nan"], "--noise: nan is not a spread"),
    ],
)
def test_bad_arguments_are_refused_in_one_line_before_any_run(args, says):
    ran = subprocess.run([sys.executable, "-m", "benchmarks.dispatch_settings", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 1
    assert ran.stdout == ""
    assert ran.stderr.strip().splitlines() == [ran.stderr.strip()]
    assert ran.stderr.startswith(says)


def test_its_burst_seeds_are_the_suites_burst_runs_one_for_one():
    """The two harnesses measure the same runs: seed s here is the suite's burst from point s."""
    profile, trace = load_profile("a30-llama2-7b"), load_trace(path("azure_conv"))
    items = bench.trace_items(trace, [-0.7, 0.0, 0.7], 400, profile.max_model_len, seed=0)
    policies = {name: bench.variants()[name] for name in ("least-load", "steersman")}
    rows = compare(policies, items, trace, profile, "burst", 6.0, seeds=[0, 1], instances=2)
    options = SimOptions(instances=2, requests=len(items), burst_repeats=2, workers=1)
    for row in rows:
        name = row["policy"]
        suite, _ = scenario_run("burst", name, policies[name], items, trace, 6.0, profile, options)
        assert row["norm_mean_s"] == suite["norm_mean_by_run"]
