"""Check the real NVML path on a GPU host: 5 s of readings, then the sampler's measured cost.

    python scripts/gpu_check.py [--seconds 5] [--period 0.05] [--load-seconds 60]

Prints one line per GPU per second, then a JSON summary: source status, reading methods
(gpm / samples / utilization), field coverage, errors, period jitter P50/P99, the sampler
thread's CPU share of one core, NVML calls per tick, and, when torch sees a CUDA device, the
PyTorch allocator fragmentation after a deliberately fragmenting allocation pattern.
With ``--load-seconds``, GPU 0 then runs back-to-back matrix products for that long and idles
half as long, and the summary's ``thermal`` holds the series of readings (every 0.5 s: clock,
temperature, SM activity, power), the same busy pattern through the simulated GPU of the same
kind (``control/sim/gpu.py``), and for both the temperature rise and the time to 63% of it (the
first-order model's time constant), to check the simulated thermal model's shape, and the
mean clock while it was busy (``busy_clock_mhz``: a calibrated profile's ``clock_mhz``).
Exit code 0 when every GPU produced readings with SM activity, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter

from steersman.control.harness.calibrate import busy_clock_mhz
from steersman.control.sim.gpu import GPU_SPECS, SimGpu
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


def _matmul_load(stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def _rise(series: list[dict[str, float]], key: str = "temperature_c") -> dict[str, float | None]:
    """Temperature at the start and at the end of the load, and the time to 63% of the rise."""
    loaded = [p for p in series if p["busy"] and p.get(key) is not None]
    if len(loaded) < 2:
        return {"start": None, "end": None, "t63_s": None}
    start, end = loaded[0][key], loaded[-1][key]
    target = start + 0.63 * (end - start)
    t63 = next((p["t"] for p in loaded if (p[key] - target) * (end - start) >= 0), None)
    return {"start": start, "end": end, "t63_s": t63}


def thermal_series(sampler: Sampler, seconds: float, gpu_name: str) -> dict[str, object]:
    stop = threading.Event()
    worker = threading.Thread(target=_matmul_load, args=(stop,), daemon=True)
    pause = threading.Event()
    real: list[dict[str, float]] = []
    started = time.monotonic()
    worker.start()
    while (t := time.monotonic() - started) < 1.5 * seconds:
        if t >= seconds and not stop.is_set():
            stop.set()
        r = sampler.latest().get(0)
        if r is not None:
            real.append({"t": round(t, 2), "busy": not stop.is_set(),
                         "sm_clock_mhz": r.sm_clock_mhz, "temperature_c": r.temperature_c,
                         "sm_activity": r.sm_activity, "power_w": r.power_w})  # fmt: skip
        pause.wait(0.5)
    stop.set()
    worker.join()
    # The longest name it contains: "L40S" is an L40S, not an L4.
    kind = max((k for k in GPU_SPECS if k in gpu_name.lower()), key=len, default="a100")
    spec = GPU_SPECS[kind]
    first = next((p["temperature_c"] for p in real if p["temperature_c"] is not None), None)
    sim = SimGpu(spec, temperature_c=first if first is not None else spec.ambient_c)
    simulated, busy = [], 0.0
    for p in real:
        busy += 0.5 if p["busy"] else 0.0
        sim.advance(p["t"] + 1e-9, busy)
        simulated.append({"t": p["t"], "busy": p["busy"], "sm_clock_mhz": round(sim.clock_mhz),
                          "temperature_c": round(sim.temperature_c, 2)})  # fmt: skip
    # What a profile measured on this GPU under load should carry as its clock_mhz.
    busy = busy_clock_mhz(({**p, "gpu_index": 0} for p in real), 0)
    return {"gpu": gpu_name, "simulated_as": kind, "real": real, "simulated": simulated,
            "real_rise": _rise(real), "simulated_rise": _rise(simulated),
            "busy_clock_mhz": busy}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--period", type=float, default=0.05)
    parser.add_argument("--load-seconds", type=float, default=0.0)
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
    wall = time.monotonic() - started
    if args.load_seconds > 0:
        import pynvml

        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        summary["thermal"] = thermal_series(sampler, args.load_seconds, str(name))
    sampler.stop()
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
