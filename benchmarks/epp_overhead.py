"""The endpoint picker's cost: steersman behind a real Envoy against Envoy alone, and steersman's
own gateway against going direct, on an upstream that costs nothing (benchmarks/mock_upstream.py).

Run from the repository root:  python -m benchmarks.epp_overhead [--requests 400]
steersman (gateway or picker) and Envoy run on core 0; the upstream and this client on core 1.
Latency: sequential streamed requests, each path in turn; the picker's added P50 is over Envoy
alone (round robin), the gateway's over the upstream direct. Throughput: --clients concurrent
clients for --seconds per path. The picker runs with the answers read in the picking filter
(``inline``: Envoy holds each chunk until the picker has read it) and read by a second filter in
observability mode (``observe``: Envoy does not wait). One JSON line per measurement.
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
from pathlib import Path

import httpx
import tomli_w

from benchmarks.gateway_overhead import one, throughput, wait_up
from steersman.control.backends.envoy_proxy import EnvoyProxy
from steersman.control.backends.vllm_server import free_port
from steersman.storage.query import percentile


def _steersman(
    tmp: Path, name: str, upstream: str, epp_port: int | None
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    settings = {
        "data_dir": str(tmp / name),
        "log_level": "WARNING",
        "telemetry": {"enabled": False},
        "gateway": {"port": port},
        "instances": [{"name": "mock", "url": upstream, "priority": False}],
    }
    if epp_port is not None:
        settings["epp"] = {"enabled": True, "port": epp_port}
    config = tmp / f"{name}.toml"
    config.write_text(tomli_w.dumps(settings))
    command = "epp" if epp_port is not None else "serve"
    steersman = str(Path(sys.executable).with_name("steersman"))
    process = subprocess.Popen(
        ["taskset", "-c", "0", steersman, "--config", str(config), command],
        stderr=subprocess.DEVNULL,
    )
    return process, f"http://127.0.0.1:{port}"


async def _latency(paths: dict[str, str], n: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in paths}
    async with httpx.AsyncClient(timeout=30) as client:
        for k in range(50 + n):  # the first 50 of each warm the path
            for name, url in paths.items():
                took = await one(client, url)
                if k >= 50:
                    samples[name].append(took)
    return samples


def _cpu_s(*pids: int) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _p50_ms(values: list[float]) -> float:
    return round(1000 * percentile(values, 0.5), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="steersman-epp-"))
    os.sched_setaffinity(0, {1})
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    mock = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "benchmarks.mock_upstream", "--port",
         str(up_port)]
    )  # fmt: skip
    epp_port = free_port()
    gateway, gateway_url = _steersman(tmp, "gateway", upstream, None)
    picker, picker_http = _steersman(tmp, "picker", upstream, epp_port)
    proxies: dict[str, EnvoyProxy] = {}
    try:
        for url in (upstream, gateway_url, picker_http):
            wait_up(url)
        os.sched_setaffinity(0, {0})  # Envoy starts here: pinned with steersman
        server = [f"127.0.0.1:{up_port}"]
        picked = f"127.0.0.1:{epp_port}"
        proxies = {
            "envoy": EnvoyProxy(None, server, tmp / "envoy"),
            "envoy+epp inline": EnvoyProxy(picked, server, tmp / "inline"),
            "envoy+epp observe": EnvoyProxy(picked, server, tmp / "observe", observe=True),
        }
        for proxy in proxies.values():
            proxy.start()
        os.sched_setaffinity(0, {1})
        paths = {"direct": upstream, "gateway": gateway_url}
        paths.update({name: proxy.url for name, proxy in proxies.items()})
        samples = asyncio.run(_latency(paths, args.requests))
        p50 = {name: _p50_ms(values) for name, values in samples.items()}
        gateway_added = p50["gateway"] - p50["direct"]
        for name in paths:
            p99 = round(1000 * percentile(samples[name], 0.99), 3)
            row = {"benchmark": "epp_latency", "path": name, "requests": args.requests,
                   "p50_ms": p50[name], "p99_ms": p99}  # fmt: skip
            if name.startswith("envoy+epp"):
                added = p50[name] - p50["envoy"]
                row |= {"added_over_envoy_p50_ms": round(added, 3),
                        "ratio_to_gateway_added": round(added / gateway_added, 3)}  # fmt: skip
            elif name == "gateway":
                row["added_over_direct_p50_ms"] = round(gateway_added, 3)
            print(json.dumps(row), flush=True)
        # The client and the upstream share core 1 and may saturate it before core 0 is full:
        # the CPU time core 0's processes spend per request says what one core would carry.
        on_core0 = {"gateway": [gateway.pid], "envoy": [proxies["envoy"].process.pid]}
        for name in ("envoy+epp inline", "envoy+epp observe"):
            on_core0[name] = [picker.pid, proxies[name].process.pid]
        for clients in args.clients:
            rates, cpu_ms = {}, {}
            for name in ("gateway", *proxies):
                before = _cpu_s(*on_core0[name])
                rates[name] = asyncio.run(throughput(paths[name], clients, args.seconds))["rps"]
                used = _cpu_s(*on_core0[name]) - before
                cpu_ms[name] = 1000 * used / max(rates[name] * args.seconds, 1)
            for name, rps in rates.items():
                capacity = round(cpu_ms["gateway"] / cpu_ms[name], 3)
                row = {"benchmark": "epp_throughput", "path": name, "clients": clients,
                       "rps": round(rps, 1), "ratio_to_gateway": round(rps / rates["gateway"], 3),
                       "core0_cpu_ms_per_request": round(cpu_ms[name], 3),
                       "one_core_capacity_ratio_to_gateway": capacity}  # fmt: skip
                print(json.dumps(row), flush=True)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        for process in (gateway, picker, mock):
            process.send_signal(signal.SIGTERM)
            process.wait(30)


if __name__ == "__main__":
    main()
