"""Fleets that differ and GPUs that slow down, in virtual time: small runs, exact outcomes."""

from __future__ import annotations

import random

import pytest

from steersman.control.harness import bench, bench_report, fleet
from steersman.control.harness.workloads import Trace, TraceRow

STEADY = bench.Steady(duration_s=90.0, warmup_s=15.0)


@pytest.fixture(scope="module")
def workload() -> tuple[list[bench.Item], Trace]:
    rng = random.Random(3)
    rows, t = [], 0.0
    for _ in range(2000):
        t += rng.expovariate(1.0)
        rows.append(TraceRow(t, rng.randint(50, 800), rng.randint(20, 400)))
    trace = Trace(rows, skipped=0)
    errors = [rng.gauss(0.0, 0.5) for _ in range(500)]
    return bench.trace_items(trace, errors, 2000, 4096, 0), trace


def run(
    workload, scenario: str, name: str, rate: float = 6.0, steady: bench.Steady = STEADY
) -> tuple[dict, float | None]:
    items, trace = workload
    profiles = fleet.parse_fleet("2xa100-llama2-7b")
    f, at = fleet.scenario_fleet(scenario, profiles, steady)
    variant, chosen = fleet.variant_fleets(f, scenario)[name]
    r = bench.steady_run(name, variant, items, trace, rate, profiles[0], 2, steady, fleet=chosen)
    return r, at


def test_the_learning_model_follows_a_throttle_the_frozen_one_does_not_see(workload):
    learning, at = run(workload, "throttle", "steersman")
    assert at is not None
    mine = [(t, f, truth) for t, k, f, truth in learning["learned"] if k == 0]
    before = [f for t, f, _ in mine if t < at]
    after = [(f, truth) for t, f, truth in mine if t > at + 20]
    assert before and after and all(truth == pytest.approx(1 / 0.6) for _, truth in after)
    # What it learned of instance 0's speed rose by about the clock's drop.
    ratio = sorted(f for f, _ in after)[len(after) // 2] / sorted(before)[len(before) // 2]
    assert 1.4 < ratio < 2.0
    track = fleet.tracking(learning["learned"], at)
    assert track["requests"] is not None and track["seconds"] is not None
    frozen, _ = run(workload, "throttle", "steersman-frozen")
    assert frozen["learned"] == []  # frozen at the priors: nothing learned, no telemetry read
    assert sum(frozen["served_by"]) == sum(learning["served_by"]) == learning["measured"]


def test_nothing_changes_where_no_gpu_changes(workload):
    steady, _ = run(workload, "steady", "steersman")
    truths = {truth for _, _, _, truth in steady["learned"]}
    assert truths == {1.0}  # a healthy, moderately loaded GPU never throttles
    # The prefill each request decoded beside is counted, so what is learned of the GPU's speed
    # is its profile's, outcome after outcome, not a mean that swings with the load.
    for k in (0, 1):
        speeds = [s for _, j, s, _ in steady["learned"] if j == k][10:]
        assert len(speeds) > 100 and all(0.95 < s < 1.05 for s in speeds)
    assert steady["stable"] and steady["finished"] == steady["requests"]


def test_at_light_load_an_instance_judged_slow_is_tried_again_once_its_judgment_fades(workload):
    longer = bench.Steady(duration_s=150.0, warmup_s=15.0)  # 75 s after the neighbour leaves
    forgets, at = run(workload, "quiet", "steersman", rate=1.0, steady=longer)
    remembers, _ = run(workload, "quiet", "steersman-remembers", rate=1.0, steady=longer)
    assert at is not None

    def after(r):  # instance 0's (time, learned speed) at its outcomes after the change
        return [(t, f) for t, k, f, _ in r["learned"] if k == 0 and t >= at]

    assert len(after(forgets)) > len(after(remembers))
    # Back near its true speed (1x the others'), where the remembering model still plans the
    # neighbour's slowdown it can no longer see.
    assert after(forgets) and after(forgets)[-1][1] < 1.2
    last_remembered = [f for _, k, f, _ in remembers["learned"] if k == 0][-1]
    assert last_remembered > 1.3
    for r in (forgets, remembers):
        assert r["stable"] and sum(r["served_by"]) == r["measured"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4xa100-llama2-7b+x", "part 'x' is not COUNTxPROFILE"),
        ("0xa100-llama2-7b", "part '0xa100-llama2-7b' is not COUNTxPROFILE"),
        ("2xb200-llama9", "unknown simulator profile 'b200-llama9'"),
    ],
)
def test_a_bad_fleet_is_refused_naming_the_part(text, message):
    with pytest.raises(ValueError, match=message):
        fleet.parse_fleet(text)


