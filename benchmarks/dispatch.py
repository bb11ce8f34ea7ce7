"""Dispatch decision cost: building the instance views plus one policy call, as the loop does.

Run from the repository root:  python -m benchmarks.dispatch
For 2, 8 and 32 instances with 32 requests in flight each, and 16 instances with 1,000 requests
in flight between them (predicted remaining lengths and a trained latency model per instance),
times --decisions decisions per policy and prints one JSON object per (policy, instances) with
P50/P99/mean microseconds (model inference excluded). Target: P99 under 1 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from steersman.control.core.policies import POLICIES, DispatchContext
from steersman.control.harness.replay import percentile
from steersman.control.serve.service import Instance
from steersman.learners.latency import LatencyModel, StepCoefficients


def cluster(n: int, in_flight: int, rng: random.Random) -> list[Instance]:
    instances = []
    for k in range(n):
        model = LatencyModel(StepCoefficients(0.01, 0.0005, 1e-4), warmup=10)
        for _ in range(50):  # past warm-up: coefficients come from the River models
            running = rng.randint(1, 32)
            model.learn_one(
                {"running": running, "prompt_tokens": 200}, 0.01 + 0.0005 * running, 0.05
            )
        inst = Instance(f"i{k}", backend=None, latency=model, cap=64)  # type: ignore[arg-type]
        inst.in_flight = {
            f"r{k}-{j}": [rng.uniform(10, 800), rng.uniform(0, 50)] for j in range(in_flight)
        }
        inst.kv_usage = rng.random()
        inst.refresh()
        instances.append(inst)
    return instances


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(0)
    for n, in_flight in ((2, 32), (8, 32), (16, 63), (32, 32)):
        instances = cluster(n, in_flight, rng)
        for name, policy in POLICIES.items():
            times = []
            for d in range(args.decisions):
                started = time.perf_counter()
                ctx = DispatchContext(
                    [i.view() for i in instances],
                    f"q{d}",
                    predicted_tokens=rng.uniform(10, 800),
                    prompt_tokens=200,
                    now=0.0,
                    counter=d,
                    true_tokens=300,
                )
                policy(ctx)
                times.append((time.perf_counter() - started) * 1e6)
            print(
                json.dumps(
                    {
                        "benchmark": "dispatch_decision",
                        "policy": name,
                        "instances": n,
                        "in_flight_each": in_flight,
                        "p50_us": round(percentile(times, 0.5), 1),
                        "p99_us": round(percentile(times, 0.99), 1),
                        "mean_us": round(sum(times) / len(times), 1),
                    }
                )
            )


if __name__ == "__main__":
    main()
