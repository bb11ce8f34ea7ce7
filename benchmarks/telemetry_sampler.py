"""Sampler period jitter and CPU cost with 8 simulated GPUs (GPM) at the 50 ms period.

Run from the repository root:  python -m benchmarks.telemetry_sampler [--seconds 60] [--gpus 8]
The GPUs are simulated at the pynvml function boundary (tests/telemetry/fake_nvml.py), so the
NVML call cost is measured separately (CPU time inside the simulated calls) and subtracted:
what remains is the sampler's own cost. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import pytest

from steersman.storage.query import percentile
from steersman.telemetry.nvml import NvmlSource
from steersman.telemetry.sampler import Sampler
from tests.telemetry.fake_nvml import FakeGpu, FakeNvml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--period", type=float, default=0.05)
    args = parser.parse_args()

    rows: list[dict] = []
    with pytest.MonkeyPatch.context() as mp:
        fake = FakeNvml([FakeGpu(i) for i in range(args.gpus)], time.monotonic).install(mp)
        sampler = Sampler(NvmlSource(), period_s=args.period, sink=rows.append)
        started = time.monotonic()
        assert sampler.start().available
        threading.Event().wait(args.seconds)
        sampler.stop()
        wall = time.monotonic() - started

    stats = sampler.stats
    jitter_ms = [1000 * j for j in stats.jitter_s]
    own_cpu = stats.cpu_s - fake.call_cpu_s
    print(
        json.dumps(
            {
                "benchmark": "telemetry_sampler",
                "gpus": args.gpus,
                "period_ms": 1000 * args.period,
                "seconds": round(wall, 2),
                "ticks": stats.ticks,
                "expected_ticks": int(wall / args.period),
                "skipped_ticks": stats.skipped,
                "jitter_p50_ms": round(percentile(jitter_ms, 0.50), 3),
                "jitter_p99_ms": round(percentile(jitter_ms, 0.99), 3),
                "jitter_max_ms": round(max(jitter_ms), 3),
                "jitter_mean_ms": round(statistics.fmean(jitter_ms), 3),
                "nvml_calls_per_tick": round(sum(fake.calls.values()) / stats.ticks, 2),
                "nvml_calls_per_tick_per_gpu": round(
                    sum(fake.calls.values()) / stats.ticks / args.gpus, 2
                ),
                "sampler_cpu_pct_of_one_core_incl_nvml": round(100 * stats.cpu_s / wall, 3),
                "nvml_call_cpu_pct": round(100 * fake.call_cpu_s / wall, 3),
                "sampler_cpu_pct_of_one_core_excl_nvml": round(100 * own_cpu / wall, 3),
                "rows_written": len(rows),
            }
        )
    )


if __name__ == "__main__":
    main()
