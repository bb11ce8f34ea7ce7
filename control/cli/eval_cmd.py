"""`steersman eval-predictor`: score the base, corrected and feature-only predictors on data
served in order, as in production (predict, then learn from the outcome)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from steersman.control.serve.settings import Settings
from steersman.control.training.tiny_model import served_model
from steersman.learners.datasets import load_prompt_set
from steersman.learners.evaluation import evaluate
from steersman.learners.tokens import TokenCounter


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
        from steersman.learners.hf import LengthModel  # torch: only with a model

        try:
            roberta = LengthModel.load(model)
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
