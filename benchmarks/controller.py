"""The controller's scenarios, over several seeds: FALLBACK share on a stationary workload,
detection and recovery of a broken predictor, band coverage after an abrupt workload shift.

Run from the repository root:  python -m benchmarks.controller [--seeds 5]
Prints one JSON object per (scenario, seed) and one summary per scenario. Targets: FALLBACK
share <= 5% stationary; FALLBACK within 50 requests of a break; back to NORMAL within 300
requests after a better model; at most one FALLBACK entry per break or shift (a break that
outlasts one 60 s FALLBACK is entered again: that is the rule, not flapping, and is not counted);
band coverage back within 5 points of its target within 300 requests of a shift.
"""

from __future__ import annotations

import argparse
import json
import statistics

from steersman.control.harness.controller_scenarios import BREAKS, run

SCENARIOS = ("stationary", *BREAKS, "shift")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    for scenario in SCENARIOS:
        runs = []
        for seed in range(args.seeds):
            got = run(scenario, seed=seed)
            runs.append(got)
            print(json.dumps({"benchmark": "controller", "seed": seed, **got}))
        summary: dict = {"benchmark": "controller_summary", "scenario": scenario}
        summary["fallback_share_max"] = max(r["fallback_share"] for r in runs)
        summary["coverage_mean"] = round(statistics.fmean(r["coverage_overall"] for r in runs), 4)
        for key in ("detected_after", "normal_after_mend", "shift_coverage_by_300"):
            values = [r.get(key) for r in runs if key in r]
            if values:
                summary[key] = values
        for key in ("entries_in_break", "entries_after_mend", "entries_in_shift"):
            values = [r[key] for r in runs if key in r]
            if values:
                summary[f"{key}_max"] = max(values)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
