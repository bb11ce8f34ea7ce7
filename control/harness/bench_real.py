"""The benchmark's real suite: every policy in turn behind the daemon, in front of the same two
vLLM CPU servers, on the identical replay."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from steersman.control.harness.demo import (
    DemoConfig,
    daemon_settings,
    history_summary,
    instances,
    run_replay,
    summarize_run,
)
from steersman.control.harness.workloads import WorkItem
from steersman.control.serve.daemon import Daemon, serving
from steersman.control.serve.settings import Settings

# What each policy means in a deployment. The baselines are the routers operators already use:
# every request goes straight to vLLM (no steersman queue, no priorities).
VARIANTS: dict[str, dict[str, Any]] = {
    "round-robin": {"dispatch": {"policy": "round-robin", "admission": "none"}, "baseline": True},
    "least-load": {"dispatch": {"policy": "least-load", "admission": "none"}, "baseline": True},
    "predictive": {"dispatch": {"policy": "predictive"}},
    "predictive-no-controller": {
        "dispatch": {"policy": "predictive"},
        "controller": {"enabled": False},
    },
    "oracle": {"dispatch": {"policy": "oracle"}, "controller": {"enabled": False}},
}


def run_real(
    config: DemoConfig, base: Settings, items: list[WorkItem], policies: list[str]
) -> list[dict[str, Any]]:
    results = []
    with instances(config) as specs:
        for policy in policies:
            variant = dict(VARIANTS[policy])
            baseline = variant.pop("baseline", False)
            run_specs = [{**s, "priority": False} if baseline else s for s in specs]
            run_config = replace(config, run_dir=config.run_dir / policy)
            run_config.run_dir.mkdir(parents=True, exist_ok=True)
            settings = daemon_settings(run_config, run_specs, base, variant)
            with serving(Daemon(settings)) as url:
                outcomes, wall = run_replay(url, items)
            summary = summarize_run(outcomes, wall, history_summary(settings.database_url))
            summary["policy"] = policy
            summary["ttft_all"] = [o.ttft_s for o in outcomes if o.ok and o.ttft_s is not None]
            summary["e2e_all"] = [o.e2e_s for o in outcomes if o.ok and o.e2e_s is not None]
            results.append(summary)
    return results
