"""Learner evidence: the served length model scored in order, the prefix prior, serving cost.

Run from the repository root with the model `steersman demo` (or `steersman bench`) trains:
    python -m benchmarks.learners --model ~/.local/share/steersman/models/demo-minilm
Prints one JSON object:
- ``alpaca_eval``: the held-out AlpacaEval prompts (never trained on) served in file order, once
  per answering model (a pool serves one model and learns from its history), each through a
  fresh online corrector: Kendall tau, within-30% and band coverage of the base model, the
  corrected prediction, the fast path and the corrected prediction with the similar-prompt prior
  (``similar``), as the mean over the 12 models (with the 90% intervals over the prompts of its
  tau and of its gain over the base model's) and for each; ``after_history``: the same once each
  model's answers to the training prompts (its pool's earlier traffic, about 640 requests) were
  learned first; and the 12 models' answers served interleaved through one corrector (pooled).
- ``data``: the same for any prompt/response file given with ``--data`` (prompts of a kind the
  repository does not hold).
- ``mooncake``: the hashed Mooncake trace (shared prefixes, real output lengths, no text) served
  in order: tau over its later half of the prefix prior alone, and of the fast path with and
  without it.
- ``inference``: the model served as the daemon serves it (int8, traced, one thread), batch 1 and
  32, P50/P99 per request; the corrector's learn + predict time per request; and the
  similar-prompt prior's, with its ring full (4,096 vectors of the model's width).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from steersman.control.harness.intervals import mean_tau_interval
from steersman.control.harness.prefix import load_hashed_trace
from steersman.control.harness.replay import percentile
from steersman.control.training.bundled import bundled_records, held_out
from steersman.data import path
from steersman.learners.corrector import BASE_KEY, PREFIX_KEY, LengthCorrector
from steersman.learners.datasets import PromptRecord, load_prompt_set
from steersman.learners.evaluation import History, evaluate
from steersman.learners.features import request_features
from steersman.learners.hf import LengthModel
from steersman.learners.prefix_prior import PrefixPrior
from steersman.learners.similar_prior import SimilarPrior
from steersman.learners.tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE_SEGMENT = 512  # tokens a hash id names in the trace


Predicted = dict[str, tuple[float, Any]]  # per prompt: the base prediction and its vector


def served_in_order(
    records: list[PromptRecord],
    counter: TokenCounter,
    base: Predicted,
    before: list[PromptRecord] | None = None,
):
    """``evaluate`` over the records in their order (after ``before``, learned first): the
    scores of each path and its bands."""
    return _served(records, counter, base, before)[0]


def _served(
    records: list[PromptRecord],
    counter: TokenCounter,
    base: Predicted,
    before: list[PromptRecord] | None = None,
) -> tuple[dict[str, Any], dict[str, list[tuple[float, float]]]]:
    """``served_in_order``'s scores, and each path's (predicted, actual) per record."""
    prompts = [r.prompt for r in records]
    actual = counter.count_many([r.response for r in records])
    history = None
    if before:
        earlier = [r.prompt for r in before]
        history = History(
            earlier,
            counter.count_many([r.response for r in before]),
            counter.count_many(earlier),
            [base[p][0] for p in earlier],
            [base[p][1] for p in earlier],
        )
    result = evaluate(
        prompts,
        actual,
        counter.count_many(prompts),
        [base[p][0] for p in prompts],
        checkpoints=(len(records),),
        vectors=[base[p][1] for p in prompts],
        history=history,
        with_pairs=True,
    )
    out = {name: _brief(got) for name, got in result["overall"].items()}
    for name, band in result["band"].items():
        out[name]["band_coverage"] = band["coverage"]
    return out, result["pairs"]


def by_model(
    records: list[PromptRecord],
    counter: TokenCounter,
    base: Predicted,
    before: list[PromptRecord] | None = None,
):
    """Per answering model, its records served in order (after its records in ``before``); the
    mean tau of each path with its 90% interval over the prompts (``kendall_tau_90%``: another
    draw of prompts moves every model's figure at once), and that of its gain over the text
    model's (``kendall_tau_over_base_90%``)."""
    models: dict[str, list[PromptRecord]] = {}
    for r in records:
        models.setdefault(_model_of(r), []).append(r)
    each, answers = {}, {}
    for m, rs in sorted(models.items()):
        each[m], got = _served(rs, counter, base, [r for r in before or () if _model_of(r) == m])
        answers[m] = {
            name: dict(zip((r.prompt for r in rs), pairs, strict=True))
            for name, pairs in got.items()
        }
    first = next(iter(each.values()))
    mean = {
        path: {
            k: round(statistics.fmean(e[path][k] for e in each.values()), 3) for k in first[path]
        }
        for path in first
    }
    # The prompts every model answered, in one order: a resample draws the same ones for all.
    shared = sorted(set.intersection(*({r.prompt for r in rs} for rs in models.values())))
    groups = {
        name: [tuple(zip(*(a[name][p] for p in shared), strict=True)) for a in answers.values()]
        for name in (first if len(shared) > 2 else ())
    }
    for name, got in groups.items():
        if interval := mean_tau_interval(got):
            mean[name]["kendall_tau_90%"] = [round(x, 3) for x in interval]
        # What the online paths add to the text model's ranking, on the same draws of prompts.
        if name != "base" and "base" in groups:
            baseline = [predicted for predicted, _ in groups["base"]]
            if gain := mean_tau_interval(got, baseline):
                mean[name]["kendall_tau_over_base_90%"] = [round(x, 3) for x in gain]
    return {"models": len(each), "mean_within_model": mean, "per_model": each}


def _model_of(record: PromptRecord) -> str:
    return record.source.split("/", 1)[-1]


def mooncake(rows: int) -> dict[str, Any]:
    """The prefix prior on the hashed Mooncake trace, served in order: tau over the later half."""
    trace = load_hashed_trace(path("mooncake_hashes")).rows[:rows]
    prior = PrefixPrior()
    plain, steered = LengthCorrector(prior_entries=0), LengthCorrector()
    got: dict[str, list[tuple[float, float]]] = {"prior": [], "fast": [], "fast_with_prior": []}
    logs: list[float] = []
    shared = 0
    for k, row in enumerate(trace):
        segments = tuple(row.hash_ids)
        y = max(row.output_tokens, 0)
        x = dict(request_features("", prompt_tokens=row.input_tokens))
        found = prior.predict_one(segments)
        shared += found is not None and found.depth >= 2
        mean = statistics.fmean(logs) if logs else 0.0
        with_prior = steered.with_prior({**x, PREFIX_KEY: segments}, MOONCAKE_SEGMENT)
        guesses = {
            "prior": math.expm1(found.mean if found is not None else mean),
            "fast": plain.predict_one(x),
            "fast_with_prior": steered.predict_one(with_prior),
        }
        if k >= len(trace) // 2:
            for name, value in guesses.items():
                got[name].append((value, y))
        prior.learn_one(segments, y)
        plain.learn_one(x, y)
        steered.learn_one(with_prior, y)
        logs.append(math.log1p(y))
    taus = {name: _tau(pairs) for name, pairs in got.items()}
    return {
        "rows": len(trace),
        "scored": len(got["prior"]),
        "share_with_a_shared_prefix_of_2_blocks": round(shared / max(len(trace), 1), 3),
        "kendall_tau_later_half": taus,
        "prior_gain": round(taus["fast_with_prior"] - taus["fast"], 3),
    }


def inference(model_dir: Path, prompts: list[str], width: int) -> dict[str, Any]:
    served = LengthModel.load(model_dir, quantize=True, compiled=True, threads=1)
    out: dict[str, Any] = {}
    for batch in (1, 32):
        for i in range(0, 5 * batch, batch):  # warm-up
            served.predict_log(prompts[i : i + batch])
        times = []
        for i in range(0, min(len(prompts), 200 * batch), batch):
            started = time.perf_counter()
            served.predict_log(prompts[i : i + batch])
            times.append((time.perf_counter() - started) / batch)
        out[f"batch_{batch}"] = {
            "p50_ms_per_request": round(1000 * percentile(times, 0.5), 3),
            "p99_ms_per_request": round(1000 * percentile(times, 0.99), 3),
        }
    corrector = LengthCorrector()
    xs = [{**request_features(p), BASE_KEY: 100.0 + len(p)} for p in prompts[:1000]]
    started = time.perf_counter()
    for x in xs:
        corrector.predict_band(x)
        corrector.learn_one(x, 50 + len(x))
    out["corrector_learn_predict_us"] = round(1e6 * (time.perf_counter() - started) / len(xs), 1)
    prior = SimilarPrior()
    vectors = np.random.default_rng(0).normal(size=(prior.window + 1000, width))
    for v in vectors[: prior.window]:
        prior.learn_one(v, 100)
    started = time.perf_counter()
    for v in vectors[prior.window :]:
        prior.predict_one(v)
        prior.learn_one(v, 100)
    out["similar_prior_learn_predict_us"] = round(1e6 * (time.perf_counter() - started) / 1000, 1)
    return out


def _tau(pairs: list[tuple[float, float]]) -> float | None:
    if len(pairs) < 3:
        return None
    tau = kendalltau([p for p, _ in pairs], [a for _, a in pairs]).statistic
    return None if math.isnan(tau) else round(float(tau), 3)


def _brief(got: dict[str, Any]) -> dict[str, Any]:
    return {k: round(got[k], 3) for k in ("kendall_tau", "within_30") if got[k] is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=ROOT / ".cache" / "tiny-model")
    parser.add_argument("--data", type=Path, help="More prompt/response JSONL, served in order.")
    parser.add_argument("--mooncake-rows", type=int, default=12_031)
    args = parser.parse_args()

    counter = TokenCounter(args.tokenizer)
    trained, held = held_out(bundled_records())
    evals = [r for r in held if r.source.startswith("alpaca_eval/")]
    earlier = [r for r in trained if r.source.startswith("alpaca_eval/")]
    extra = load_prompt_set(args.data)[0] if args.data else []
    model = LengthModel.load(args.model)
    texts = sorted({r.prompt for r in [*evals, *earlier, *extra]}, key=len)
    base: Predicted = {}
    for start in range(0, len(texts), 64):
        batch = texts[start : start + 64]
        for t, v, vector in zip(batch, *model.predict_with_vectors(batch), strict=True):
            base[t] = (max(1.0, math.expm1(v)), vector)
    meta = json.loads((args.model / "steersman.json").read_text())
    result: dict[str, Any] = {
        "benchmark": "learners",
        "model": str(args.model),
        "base_model": meta.get("base_model"),
        "alpaca_eval": {
            "prompts": len({r.prompt for r in evals}),
            **by_model(evals, counter, base),
            "after_history": by_model(evals, counter, base, earlier)["mean_within_model"],
            "pooled": served_in_order(evals, counter, base),
        },
        "mooncake": mooncake(args.mooncake_rows),
        "inference": inference(args.model, [r.prompt for r in held], len(base[texts[0]][1])),
    }
    if extra:
        result["data"] = {"file": str(args.data), **served_in_order(extra, counter, base)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
