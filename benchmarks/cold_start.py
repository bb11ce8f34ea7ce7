"""The controller from a cold start: FALLBACK on stationary arrivals with the served length model.

Each run starts with a fresh corrector, fresh bands and no history (a daemon's first minutes),
8 simulated instances of a profile, Poisson arrivals at 0.8x least-load's capacity on it, real
held-out prompts with their real response lengths. Predictors: the demo's length model
(``model``), the true length times log-normal noise (``noise:SIGMA``: worse rankers, to see from
where a cold start falls back), and a constant (``constant``: it must still be caught). Each
predictor runs twice, with the bands a daemon starts with: ``default`` (a factor of 2 each way
until a class has 20 outcomes) and ``seeded`` (from the predictor's errors on held-out prompts,
as the daemon adopts the served model's validation errors; the constant predictor is seeded
with the model's: a broken model that claims a good validation).

Run from the repository root:  python -m benchmarks.cold_start [--requests 3000,6000] [--seeds 2]
Prints one JSON object per run: FALLBACK share of dispatch decisions, FALLBACK entries, the
Kendall tau of the predictions, and the first mode changes (outcomes scored by then, why).
Target: FALLBACK share <= 2% with the default model, a constant predictor still caught.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import replace

from scipy.stats import kendalltau

from steersman.control.harness import bench
from steersman.control.serve.served_model import validation_errors
from steersman.control.serve.settings import Settings
from steersman.control.sim.profiles import load_profile
from steersman.control.training.bundled import ensure_length_model
from steersman.control.training.tiny_model import served_model
from steersman.learners.corrector import BASE_KEY
from steersman.learners.hf import LengthModel
from steersman.learners.metrics import error_quantiles
from steersman.learners.tokens import TokenCounter

# least-load's capacity at P99 TTFT <= 1 s on 8 instances (docs/bench/sim, docs/bench/sweep)
CAPACITY = {"a30-llama2-7b": 42.23, "l4-llama2-7b": 17.95, "h100-llama2-13b": 128.84}


def predicted(items: list[bench.Item], predictor: str, seed: int) -> list[bench.Item]:
    if predictor == "model":
        return items
    if predictor == "constant":
        return [replace(i, features={BASE_KEY: bench.CONSTANT_TOKENS}) for i in items]
    sigma, rng = float(predictor.split(":")[1]), random.Random(seed)
    out = []
    for i in items:
        noisy = i.output_tokens * math.exp(rng.gauss(0, sigma))
        out.append(replace(i, features={**i.features, BASE_KEY: noisy}))
    return out


def held_out_errors(items: list[bench.Item], predictor: str, seed: int,
                    model_errors: list[float] | None) -> list[float] | None:  # fmt: skip
    """What the predictor's validation would say of its errors: on other prompts than the run's
    (the model's own from its training; a noisy one's on ``items`` drawn with another seed)."""
    if predictor in ("model", "constant"):
        return model_errors
    other = predicted(items, predictor, seed + 10_000)
    return error_quantiles([math.log1p(i.features[BASE_KEY]) for i in other],
                           [math.log1p(i.output_tokens) for i in other])  # fmt: skip


def run(profile_name: str, n: int, seed: int, predictors: list[str], model: LengthModel,
        counter: TokenCounter, model_errors: list[float] | None) -> list[dict]:  # fmt: skip
    profile, rate = load_profile(profile_name), 0.8 * CAPACITY[profile_name]
    items = bench.prompt_items(counter, model.predict_with_vectors, n, profile.max_model_len, seed)
    times = [u / rate for u in bench.unit_arrivals("gamma1", None, n, seed)]  # type: ignore[arg-type]
    out = []
    for predictor in predictors:
        these = predicted(items, predictor, seed)
        tau = kendalltau([i.features[BASE_KEY] for i in these], [i.output_tokens for i in these])
        seeded = held_out_errors(items, predictor, seed, model_errors)
        for bands, errors in (("default", None), ("seeded", seeded)):
            r = bench.run_sim("steersman", bench.variants()["steersman"], these, times, profile,
                              8, band_errors=errors)  # fmt: skip
            modes = [{"scored": k, "to": m, "why": why} for _, k, m, why in r["modes"][:4]]
            out.append({
                "benchmark": "cold_start", "profile": profile_name, "requests": n, "seed": seed,
                "predictor": predictor, "bands": bands,
                "kendall_tau": round(float(tau[0]), 3) if math.isfinite(tau[0]) else None,
                "fallback_share": r["fallback_share"], "fallback_entries": r["fallbacks"],
                "modes": modes,
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default=",".join(CAPACITY))
    parser.add_argument("--requests", default="3000,6000")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--predictors", default="model,constant")
    args = parser.parse_args()
    data = Settings().data_dir
    counter = TokenCounter(served_model(data))
    directory = ensure_length_model(data, counter).directory
    model, errors = LengthModel.load(directory), validation_errors(directory)
    if errors is None:
        print(f"{directory}: no validation errors kept (trained before they were)", file=sys.stderr)
    predictors = args.predictors.split(",")
    for name in args.profiles.split(","):
        for n in (int(k) for k in args.requests.split(",")):
            for seed in range(args.seeds):
                for row in run(name, n, seed, predictors, model, counter, errors):
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
