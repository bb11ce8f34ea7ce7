"""Gateway overhead: the latency steersman adds to a request, and the requests/s it sustains on
one core, against an upstream that costs nothing (benchmarks/mock_upstream.py).

Run from the repository root:  python -m benchmarks.gateway_overhead [--requests 500]
Both processes are pinned: steersman to core 0, the upstream and this client to core 1.
Sequential requests alternate between the upstream directly and steersman in front of it (same
body, streamed as steersman streams upstream); the difference is steersman's overhead: parsing,
features, the fast length prediction, correction, the dispatch decision, the proxying, the
accounting and the history row. Then --clients concurrent clients for --seconds measure
throughput. One JSON line each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import tomli_w

from steersman.control.backends.vllm_server import free_port
from steersman.storage.query import percentile


def wait_up(url: str) -> None:
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)  # processes we started; nothing else to wait on


async def one(client: httpx.AsyncClient, url: str) -> float:
    body = {"model": "mock", "prompt": "Say hello.", "max_tokens": 8, "stream": True}
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        async for _ in response.aiter_lines():
            pass
    assert response.status_code == 200
    return time.perf_counter() - started


async def overhead(upstream: str, gateway: str, n: int) -> dict:
    direct, through = [], []
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(50):  # warm both paths
            await one(client, upstream)
            await one(client, gateway)
        for _ in range(n):
            direct.append(await one(client, upstream))
            through.append(await one(client, gateway))
    added = [t - d for t, d in zip(through, direct, strict=True)]
    return {
        "benchmark": "gateway_overhead",
        "requests": n,
        "direct_p50_ms": round(1000 * percentile(direct, 0.5), 3),
        "through_p50_ms": round(1000 * percentile(through, 0.5), 3),
        "added_p50_ms": round(1000 * (percentile(through, 0.5) - percentile(direct, 0.5)), 3),
        "added_p99_ms": round(1000 * (percentile(through, 0.99) - percentile(direct, 0.99)), 3),
        "paired_added_p50_ms": round(1000 * percentile(added, 0.5), 3),
    }


async def throughput(gateway: str, clients: int, seconds: float) -> dict:
    done = 0
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients)) as c:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < end:
                await one(c, gateway)
                done += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    return {"benchmark": "gateway_throughput", "clients": clients, "rps": round(done / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    tmp = Path(tempfile.mkdtemp(prefix="steersman-overhead-"))
    up_port, gw_port = free_port(), free_port()
    upstream_url, gateway_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    config = tmp / "steersman.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "data_dir": str(tmp / "data"),
                "log_level": "WARNING",
                "telemetry": {"enabled": False},
                "gateway": {"port": gw_port},
                "instances": [{"name": "mock", "url": upstream_url, "priority": False}],
            }
        )
    )
    steersman = str(Path(sys.executable).with_name("steersman"))
    upstream = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "benchmarks.mock_upstream", "--port",
         str(up_port)]
    )  # fmt: skip
    gateway = subprocess.Popen(
        ["taskset", "-c", "0", steersman, "--config", str(config), "serve"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_up(upstream_url)
        wait_up(gateway_url)
        print(json.dumps(asyncio.run(overhead(upstream_url, gateway_url, args.requests))))
        print(json.dumps(asyncio.run(throughput(gateway_url, args.clients, args.seconds))))
    finally:
        for proc in (gateway, upstream):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
