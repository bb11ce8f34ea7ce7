"""`steersman eval-predictor`: score the base, corrected and feature-only predictors on data
served in order, as in production (predict, then learn from the outcome)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from steersman.control.model_cmd import served_model
from steersman.control.settings import Settings
from steersman.learners.corrector import BASE_KEY, LengthCorrector
from steersman.learners.datasets import load_prompt_set
from steersman.learners.features import request_features
from steersman.learners.metrics import within
from steersman.learners.tokens import TokenCounter

PATHS = ("base", "corrected", "fast")


def score(pairs: list[tuple[float, float]]) -> dict[str, float | None]:
    """MAE, median relative error, within-30% rate and Kendall tau of (predicted, actual)."""
    if not pairs:
        return {
            "n": 0,
            "mae": None,
            "median_rel_error": None,
            "within_30": None,
            "kendall_tau": None,
        }
    from scipy.stats import kendalltau

    predicted, actual = zip(*pairs, strict=True)
    tau = kendalltau(predicted, actual).statistic if len(pairs) > 2 else math.nan
    return {
        "n": len(pairs),
        "mae": statistics.fmean(abs(p - a) for p, a in pairs),
        "median_rel_error": statistics.median(abs(p - a) / max(a, 1.0) for p, a in pairs),
        "within_30": statistics.fmean(within(p, a) for p, a in pairs),
        "kendall_tau": None if math.isnan(tau) else float(tau),
    }


def evaluate(
    prompts: list[str],
    actual: list[int],
    prompt_tokens: list[int],
    base: list[float] | None,
    checkpoints: tuple[int, ...] = (200, 1000),
    window: int = 200,
) -> dict[str, Any]:
    """Progressive evaluation in the given order; rolling MAE at each checkpoint."""
    fast, corrected = LengthCorrector(), LengthCorrector()
    pairs: dict[str, list[tuple[float, float]]] = {p: [] for p in PATHS}
    per_class: dict[str, dict[str, list[tuple[float, float]]]] = {}
    rolling: dict[int, dict[str, float]] = {}
    for i, (text, y) in enumerate(zip(prompts, actual, strict=True)):
        x: dict[str, Any] = request_features(text, prompt_tokens=prompt_tokens[i])
        guesses = {"fast": fast.predict_one(x)}
        if base is not None:
            guesses["base"] = base[i]
            guesses["corrected"] = corrected.predict_one({**x, BASE_KEY: base[i]})
        for name, value in guesses.items():
            pairs[name].append((value, float(y)))
            per_class.setdefault(x["request_class"], {p: [] for p in PATHS})[name].append(
                (value, float(y))
            )
        fast.learn_one(x, y)
        if base is not None:
            corrected.learn_one({**x, BASE_KEY: base[i]}, y)
        if i + 1 in checkpoints:
            rolling[i + 1] = {
                name: statistics.fmean(abs(p - a) for p, a in got[-window:])
                for name, got in pairs.items()
                if got
            }
    return {
        "rows": len(actual),
        "overall": {name: score(got) for name, got in pairs.items() if got},
        "per_class": {
            cls: {name: score(got) for name, got in paths.items() if got}
            for cls, paths in sorted(per_class.items())
        },
        "rolling_mae": rolling,
        "drift_events": corrected.drifts if base is not None else fast.drifts,
    }


def eval_command(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option(help="JSONL prompt/response file, served in order.")],
    model: Annotated[Path | None, typer.Option(help="RoBERTa model directory (the base).")] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Served model directory (default: the tiny demo model).")
    ] = None,
    max_rows: Annotated[int | None, typer.Option(min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """MAE, median relative error, within-30% and Kendall tau per predictor path and class."""
    settings: Settings = ctx.obj.settings()
    if not data.exists():
        typer.echo(f"--data {data}: no such file", err=True)
        raise typer.Exit(2)
    records, report = load_prompt_set(data)
    records = records[:max_rows] if max_rows else records
    counter = TokenCounter(tokenizer or served_model(settings.data_dir))
    actual = counter.count_many([r.response for r in records])
    prompt_tokens = counter.count_many([r.prompt for r in records])
    base = None
    if model is not None:
        from steersman.learners.hf import RobertaLengthModel  # torch: only with a model

        try:
            roberta = RobertaLengthModel.load(model)
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
        base = []
        for i in range(0, len(records), 64):
            base += [
                max(1.0, math.expm1(v))
                for v in roberta.predict_log([r.prompt for r in records[i : i + 64]])
            ]
    result = evaluate([r.prompt for r in records], actual, prompt_tokens, base)
    result["skipped_rows"] = len(report.skipped)
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table("class", "path", "n", "MAE", "median rel err", "within 30%", "Kendall tau")
    for cls, paths in [("all", result["overall"]), *result["per_class"].items()]:
        for name, s in paths.items():
            table.add_row(
                cls,
                name,
                str(s["n"]),
                *(
                    "-" if s[k] is None else f"{s[k]:.3f}"
                    for k in ("mae", "median_rel_error", "within_30", "kendall_tau")
                ),
            )
    Console().print(table)
