"""The Markdown report of `steersman bench`: every figure of results.json, in tables."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from steersman.control.harness.intervals import CONFIDENCE, ratio_interval

COLUMNS = (
    ("TTFT p50", "ttft_p50_s"),
    ("TTFT p99", "ttft_p99_s"),
    ("E2E mean", "e2e_mean_s"),
    ("E2E p50", "e2e_p50_s"),
    ("E2E p90", "e2e_p90_s"),
    ("E2E p99", "e2e_p99_s"),
    ("norm mean", "norm_mean_s"),
    ("norm p99", "norm_p99_s"),
    ("TPOT mean", "tpot_mean_s"),
    ("goodput", "goodput_rps"),
    ("QoE", "qoe_mean"),
    ("preempt", "preemptions"),
    ("queue wait", "queue_wait_mean_s"),
    ("engine wait", "engine_wait_mean_s"),
    ("FALLBACK", "fallback_share"),
    ("prefix hit", "prefix_hit_rate"),
)
RATIOS = ("norm_mean_s", "ttft_p50_s", "ttft_p99_s", "e2e_mean_s", "e2e_p99_s", "preemptions")
# Beside every policy to least-load, the comparisons the targets are read from: steersman to the
# same priorities handed to vLLM, and to what true lengths give.
PAIRED = (("steersman", "vllm-priority"), ("steersman", "oracle"))


def report(results: dict[str, Any]) -> str:
    lines = ["# steersman bench", "", f"Command: `{results['command']}`", ""]
    base = f", {results['length_model_base']}" if results.get("length_model_base") else ""
    lines.append(
        f"Started {results['started_at']}; length model `{Path(results['length_model']).name}`"
        f"{base}."
    )
    if changed := results.get("dispatch_changed"):
        settings = ", ".join(f"`{k} = {v!r}`" for k, v in changed.items())
        lines.append(f"Steersman's `[dispatch]` settings changed from the defaults: {settings}.")
    if results.get("sim"):
        lines += sim_section(results["sim"])
    if results.get("fleet"):
        lines += fleet_section(results["fleet"])
    if results.get("qoe"):
        lines += qoe_section(results["qoe"])
    if results.get("real"):
        lines += real_section(results["real"])
    return "\n".join(lines) + "\n"


def qoe_section(qoe: dict[str, Any]) -> list[str]:
    o = qoe["options"]
    s = o["steady_state"]
    lines = [
        "",
        "## Streamed quality of experience",
        "",
        "QoE as Andes defines it (first token expected within 1 s, then one every 0.2 s). "
        "QoE capacity: the highest steady rate at which 95% of streams reach QoE 0.9 (each run "
        f"{s['duration_s']:g} s of arrivals, the first {s['warmup_s']:g} s left out). Overload: "
        f"{o['base']:g}x least-load's QoE capacity for {o['lead_s']:g} s, {o['overload']:g}x for "
        f"{o['overload_s']:g} s, then {o['base']:g}x again; every request counted. `andes`: the "
        "QoE rule in every engine, no length predictions, behind least-load; `steersman-qoe`: "
        "steersman's dispatch and vLLM order with the rule, every request sent to an engine at "
        "once; `-lengths`: the rule weighs stalls by predicted lengths; `-pausing`: the rule "
        "may also pause (preempt) a stream once. Ratios are to least-load's.",
    ]
    for p in qoe["profiles"]:
        cap, over = p["qoe_capacity_rps"], p["overload"]
        ll_cap, ll = cap.get("least-load"), over.get("least-load", {})
        lines += [
            "",
            f"### {p['profile']} x {o['instances']}",
            "",
            "| policy | QoE capacity (req/s) | to least-load | overload: QoE < 0.9 | to least-load "
            "| QoE p10 | QoE mean | QoE >= 0.5 | TTFT p99 | E2E p99 | to least-load | "
            "preemptions |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in over.items():
            below, e2e = r["qoe_below_0_9"], r["e2e_p99_s"]
            cells = [
                name, _fmt(cap.get(name)), _ratio(cap.get(name), ll_cap), _fmt(below),
                _ratio(below, ll.get("qoe_below_0_9")), _fmt(r["qoe_p10"]), _fmt(r["qoe_mean"]),
                _fmt(r["qoe_at_least_0_5"]), _fmt(r["ttft_p99_s"]), _fmt(e2e),
                _ratio(e2e, ll.get("e2e_p99_s")), str(r["preemptions"]),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def sim_section(sim: dict[str, Any]) -> list[str]:
    goodput = sim["goodput"]
    lines = [
        "",
        "## Simulated clusters",
        "",
        f"Arrivals shaped like the `{sim['trace']}` trace; lengths: "
        + (
            "real held-out prompts with their real response lengths, predicted by the length model "
            "(and, as in the daemon, each prompt's vector handed to the similar-prompt prior)."
            if sim["lengths"] == "prompts"
            else "the trace's own, with predictions carrying the length model's measured error."
        ),
        "Capacity: the highest rate at which a policy keeps P99 TTFT <= "
        f"{sim['slo_ttft_p99_s']} s; scenario rates are shares of least-load's.",
        "Normalized latency (norm) is E2E per output token; goodput counts requests/s with "
        f"TTFT <= {goodput['ttft_s']} s and TPOT <= {goodput['tpot_s']} s. Times in seconds.",
    ]
    if sim.get("scaling"):
        lines.append(
            f"Prefixes: {sim['scaling']}; requests over the model's window left out (as vLLM "
            f"would refuse them): {sim['refused_over_window']}; trace lines skipped: "
            f"{sim['skipped_lines']}. Prefix hit: prompt tokens found cached over those looked "
            "up, as vLLM counts them."
        )
    for p in sim["profiles"]:
        lines += [
            "",
            f"### {p['instances']} x {p['profile']} ({p['kv_capacity_tokens']:,} KV tokens each)",
            "",
        ]
        steady = p.get("steady_state")
        if steady:
            lines += [
                f"Steady state: each rate of the capacity search, each steady level and the "
                f"gamma arrivals run for {steady['duration_s']:g} s of simulated arrivals; the "
                f"first {steady['warmup_s']:g} s are left out of every figure, and a rate whose "
                "backlog (steersman's queue and the engines') still grows over the measured "
                f"window (its last fifth above {steady['growth']:g}x its first, plus one request "
                f"per instance) fails the SLO whatever its percentile. The burst replays "
                f"{p['requests']:,} requests.",
                "",
            ]
        lines += [
            "Capacity at the SLO, requests/s: "
            + ", ".join(f"{k} {v}" for k, v in p["capacity_at_slo_rps"].items()),
        ]
        capacity = p["capacity_at_slo_rps"]
        if capacity.get("least-load"):
            lines += [
                "",
                "Capacity to least-load's: "
                + ", ".join(
                    f"{k} {_ratio(v, capacity['least-load'])}"
                    for k, v in capacity.items()
                    if k != "least-load"
                )
                + ".",
            ]
        for s in p["scenarios"]:
            lines += ["", f"#### {s['scenario']}: {s['detail']}", "", table(s["runs"])]
            lines += ["", ratios(s["runs"])]
        lines += ["", f"![capacity]({p['profile']}_capacity.png)"]
        if any(s["scenario"] == "burst" for s in p["scenarios"]):
            lines += [f"![burst]({p['profile']}_burst.png)"]
    return lines


def per_run(by: dict[str, dict[str, Any]]) -> str:
    """The spread of each policy's share of least-load's over the runs of a repeated scenario
    (the burst: each run from another point of the trace).

    >>> per_run({"least-load": {"norm_mean_by_run": [2.0, 4.0, 4.0]},
    ...          "steersman": {"norm_mean_by_run": [1.0, 1.0, 3.0]}})
    'steersman 0.25-0.75 (median 0.5)'
    """
    base = by.get("least-load", {}).get("norm_mean_by_run")
    if not base:
        return ""
    parts = []
    for name, r in by.items():
        runs = r.get("norm_mean_by_run")
        if name == "least-load" or not runs or len(runs) != len(base):
            continue
        shares = sorted(x / b for x, b in zip(runs, base, strict=True) if b)
        if shares:
            median = statistics.median(shares)
            parts.append(f"{name} {shares[0]:.2f}-{shares[-1]:.2f} (median {median:.2g})")
    return ", ".join(parts)


def paired(by: dict[str, dict[str, Any]]) -> str:
    """Each policy's normalized latency to least-load's, and steersman's to the policies it is
    judged against, over the runs of a repeated scenario, with the bootstrap interval of each
    ratio (the runs resampled in pairs).

    >>> paired({"least-load": {"norm_mean_by_run": [2.0, 4.0, 4.0]},
    ...         "steersman": {"norm_mean_by_run": [1.0, 2.0, 2.0]}})
    'steersman to least-load 0.500x (0.500-0.500)'
    """
    parts = []
    to_least_load = [(name, "least-load") for name in by if name != "least-load"]
    for name, other in [*to_least_load, *PAIRED]:
        a = by.get(name, {}).get("norm_mean_by_run")
        b = by.get(other, {}).get("norm_mean_by_run")
        if a and b and (got := ratio_interval(a, b)):
            point, lo, hi = got
            parts.append(f"{name} to {other} {point:.3f}x ({lo:.3f}-{hi:.3f})")
    return ", ".join(parts)


def table(runs: list[dict[str, Any]]) -> str:
    head = "| policy | " + " | ".join(label for label, _ in COLUMNS) + " |"
    rows = [head, "|---" * (len(COLUMNS) + 1) + "|"]
    for r in runs:
        rows.append(f"| {r['policy']} | " + " | ".join(_fmt(r.get(k)) for _, k in COLUMNS) + " |")
    return "\n".join(rows)


def ratios(runs: list[dict[str, Any]]) -> str:
    by = {r["policy"]: r for r in runs}
    base = by.get("least-load")
    if base is None:
        return ""
    parts = []
    for name in (
        "steersman",
        "steersman-class",
        "oracle",
        "constant",
        "vllm-priority",
        "steersman-qoe",
    ):
        if name not in by:
            continue
        got = [f"{m} {_ratio(by[name].get(m), base.get(m))}" for m in RATIOS]
        parts.append(f"{name}: " + ", ".join(got))
    text = "Ratios to least-load: " + "; ".join(parts) + "."
    if spread := per_run(by):
        text += " Per run, normalized latency to least-load's in the same run: " + spread + "."
    if sure := paired(by):
        text += (
            f" Mean normalized latency with its {CONFIDENCE:.0%} interval over the runs"
            f" (resampled in pairs; one training of the length model): {sure}."
        )
    if "least-load@envoy" in by and "steersman@envoy" in by:
        envoy, mine = by["least-load@envoy"], by["steersman@envoy"]
        got = [f"{m} {_ratio(mine.get(m), envoy.get(m))}" for m in RATIOS]
        text += " Behind Envoy, steersman as its picker, to least-load behind Envoy: "
        text += ", ".join(got) + "."
    for other in ("prefix-affinity", "round-robin"):
        if other in by and "steersman" in by and by[other].get("prefix_hit_rate"):
            got = [
                f"{m} {_ratio(by['steersman'].get(m), by[other].get(m))}"
                for m in ("prefix_hit_rate", "ttft_p50_s", "ttft_p99_s", "e2e_mean_s")
            ]
            text += f" steersman to {other}: " + ", ".join(got) + "."
    return text


FLEET = (
    ("TTFT p50", "ttft_p50_s"),
    ("TTFT p99", "ttft_p99_s"),
    ("E2E mean", "e2e_mean_s"),
    ("E2E p99", "e2e_p99_s"),
    ("norm mean", "norm_mean_s"),
)
CHANGES = {
    "throttle": "instance 0's clock capped at 60% from a third of the measured window on",
    "recover": "instance 0 capped at 60% from the start, back to full clock at half the run",
    "neighbour": "another tenant takes half of instance 0's SMs from a third of the measured "
    "window on",
    "fan": "instance 0's cooling at a quarter of normal from the start (it heats up and throttles "
    "itself)",
    "steady": "nothing changes",
    "quiet": "at light load, another tenant takes half of instance 0's SMs from the start and "
    "leaves at half the run",
}


def fleet_section(fleet: dict[str, Any]) -> list[str]:
    o = fleet["options"]
    s = o["steady_state"]
    lines = [
        "",
        "## Fleets that differ and GPUs that slow down",
        "",
        "Simulated GPUs report telemetry through the sampler; `steersman` plans with latency "
        "models that learn from outcomes and the GPUs' clocks, `steersman-frozen` with the same "
        f"priors, frozen. Each run: {s['duration_s']:g} s of arrivals, the first "
        f"{s['warmup_s']:g} s left out; capacity at P99 TTFT <= {o['slo_ttft_p99_s']} s. "
        "Ratios are to least-load's. Instance 0's speed is what its latency model learned of "
        "its GPU at its last outcome (the clock and the speed residual over its profile; the "
        "prefill interference it plans with besides is left out), against its GPU's true "
        "slowdown then.",
    ]
    mixed = fleet["scenarios"].get("mixed")
    if mixed:
        base = mixed["least-load"]["capacity_rps"]
        lines += [
            "",
            f"### Mixed fleet: {o['fleet']}",
            "",
            "Every instance declared as the first profile (what an instance given only by URL "
            "is planned with); the figures at 0.8x least-load's capacity.",
            "",
            "| policy | capacity (req/s) | to least-load | TTFT p99 | E2E mean | served per "
            "instance |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in mixed.items():
            at = r["at_0.8"]
            lines.append(
                f"| {name} | {_fmt(r['capacity_rps'])} | {_ratio(r['capacity_rps'], base)} | "
                f"{_fmt(at['ttft_p99_s'])} | {_fmt(at['e2e_mean_s'])} | {at['served_by']} |"
            )
        parts = fleet.get("mixed_parts") or {}
        if parts:
            alone = ", ".join(f"{k} {_fmt(v)}" for k, v in parts.items() if k != "sum")
            lines += [
                "",
                f"Each kind alone behind least-load: {alone} req/s; their sum, "
                f"{_fmt(parts['sum'])} req/s ({_ratio(parts['sum'], base)} least-load's on the "
                "mixed fleet), is about what the fleet can carry at the SLO however it shares "
                "requests out.",
            ]
    floor = fleet.get("floor")
    if floor:
        throttled = fleet["scenarios"].get("throttle", {}).get("least-load", {})
        lines += [
            "",
            f"### {o['homogeneous']}: the first-token floor",
            "",
            f"Least-load on the healthy fleet, the change scenarios' {floor['measured']} "
            f"measured requests arriving {o['level'] / floor['level']:g} times as far apart "
            f"({_fmt(floor['rate_rps'])} req/s, {floor['level']:g}x its capacity): TTFT p50 "
            f"{_fmt(floor['ttft_p50_s'])} s, p99 "
            f"{_fmt(floor['ttft_p99_s'])} s"
            + (
                f" ({_ratio(floor['ttft_p99_s'], throttled['ttft_p99_s'])} least-load's P99 "
                "with instance 0 throttled)"
                if throttled
                else ""
            )
            + ". Each prompt's prefill with next to nothing beside it: no dispatch rule brings "
            "a P99 TTFT below it at any load, so it bounds what the scenarios below can gain on "
            "their first-token tails.",
        ]
    for scenario, runs in fleet["scenarios"].items():
        if scenario == "mixed":
            continue
        tracked = any("tracking" in r for r in runs.values() if isinstance(r, dict))
        lines += [
            "",
            f"### {o['homogeneous']}, {scenario}: {CHANGES.get(scenario, scenario)}",
            "",
            f"At {_fmt(runs['rate_rps'])} req/s ({runs.get('level', o['level']):g}x least-load's "
            "capacity on it); to instance 0: requests in the window (after the change)."
            + (
                " Tracked: requests on instance 0 (and seconds) after the change until its "
                "speed, relative to the others', stays within 10% of its true slowdown's."
                if tracked
                else ""
            ),
            "",
            "| policy | "
            + " | ".join(label for label, _ in FLEET)
            + " | to instance 0 | its speed at the end (true slowdown) |"
            + (" tracked after |" if tracked else ""),
            "|---" * (len(FLEET) + 3 + tracked) + "|",
        ]
        base = runs.get("least-load", {})
        for name, r in runs.items():
            if not isinstance(r, dict) or name == "seeds":  # the rate, the level, the seeds
                continue
            track = r.get("tracking") or {}
            after = (
                f"{track['requests']} ({_fmt(track['seconds'])} s)"
                if track.get("requests") is not None
                else "-"
            )
            cells = [f"{_fmt(r[m])} ({_ratio(r[m], base.get(m))})" for _, m in FLEET]
            lines.append(
                f"| {name} | "
                + " | ".join(cells)
                + f" | {r['served_by'][0]}"
                + (f" ({r['instance0_after_change']})" if "instance0_after_change" in r else "")
                + f" | {_speed(r)} |"
                + (f" {after} |" if tracked else "")
            )
        if seeds := runs.get("seeds"):
            spread = ", ".join(
                f"{label} {v['mean']:.3f}x ({v['min']:.3f}-{v['max']:.3f}x)"
                for label, v in (
                    ("P99 TTFT", seeds["ttft_p99_s"]),
                    ("E2E mean", seeds["e2e_mean_s"]),
                    ("norm mean", seeds["norm_mean_s"]),
                )
            )
            lines += [
                "",
                f"`steersman` against `steersman-no-telemetry` over {seeds['seeds']} arrival "
                f"seeds, mean (range): {spread}.",
            ]
    return lines


REAL = (
    "e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "ttft_p50_s", "ttft_p99_s", "norm_mean_s",
    "qoe_mean", "qoe_at_least_0_5",
)  # fmt: skip


def real_section(real: dict[str, Any]) -> list[str]:
    multiturn = real.get("workload") == "multiturn"
    if real.get("workload") == "envoy":
        title = f"a burst of {real['requests']} requests in {real['seconds']:g} s, behind Envoy too"
        setup = (f"{real['kv_blocks']} KV blocks of 128 tokens each; `@envoy`: through a real "
                 "Envoy, steersman as its endpoint picker, the same daemon otherwise")  # fmt: skip
    elif multiturn:
        title = f"multi-turn chats, {real['requests']} turns in about {real['seconds']:g} s"
        setup = "each turn resending its history; prefix hit from the servers' own counters"
    else:
        title = f"a burst of {real['requests']} requests in {real['seconds']:g} s"
        setup = f"{real['kv_blocks']} KV blocks of 128 tokens each, so memory runs out first"
    metrics = REAL + (("prefix_hit_rate",) if multiturn else ())
    lines = [
        "",
        f"## Real vLLM CPU: {title}",
        "",
        f"Two servers (one core each, the tiny model; {setup}), {real['repeats']} repeats of each "
        "policy, interleaved; medians, with the lowest and highest run in brackets. Fast path: "
        "the share of predictions RoBERTa did not make within its deadline.",
        "",
        "| policy | ok | E2E mean | E2E p50 | E2E p99 | TTFT p50 | TTFT p99 | norm mean | QoE "
        "mean | QoE >= 0.5 |" + (" prefix hit |" if multiturn else "") + " fast path |",
        "|---" * (len(metrics) + 3) + "|",
    ]
    for r in real["runs"]:
        cells = [
            f"{_fmt(r.get(m))} [{_fmt((r.get(m + '_spread') or [None])[0])}, "
            f"{_fmt((r.get(m + '_spread') or [None, None])[-1])}]"
            for m in metrics
        ]
        paths = (r.get("prediction") or {}).get("paths") or {}
        fast = _ratio(paths.get("fast", 0), sum(paths.values())).rstrip("x")
        lines.append(
            f"| {r['policy']} | {r['succeeded']}/{r['requests']} | "
            + " | ".join(cells)
            + f" | {fast} |"
        )
    lines += ["", ratios(real["runs"]), "", "![E2E CDF](real_e2e_cdf.png)"]
    return lines


def _speed(run: dict[str, Any]) -> str:
    """Instance 0's learned speed at its last outcome, and the true slowdown then."""
    if "instance0_speed_end" not in run:
        return "-"
    return f"{_fmt(run['instance0_speed_end'])} ({_fmt(run['instance0_slowdown_end'])})"


def _ratio(a: Any, b: Any) -> str:
    return (
        f"{a / b:.3g}x" if isinstance(a, int | float) and isinstance(b, int | float) and b else "-"
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
