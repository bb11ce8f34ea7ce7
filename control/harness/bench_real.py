"""The real suite of `steersman bench`: two vLLM CPU servers, each policy in turn behind the
daemon, on the identical replay, repeated; medians and spread.

Two workloads: a burst of independent prompts that builds real queues (the servers' KV caches
cut to a few blocks, so that, as on a GPU, memory runs out first), and multi-turn chats that
resend their history (prefix-cache hit rates from the servers' own counters). The baselines send
no priorities and no predictions, which makes the servers stock vLLM with its FCFS order. Each
run salts vLLM's prefix cache afresh (``cache_salt``), so no run finds another's blocks.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from typing import Any

import httpx

from steersman.control.harness.demo import (
    MAX_MODEL_LEN,
    DemoConfig,
    daemon_settings,
    front_door,
    history_summary,
    instances,
    run_replay,
    summarize_run,
)
from steersman.control.harness.prefix import conversations, work_items
from steersman.control.harness.workloads import WorkItem, build_workload, load_trace, trace_arrivals
from steersman.control.serve.daemon import Daemon, serving
from steersman.control.serve.settings import Settings
from steersman.control.training.bundled import bundled_records, held_out
from steersman.data import path
from steersman.learners.tokens import TokenCounter
from steersman.storage.query import percentile
from steersman.telemetry.vllm_metrics import parse_metrics

# What each policy means in a deployment.
VARIANTS: dict[str, dict[str, Any]] = {
    "least-load": {"dispatch": {"policy": "least-load", "admission": "none"}, "stock": True},
    # vLLM's priority policy fed steersman's priorities behind least-load, no steersman queue:
    # what the predictions earn without steersman's admission and dispatch.
    "vllm-priority": {
        "dispatch": {"policy": "least-load", "admission": "none", "engine_order": "always"},
        "predictions": False,
    },
    # As deployed by default: vLLM's built-in priority policy fed steersman's priorities.
    "steersman": {"predictions": False},
    # With steersman's vLLM scheduler class reading the predictions: what the class adds.
    "steersman-class": {},
    "oracle": {"dispatch": {"policy": "oracle"}, "controller": {"enabled": False}},
    # The class also applies the streamed-QoE rule (core.qoe_rule) to the readers' expectations;
    # every request goes to a server at once, where the rule sees it (as the simulated suite's).
    "steersman-qoe": {"qoe": {"enabled": True}, "dispatch": {"admission": "none"}},
}
BASELINES: dict[str, dict[str, Any]] = {
    "round-robin": {"dispatch": {"policy": "round-robin", "admission": "none"}, "stock": True},
    "prefix-affinity": {
        "dispatch": {"policy": "prefix-affinity", "admission": "none"},
        "stock": True,
    },
}
MULTITURN = ("round-robin", "least-load", "prefix-affinity", "steersman")
# Behind a real Envoy, steersman as its endpoint picker: "<policy>@envoy" beside "<policy>".
THROUGH_ENVOY = ("least-load", "steersman", "least-load@envoy", "steersman@envoy")
METRICS = (
    "e2e_mean_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "norm_mean_s",
    "prefix_hit_rate",
    "qoe_mean",
    "qoe_p10",
    "qoe_below_0_9",
    "qoe_at_least_0_5",
)


def burst_workload(counter: TokenCounter, n: int, seconds: float, seed: int) -> list[WorkItem]:
    """``n`` held-out prompts of mixed lengths arriving within ``seconds`` (the trace's shape)."""
    rng = random.Random(seed)
    times = trace_arrivals(load_trace(path("azure_conv")), n, n / seconds, rng)
    _, prompts = held_out(bundled_records())
    return build_workload(prompts, times, counter, rng, max_model_len=MAX_MODEL_LEN)


def multiturn_workload(counter: TokenCounter, n: int, seconds: float, seed: int) -> list[WorkItem]:
    """About ``n`` turns of chats of up to four turns from the held-out prompts, each turn
    resending the history, arriving within about ``seconds``."""
    _, prompts = held_out(bundled_records())
    chats = conversations(
        prompts,
        counter,
        count=max(1, n // 4),
        turns=4,
        think_s=2.0,
        max_model_len=MAX_MODEL_LEN,
        seed=seed,
    )
    return work_items(chats, "multiturn", rate=len(chats) / seconds)


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """(prompt tokens looked up, found cached), summed over the servers' own counters."""
    queries = hits = 0.0
    with httpx.Client(timeout=10.0) as client:
        for url in urls:
            m = parse_metrics(client.get(f"{url}/metrics").text)
            queries += m.prefix_cache_queries or 0.0
            hits += m.prefix_cache_hits or 0.0
    return queries, hits


def run_real(
    config: DemoConfig,
    base: Settings,
    items: list[WorkItem],
    policies: list[str],
    repeats: int = 1,
) -> list[dict[str, Any]]:
    """Every policy ``repeats`` times, interleaved (a slow spell of the machine hits all)."""
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    with instances(config) as specs:
        for repeat in range(repeats):
            for policy in policies:
                name, _, front = policy.partition("@")
                chosen = {**VARIANTS, **BASELINES}[name]
                variant = {k: v for k, v in chosen.items() if k not in ("stock", "predictions")}
                stock = chosen.get("stock", False)
                predictions = chosen.get("predictions", True)
                run_specs = [
                    {**s, "priority": not stock, "predictions": predictions} for s in specs
                ]
                run_dir = config.run_dir / f"{name}-{front or 'gateway'}-{repeat}"
                run_config = replace(config, run_dir=run_dir, front=front or "gateway")
                run_config.run_dir.mkdir(parents=True, exist_ok=True)
                if front == "envoy":
                    variant = {**variant, "epp": {"enabled": True, "port": 0}}
                settings = daemon_settings(run_config, run_specs, base, variant)
                urls = [s["url"] for s in specs if "url" in s]
                before = prefix_counters(urls) if urls else (0.0, 0.0)
                salt = {"cache_salt": f"{name}-{front or 'gateway'}-{repeat}"}  # vLLM refuses '@'

                daemon = Daemon(settings)
                with serving(daemon) as url, front_door(run_config, daemon, specs) as door:
                    outcomes, wall = run_replay(door or url, items, extra_body=salt)
                after = prefix_counters(urls) if urls else (0.0, 0.0)
                looked_up, found = after[0] - before[0], after[1] - before[1]
                summary = summarize_run(outcomes, wall, history_summary(settings.database_url))
                ok = [o for o in outcomes if o.ok]
                summary.update(qoe_spread([o.qoe for o in ok if o.qoe is not None]))
                summary.update(
                    policy=policy,
                    repeat=repeat,
                    e2e_mean_s=_round(statistics.fmean(o.e2e_s for o in ok)) if ok else None,
                    norm_mean_s=_round(
                        statistics.fmean(o.e2e_s / max(o.true_tokens, 1) for o in ok)
                    )
                    if ok
                    else None,
                    prefix_hit_rate=_round(found / looked_up) if looked_up else None,
                    ttft_all=[o.ttft_s for o in ok if o.ttft_s is not None],
                    e2e_all=[o.e2e_s for o in ok if o.e2e_s is not None],
                )
                runs[policy].append(summary)
    return [aggregate(policy, got) for policy, got in runs.items()]


def qoe_spread(qoes: list[float]) -> dict[str, float | None]:
    """Who fell behind their readers: the 10th percentile QoE, the shares below 0.9 and at
    least 0.5.

    >>> qoe_spread([1.0, 0.95, 0.6, 0.2])["qoe_below_0_9"]
    0.5
    """
    if not qoes:
        return dict.fromkeys(("qoe_p10", "qoe_below_0_9", "qoe_at_least_0_5"))
    return {
        "qoe_p10": _round(percentile(qoes, 0.10)),
        "qoe_below_0_9": _round(sum(q < 0.9 for q in qoes) / len(qoes)),
        "qoe_at_least_0_5": _round(sum(q >= 0.5 for q in qoes) / len(qoes)),
    }


def aggregate(policy: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats, with the spread (lowest, highest) of each metric."""
    out: dict[str, Any] = {
        "policy": policy,
        "repeats": len(runs),
        "requests": sum(r["requests"] for r in runs),
        "succeeded": sum(r["succeeded"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "prediction": runs[-1]["prediction"],
        "ttft_all": [v for r in runs for v in r["ttft_all"]],
        "e2e_all": [v for r in runs for v in r["e2e_all"]],
    }
    for metric in METRICS:
        values = [r[metric] for r in runs if r.get(metric) is not None]
        out[metric] = _round(statistics.median(values)) if values else None
        out[f"{metric}_spread"] = [min(values), max(values)] if values else None
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
