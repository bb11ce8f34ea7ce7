"""Learner evidence: drift correction, inference latency, River cost.

Run from the repository root after training on alpaca + codealpaca:
    steersman train --bundled alpaca,codealpaca --out /tmp/rob-ac --epochs 3 --time-budget 300
    python -m benchmarks.learners --model /tmp/rob-ac [--rows 1000]
Serves AlpacaEval prompts in file order to the model trained on other data and prints one JSON
object: rolling MAE (last 200 requests) of the uncorrected and the River-corrected prediction
after 200 and --rows requests (target: corrected at most half the uncorrected at 1,000), the
overall scores per path, RoBERTa inference latency P50/P99 at batch 1 and 32, and the
corrector's learn+predict time per request (target < 100 microseconds).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from steersman.control.harness.replay import percentile
from steersman.data import path
from steersman.learners.corrector import BASE_KEY, LengthCorrector
from steersman.learners.datasets import load_prompt_set
from steersman.learners.evaluation import evaluate
from steersman.learners.features import request_features
from steersman.learners.hf import RobertaLengthModel
from steersman.learners.tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--tokenizer", type=Path, default=ROOT / ".cache" / "tiny-model")
    args = parser.parse_args()

    records = load_prompt_set(path("alpaca_eval"))[0][: args.rows]
    counter = TokenCounter(args.tokenizer)
    actual = counter.count_many([r.response for r in records])
    prompt_tokens = counter.count_many([r.prompt for r in records])
    model = RobertaLengthModel.load(args.model)
    prompts = [r.prompt for r in records]
    base = []
    for i in range(0, len(prompts), 32):
        base += [max(1.0, math.expm1(v)) for v in model.predict_log(prompts[i : i + 32])]
    result = evaluate(prompts, actual, prompt_tokens, base, checkpoints=(200, args.rows))

    latency = {}
    for batch in (1, 32):
        times = []
        for i in range(0, min(len(prompts), 40 * batch), batch):
            started = time.perf_counter()
            model.predict_log(prompts[i : i + batch])
            times.append((time.perf_counter() - started) / batch)
        latency[f"batch_{batch}"] = {
            "p50_ms_per_request": round(1000 * percentile(times, 0.5), 3),
            "p99_ms_per_request": round(1000 * percentile(times, 0.99), 3),
        }

    corrector = LengthCorrector()
    xs = [
        {**request_features(p, prompt_tokens=t), BASE_KEY: b}
        for p, t, b in zip(prompts, prompt_tokens, base, strict=True)
    ]
    started = time.perf_counter()
    for x, y in zip(xs, actual, strict=True):
        corrector.predict_one(x)
        corrector.learn_one(x, y)
    river_us = 1e6 * (time.perf_counter() - started) / len(xs)

    rolling = result["rolling_mae"]
    print(
        json.dumps(
            {
                "benchmark": "learners",
                "rows": len(records),
                "rolling_mae_200": rolling.get(200),
                f"rolling_mae_{args.rows}": rolling.get(args.rows),
                "corrected_over_base_at_end": round(
                    rolling[args.rows]["corrected"] / rolling[args.rows]["base"], 3
                ),
                "overall": result["overall"],
                "drift_events": result["drift_events"],
                "inference": latency,
                "corrector_learn_predict_us": round(river_us, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
