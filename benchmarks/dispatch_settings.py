"""What one dispatch setting does: steersman's default beside the same with a setting changed.

Each ``--set field=value[,field=value]`` is a variant of the default ``steersman`` policy with
those `[dispatch]` settings changed (validated as the daemon's configuration is: a wrong name or
value is refused naming it), run beside least-load, vllm-priority and the default on 8 simulated
instances of a profile with the demo's length model and held-out prompts, over 12 arrival seeds
(``--seeds``; in the burst, seed s is the sim bench's run from point s of the trace, so the two
measure the same runs): in one scenario of the sim bench (``steady:LEVEL``, ``gammaCV`` at 0.8x,
``burst``), at rates that are shares of least-load's capacity at P99 TTFT <= 1 s
(``--capacity``, else searched), or each policy's own capacity, searched near it
(``capacity``).

Run from the repository root:
    python -m benchmarks.dispatch_settings --profile a30-llama2-7b --scenario gamma4 \\
        --set admission=none --set ttft_weight=1
Prints one JSON object per policy: P99 TTFT, mean and P99 E2E, mean normalized latency (or the
capacity) per seed, their means, and the means' ratios to the first policy's (least-load's) with
their 90% bootstrap intervals over the seeds (``to_least-load_90%``).
Requests carry each prompt's vector for the corrector's similar-prompt prior, as in the daemon;
``--without-similar`` runs the policies that learn from predictions once more without them,
named ``POLICY -similar``. ``--vary vllm-priority,steersman`` makes each ``--set`` a variant of
each policy named (vLLM's priority policy reads the same ``[dispatch]`` settings: the aging, the
engine order). ``--noise SIGMA`` replaces the length model's predictions with the true lengths
times ``e^N(0, SIGMA)``: how precise predictions must be for a policy to earn its place.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from steersman.control.core.settings import DispatchSettings
from steersman.control.harness import bench
from steersman.control.harness.bench_suite import SimOptions, check_scenario, scenario_run
from steersman.control.harness.intervals import CONFIDENCE, ratio_interval
from steersman.control.harness.workloads import Trace, load_trace
from steersman.control.serve.served_model import validation_errors
from steersman.control.serve.settings import Settings
from steersman.control.sim.profiles import StepModel, load_profile
from steersman.control.training.bundled import ensure_length_model
from steersman.control.training.tiny_model import served_model
from steersman.data import path
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY
from steersman.learners.hf import LengthModel
from steersman.learners.tokens import TokenCounter

FIGURES = ("ttft_p99_s", "e2e_mean_s", "e2e_p99_s", "norm_mean_s")


def changed(base: bench.Variant, assignments: str) -> bench.Variant:
    """``base`` with the `[dispatch]` settings in ``field=value,...`` changed, validated.

    >>> v = changed(bench.variants()["steersman"], "admission=none,ttft_weight=1")
    >>> v.dispatch.admission, v.dispatch.ttft_weight
    ('none', 1.0)
    >>> changed(bench.variants()["steersman"], "ttft_weight=-1")
    Traceback (most recent call last):
    ...
    ValueError: dispatch.ttft_weight = '-1': Input should be greater than or equal to 0
    """
    update: dict[str, str] = {}
    for part in assignments.split(","):
        field, eq, value = part.partition("=")
        if not eq or not field.strip():
            raise ValueError(f"{part!r}: expected field=value")
        update[field.strip()] = value.strip()
    try:
        dispatch = DispatchSettings.model_validate({**base.dispatch.model_dump(), **update})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"dispatch.{field} = {update.get(field)!r}: {err['msg']}") from None
    return replace(base, dispatch=dispatch)


def noisy(items: Sequence[bench.Item], sigma: float, seed: int) -> list[bench.Item]:
    """``items`` predicted as their true lengths times ``e^N(0, sigma)``, without the prompts'
    vectors (the similar-prompt prior would otherwise learn the truth back).

    >>> items = [bench.Item(10, 100, {BASE_KEY: 3.0, VECTOR_KEY: [1.0]})]
    >>> noisy(items, 0.0, seed=0)[0].features
    {'base_tokens': 100.0}
    >>> 100 != noisy(items, 0.5, seed=0)[0].features[BASE_KEY] > 0
    True
    """
    rng = random.Random(seed)
    out = []
    for item in items:
        x = {k: v for k, v in item.features.items() if k not in (BASE_KEY, VECTOR_KEY)}
        x[BASE_KEY] = item.output_tokens * math.exp(rng.gauss(0.0, sigma))
        out.append(replace(item, features=x))
    return out


def _unpredicted(texts: list[str]) -> tuple[list[float], list[Any]]:
    """No prediction and no vector for any prompt (``noisy`` gives them theirs)."""
    return [math.nan] * len(texts), [None] * len(texts)


def compare(
    policies: dict[str, bench.Variant],
    items: Sequence[bench.Item],
    trace: Trace,
    profile: StepModel,
    scenario: str,
    capacity: float,
    seeds: Sequence[int],
    instances: int = 8,
    band_errors: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Every policy in ``scenario`` once per seed, side by side; the first policy is the one the
    ratios are to. ``capacity`` (a scenario here) searches each policy's capacity at P99 TTFT
    <= 1 s near the given one, as the sim bench does; ``band_errors``: the length model's
    validation errors, the corrector's first bands (as the daemon and the sim bench adopt)."""
    figures = ("capacity_rps",) if scenario == "capacity" else FIGURES
    errors = tuple(band_errors) if band_errors else None
    rows = []
    for name, variant in policies.items():
        runs = []
        for seed in seeds:
            if scenario == "capacity":
                found = bench.capacity(name, variant, items, trace, profile, instances, 1.0,
                                       bench.Steady(), near=capacity, seed=seed,
                                       band_errors=errors)  # fmt: skip
                runs.append({"capacity_rps": round(found, 2)})
                continue
            # One burst per seed (the burst's point of the trace): the seeds are the repeats.
            options = SimOptions(instances=instances, requests=len(items), seed=seed,
                                 burst_repeats=1, band_errors=errors)  # fmt: skip
            run, _ = scenario_run(scenario, name, variant, items, trace, capacity, profile, options)
            runs.append(run)
        row: dict[str, Any] = {"benchmark": "dispatch_settings", "policy": name,
                               "scenario": scenario, "seeds": list(seeds)}  # fmt: skip
        for figure in figures:
            values = [r[figure] for r in runs]
            row[figure] = values
            row[f"{figure}_mean"] = round(statistics.fmean(values), 5)
        rows.append(row)
    base = {f: rows[0][f"{f}_mean"] for f in figures}
    for row in rows:
        row["to_" + rows[0]["policy"]] = {
            f: round(row[f"{f}_mean"] / base[f], 4) for f in figures if base[f]
        }
        # The seeds resampled in pairs: a ratio whose interval holds 1 is not a difference.
        row[f"to_{rows[0]['policy']}_{CONFIDENCE:.0%}"] = {
            f: [round(got[1], 4), round(got[2], 4)]
            for f in figures
            if (got := ratio_interval(row[f], rows[0][f]))
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="a30-llama2-7b")
    parser.add_argument("--scenario", default="gamma4")
    parser.add_argument("--capacity", type=float, help="least-load's, req/s (default: searched)")
    parser.add_argument("--seeds", type=int, default=12,
                        help="arrival seeds (in the burst: points of the trace)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument(
        "--policies",
        default="least-load,vllm-priority,steersman",
        help="standard policies beside the changed ones; the first: the yardstick",
    )
    parser.add_argument("--set", action="append", default=[], dest="changes",
                        metavar="FIELD=VALUE[,...]")  # fmt: skip
    parser.add_argument("--vary", default="steersman", metavar="POLICY[,POLICY]",
                        help="the standard policies each --set changes")  # fmt: skip
    parser.add_argument("--noise", type=float, metavar="SIGMA",
                        help="predict the true lengths times e^N(0, SIGMA) instead")  # fmt: skip
    parser.add_argument(
        "--without-similar",
        action="store_true",
        help="also each learning policy without the similar-prompt prior",
    )
    args = parser.parse_args()
    standard = bench.variants()
    try:
        policies = {p: standard[p] for p in args.policies.split(",")}
    except KeyError as exc:
        sys.exit(f"--policies: unknown policy {exc}; known: {', '.join(standard)}")
    varied = args.vary.split(",")
    if unknown := [p for p in varied if p not in standard]:
        sys.exit(f"--vary: unknown policy {unknown[0]!r}; known: {', '.join(standard)}")
    if args.noise is not None and not (math.isfinite(args.noise) and args.noise >= 0):
        sys.exit(f"--noise: {args.noise} is not a spread (a finite number >= 0)")
    try:
        for change in args.changes:
            for name in varied:
                policies[f"{name} {change}"] = changed(standard[name], change)
    except ValueError as exc:
        sys.exit(f"--set {exc}")
    problem = None if args.scenario == "capacity" else check_scenario(args.scenario)
    if problem:
        sys.exit(f"--scenario: {problem} (or capacity)")
    try:
        profile = load_profile(args.profile)
    except ValueError as exc:
        sys.exit(f"--profile: {exc}")
    data = Settings().data_dir
    counter = TokenCounter(served_model(data))
    if args.noise is None:
        directory = ensure_length_model(data, counter).directory
        predict = LengthModel.load(directory).predict_with_vectors
        errors = validation_errors(directory)
    else:  # the noisy truth replaces every prediction: no length model to train or run
        predict, errors = _unpredicted, None
    trace = load_trace(path("azure_conv"))
    items = bench.prompt_items(counter, predict, args.requests, profile.max_model_len, 0)
    if args.noise is not None:
        items = noisy(items, args.noise, seed=7)
        drawn = [math.log(i.features[BASE_KEY] / i.output_tokens) for i in items]
        errors = bench.band_seed(drawn) if args.noise > 0 else None
    capacity = args.capacity or bench.capacity(
        "least-load", standard["least-load"], items, trace, profile, 8, 1.0, bench.Steady()
    )
    seeds = range(args.seeds)
    rows = compare(policies, items, trace, profile, args.scenario, capacity, seeds,
                   band_errors=errors)  # fmt: skip
    if args.without_similar:
        learning = {f"{n} -similar": v for n, v in policies.items() if v.predictor == "learned"}
        yardstick = dict(list(policies.items())[:1])
        for item in items:
            item.features.pop(VECTOR_KEY, None)
        rows += compare({**yardstick, **learning}, items, trace, profile, args.scenario,
                        capacity, seeds, band_errors=errors)[1:]  # fmt: skip
    for row in rows:
        noise = {} if args.noise is None else {"noise": args.noise}
        print(json.dumps({"profile": args.profile, "capacity_rps": capacity, **noise, **row}),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