def test_an_unknown_scenario_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown fleet scenario 'melt': mixed, throttle"):
        fleet.scenario_fleet("melt", fleet.parse_fleet("1xa100-llama2-7b"), STEADY)


def test_a_mixed_fleet_reports_capacities_and_what_each_kind_carries_alone(workload):
    items, trace = workload
    options = fleet.FleetOptions(
        fleet="1xa100-llama2-7b+1xa30-llama2-7b", scenarios=("mixed",), steady=STEADY
    )
    said: list[str] = []
    out = fleet.run(items, trace, options, say=said.append)
    mixed = out["scenarios"]["mixed"]
    assert set(mixed) == {"least-load", "steersman", "steersman-frozen"}
    for r in mixed.values():
        assert r["capacity_rps"] > 0 and r["at_0.8"]["stable"]
        assert len(r["at_0.8"]["served_by"]) == 2
    parts = out["mixed_parts"]
    assert set(parts) == {"1xa100-llama2-7b", "1xa30-llama2-7b", "sum"}
    assert parts["sum"] == pytest.approx(parts["1xa100-llama2-7b"] + parts["1xa30-llama2-7b"])
    assert parts["1xa100-llama2-7b"] > parts["1xa30-llama2-7b"]  # the faster GPU carries more
    report = "\n".join(bench_report.fleet_section(out))
    assert "### Mixed fleet: 1xa100-llama2-7b+1xa30-llama2-7b" in report
    assert "Each kind alone behind least-load" in report
    assert any("alone: least-load capacity" in line for line in said)


def test_the_first_token_floor_is_measured_once_and_bounds_the_throttled_tail(workload):
    items, trace = workload
    options = fleet.FleetOptions(
        homogeneous="2xa100-llama2-7b", scenarios=("throttle", "steady"), steady=STEADY, seeds=2
    )
    out = fleet.run(items, trace, options)
    floor = out["floor"]
    assert floor["level"] == fleet.FLOOR_LEVEL
    # The change scenarios' own requests, further apart: the same ones measured.
    assert floor["measured"] == out["scenarios"]["throttle"]["least-load"]["measured"]
    assert floor["rate_rps"] == pytest.approx(
        out["scenarios"]["throttle"]["rate_rps"] / 16, abs=1e-3
    )
    # Next to nothing beside each prompt: faster first tokens than the same fleet at 0.8x.
    for scenario in ("throttle", "steady"):
        assert floor["ttft_p99_s"] < out["scenarios"][scenario]["least-load"]["ttft_p99_s"]
    report = "\n".join(bench_report.fleet_section(out))
    assert "### 2xa100-llama2-7b: the first-token floor" in report
    assert "least-load's P99 with instance 0 throttled" in report
    # Learning's cost where nothing changes is judged over arrival seeds, not on one tail.
    seeds = out["scenarios"]["steady"]["seeds"]
    assert seeds["seeds"] == 2
    for key in ("ttft_p99_s", "e2e_mean_s", "norm_mean_s"):
        v = seeds[key]
        assert 0.8 < v["min"] <= v["mean"] <= v["max"] < 1.25
    assert "against `steersman-no-telemetry` over 2 arrival seeds" in report
    assert "| seeds |" not in report
