"""`steersman bench --suite qoe`: QoE capacity and an overload, side by side, on identical
requests and arrivals."""

from __future__ import annotations

import random

from steersman.control.harness import bench, bench_report, qoe_suite
from steersman.control.harness.workloads import load_trace
from steersman.data import path


def test_every_policy_gets_a_qoe_capacity_and_an_overload_on_the_same_arrivals():
    trace = load_trace(path("azure_conv"))
    rng = random.Random(1)
    errors = [rng.gauss(0.0, 0.8) for _ in range(200)]
    options = qoe_suite.QoeOptions(
        profiles=("a30-llama2-7b",),
        instances=2,
        policies=("least-load", "steersman-qoe", "andes-pausing"),
        overload_s=30.0,
        lead_s=5.0,
        steady=bench.Steady(40.0, 10.0),
        workers=1,
    )
    items = {"a30-llama2-7b": bench.trace_items(trace, errors, 400, 4096, 0)}
    said: list[str] = []
    out = qoe_suite.run(items, trace, options, say=said.append)
    (profile,) = out["profiles"]
    capacity, overload = profile["qoe_capacity_rps"], profile["overload"]
    assert set(capacity) == set(overload) == set(options.policies)
    assert all(rate > 0 for rate in capacity.values())
    requests = {r["requests"] for r in overload.values()}
    assert len(requests) == 1  # identical arrivals for every policy
    for r in overload.values():
        assert r["finished"] == r["requests"]  # an overload loses nothing
        assert 0 <= r["qoe_below_0_9"] <= 1  # p10 may exceed the mean (one stream far behind)
        assert 0 <= r["qoe_p10"] <= 1 and 0 <= r["qoe_mean"] <= 1
    assert overload["least-load"]["qoe_below_0_9"] > 0  # it was an overload
    assert len(said) == 2 * len(options.policies)
    report = "\n".join(bench_report.qoe_section(out))
    assert "### a30-llama2-7b x 2" in report
    rows = [row for row in report.splitlines() if row.startswith("| ") and "---" not in row]
    assert [row.split(" | ")[0] for row in rows[1:]] == [f"| {p}" for p in options.policies]
    assert "| least-load | " in report and " 1x | " in report  # least-load against itself
