"""Simulator speed: simulated requests per wall-clock second, 8 instances, a GPU profile.

Run from the repository root:  python -m benchmarks.sim_speed [--profile a100-llama2-7b]
The whole Azure conversation trace (19,366 requests, its own input and output token counts)
time-scaled to each --rates value, round-robin over --instances simulated instances in virtual
time. Prints one JSON object per rate with the wall time, simulated requests per wall second,
engine steps and the latency figures of the run.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from steersman.control.harness.workloads import load_trace, trace_arrivals
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.profiles import load_profile
from steersman.control.sim.virtual import round_robin, run_cluster
from steersman.data import path
from steersman.storage.query import percentile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="a100-llama2-7b")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--rates", default="10,20,30")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    trace = load_trace(path("azure_conv"))
    limit = profile.max_model_len
    for rate in (float(r) for r in args.rates.split(",")):
        times = trace_arrivals(trace, len(trace.rows), rate, random.Random(args.seed))
        requests = []
        for i, (t, row) in enumerate(zip(times, trace.rows, strict=False)):
            prompt = min(row.input_tokens, limit - 64)
            output = max(1, min(row.output_tokens, limit - prompt))
            requests.append(SimRequest(f"r{i}", t, prompt, output))
        engines = [SimEngine(profile) for _ in range(args.instances)]
        started = time.perf_counter()
        run = run_cluster(requests, engines, round_robin())
        wall = time.perf_counter() - started
        e2e = [r.finished_at - r.arrival for r in run.finished]
        ttft = [r.first_token_at - r.arrival for r in run.finished]
        print(
            json.dumps(
                {
                    "benchmark": "sim_speed",
                    "profile": profile.name,
                    "instances": args.instances,
                    "rate_rps": rate,
                    "requests": len(requests),
                    "finished": len(run.finished),
                    "wall_s": round(wall, 3),
                    "simulated_requests_per_wall_s": round(len(requests) / wall),
                    "simulated_s": round(run.end, 1),
                    "engine_steps": sum(e.stats.steps for e in engines),
                    "preemptions": sum(e.stats.preemptions for e in engines),
                    "ttft_p50_s": round(percentile(ttft, 0.5), 4),
                    "ttft_p99_s": round(percentile(ttft, 0.99), 4),
                    "e2e_p50_s": round(percentile(e2e, 0.5), 3),
                    "e2e_p99_s": round(percentile(e2e, 0.99), 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
