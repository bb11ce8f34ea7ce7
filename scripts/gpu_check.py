"""Check the real NVML path on a GPU host: 5 s of readings, then the sampler's measured cost.

    python scripts/gpu_check.py [--seconds 5] [--period 0.05]

Prints one line per GPU per second, then a JSON summary: source status, reading methods
(gpm / samples / utilization), field coverage, errors, period jitter P50/P99, the sampler
thread's CPU share of one core, NVML calls per tick, and, when torch sees a CUDA device, the
PyTorch allocator fragmentation after a deliberately fragmenting allocation pattern.
Exit code 0 when every GPU produced readings with SM activity, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter

from steersman.storage.query import percentile
from steersman.telemetry.fragmentation import allocator_fragmentation
from steersman.telemetry.nvml import NvmlSource
from steersman.telemetry.readings import GpuReading
from steersman.telemetry.sampler import Sampler


def _torch_fragmentation() -> dict[str, object]:
    try:
        import torch
    except ImportError:
        return {"torch": "not installed"}
    if not torch.cuda.is_available():
        return {"torch": torch.__version__, "cuda": False}
    blocks = [torch.empty(int(3.3 * 2**20), dtype=torch.uint8, device="cuda") for _ in range(64)]
    del blocks[::2]  # free every other block: reserved stays, allocated halves
    stats = torch.cuda.memory_stats()
    return {
        "torch": torch.__version__,
        "cuda": True,
        "allocated_bytes": stats.get("allocated_bytes.all.current"),
        "reserved_bytes": stats.get("reserved_bytes.all.current"),
        "allocator_fragmentation": allocator_fragmentation(stats),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--period", type=float, default=0.05)
    args = parser.parse_args()

    source = NvmlSource()
    seen: list[GpuReading] = []
    sampler = Sampler(source, period_s=args.period, sink=None)
    status = sampler.start()
    summary: dict[str, object] = {
        "available": status.available,
        "reason": status.reason,
        "gpus": status.gpus,
    }
    if not status.available:
        print(json.dumps(summary))
        return 1
    pause = threading.Event()
    started = time.monotonic()
    for _ in range(int(args.seconds)):
        pause.wait(1.0)
        for index, r in sorted(sampler.latest().items()):
            seen.append(r)
            print(
                f"gpu {index} {r.method:<11} sm={r.sm_activity} occ={r.sm_occupancy} "
                f"temp={r.temperature_c} clock={r.sm_clock_mhz} power={r.power_w} "
                f"throttle={r.throttle_reasons} used={r.memory_used_bytes} "
                f"reserved={r.memory_reserved_bytes} errors={r.errors}",
                flush=True,
            )
    sampler.stop()
    wall = time.monotonic() - started
    jitter = [1000 * j for j in sampler.stats.jitter_s]
    fields = (
        "sm_activity",
        "sm_occupancy",
        "temperature_c",
        "sm_clock_mhz",
        "power_w",
        "throttle_reasons",
        "memory_used_bytes",
        "memory_reserved_bytes",
    )
    summary |= {
        "methods": dict(Counter(r.method for r in seen)),
        "field_coverage": {
            f: sum(getattr(r, f) is not None for r in seen) / max(1, len(seen)) for f in fields
        },
        "errors": source.error_counts(),
        "ticks": sampler.stats.ticks,
        "jitter_p50_ms": percentile(jitter, 0.50),
        "jitter_p99_ms": percentile(jitter, 0.99),
        "sampler_cpu_pct_of_one_core": round(100 * sampler.stats.cpu_s / wall, 3),
        "nvml_calls_per_tick": round(source.calls / max(1, sampler.stats.ticks), 2),
        "torch": _torch_fragmentation(),
    }
    print(json.dumps(summary, default=str))
    ok = all(r.sm_activity is not None for r in seen)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
