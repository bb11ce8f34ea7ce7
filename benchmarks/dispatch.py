"""Dispatch decision cost: what the daemon's pump does for one arriving request.

Run from the repository root:  python -m benchmarks.dispatch
For 2, 8 and 32 instances with 32 requests in flight each, and 16 instances with 1,000 requests
in flight between them (predicted remaining lengths, tokens produced so far, a trained latency
model per instance, and KV caches that the requests nearly fill, so the KV admission projects
every instance's footprint), each decision reads every instance's state and asks the scheduling
core to place one new request (``Scheduler.schedule``: the KV projection, the instance views and
one policy call, with the default settings).
Prints one JSON object per (policy, instances) with P50/P99/mean microseconds (model inference
excluded). Target: P99 under 0.5 ms at 16 instances with 1,000 in flight.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from steersman.control.core.scheduler import Arrival, Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.control.serve.instances import Instance
from steersman.learners.latency import LatencyModel, StepCoefficients
from steersman.storage.query import percentile

POLICIES = ("predictive", "least-load", "round-robin")


class KvInstance(Instance):
    """An instance whose KV cache holds what the benchmark's requests need, with little spare."""

    def state(self):
        state = super().state()
        state.kv_capacity = 800 * self.cap
        return state


def cluster(n: int, rng: random.Random) -> list[KvInstance]:
    instances = []
    for k in range(n):
        model = LatencyModel(StepCoefficients(0.01, 0.0005, 1e-4), warmup=10)
        for _ in range(50):  # past warm-up: coefficients carry a learned residual
            running = rng.randint(1, 32)
            model.learn_one({"running": running}, (0.01 + 0.0005 * running) * rng.uniform(1, 2))
        inst = KvInstance(f"i{k}", backend=None, latency=model)  # type: ignore[arg-type]
        inst.kv_usage = rng.random()
        inst.refresh()
        instances.append(inst)
    return instances


def arrival(rid: str, rng: random.Random) -> Arrival:
    return Arrival(rid, 200, {"base_tokens": rng.uniform(10, 800)}, true_tokens=300)


def measure(policy: str, n: int, in_flight: int, decisions: int, rng: random.Random) -> list[float]:
    instances = cluster(n, rng)
    core = Scheduler(DispatchSettings(policy=policy), ControllerSettings(enabled=False))
    for inst in instances:
        inst.cap = in_flight
    for j in range(n * in_flight):  # fill every instance to its cap
        core.add(arrival(f"r{j}", rng), now=0.0)
    core.schedule([i.state() for i in instances], now=0.0)
    # What the projection held goes out once it has waited max_hold_s: every instance full.
    core.schedule([i.state() for i in instances], now=0.5)
    assert core.depth == 0
    for inst in instances:
        for rid in core.running(inst.name):
            core.progress(rid, rng.randint(0, 50))
        inst.cap = in_flight + 1  # room for the one being decided
    times = []
    for d in range(decisions):
        core.add(arrival(f"q{d}", rng), now=1.0)
        started = time.perf_counter()
        placed = core.schedule([i.state() for i in instances], now=1.0)
        times.append((time.perf_counter() - started) * 1e6)
        assert len(placed) == 1
        core.abort(placed[0].request_id)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(0)
    for n, in_flight in ((2, 32), (8, 32), (16, 63), (32, 32)):
        for policy in POLICIES:
            times = measure(policy, n, in_flight, args.decisions, rng)
            print(
                json.dumps(
                    {
                        "benchmark": "dispatch_decision",
                        "policy": policy,
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
