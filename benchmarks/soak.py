"""Soak: sustained load on `steersman serve` (simulated instances) for --seconds; the daemon's RSS
over time, errors, and P99 E2E per minute.

Run from the repository root:  python -m benchmarks.soak --seconds 600 --rate 20
The daemon runs as operators run it (a subprocess with a config file); this process only sends
load and reads /proc/<pid>/status. Prints one JSON line per minute and a summary line; targets:
no errors and RSS growth under 5% after the first minute (warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import tomli_w

from benchmarks.gateway_overhead import wait_up
from steersman.control.backends.vllm_server import free_port
from steersman.data import path
from steersman.learners.datasets import load_prompt_set
from steersman.storage.query import percentile


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def drive(url: str, seconds: float, rate: float, report) -> None:
    prompts = [r.prompt for r in load_prompt_set(path("alpaca"))[0][:2000]]
    rng = random.Random(0)
    started = time.monotonic()
    minute: list[float] = []
    errors = 0
    tasks: set[asyncio.Task] = set()
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=httpx.Limits(max_connections=500)
    ) as client:

        async def one() -> None:
            nonlocal errors
            body = {
                "model": "steersman-sim",
                "prompt": rng.choice(prompts),
                "max_tokens": rng.choice([8, 16, 32, 64, 128]),
                "stream": rng.random() < 0.5,
            }
            t0 = time.monotonic()
            try:
                response = await client.post("/v1/completions", json=body)
                if response.status_code != 200:
                    errors += 1
                else:
                    minute.append(time.monotonic() - t0)
            except httpx.HTTPError:
                errors += 1

        next_report = started + 60
        while time.monotonic() - started < seconds:
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(rng.expovariate(rate))
            if time.monotonic() >= next_report:
                report(minute, errors)
                minute, next_report = [], next_report + 60
        await asyncio.gather(*tasks)
        report(minute, errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="steersman-soak-"))
    port = free_port()
    config = tmp / "soak.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "data_dir": str(tmp / "data"),
                "log_level": "WARNING",
                "telemetry": {"enabled": False},
                "gateway": {"port": port},
                "instances": [{"name": f"sim-{k}", "sim": "cpu-tiny"} for k in range(2)],
            }
        )
    )
    steersman = str(Path(sys.executable).with_name("steersman"))
    proc = subprocess.Popen(
        [steersman, "--config", str(config), "serve"], stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url)
        rows = []

        def report(latencies: list[float], errors: int) -> None:
            row = {
                "minute": len(rows) + 1,
                "rss_mib": round(rss_kib(proc.pid) / 1024, 1),
                "requests": len(latencies),
                "errors_total": errors,
                "e2e_p99_s": round(percentile(latencies, 0.99) or 0, 4),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)

        asyncio.run(drive(url, args.seconds, args.rate, report))
        warm, last = rows[0]["rss_mib"], rows[-1]["rss_mib"]
        full = [r for r in rows if r["requests"] > 0.5 * args.rate * 60]
        print(
            json.dumps(
                {
                    "benchmark": "soak",
                    "seconds": args.seconds,
                    "rate_rps": args.rate,
                    "requests": sum(r["requests"] for r in rows),
                    "errors": rows[-1]["errors_total"],
                    "rss_after_warmup_mib": warm,
                    "rss_end_mib": last,
                    "rss_growth_pct": round(100 * (last - warm) / warm, 2),
                    "e2e_p99_first_minute_s": full[0]["e2e_p99_s"] if full else None,
                    "e2e_p99_last_minute_s": full[-1]["e2e_p99_s"] if full else None,
                }
            )
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


if __name__ == "__main__":
    main()
