"""`steersman train`: train the RoBERTa length model on prompt/response data and register it."""

from __future__ import annotations

import random
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from steersman.control.cli.progress import StepProgress
from steersman.control.serve.settings import Settings
from steersman.control.training.length_model import (
    SMALL,
    TINY,
    TrainedModel,
    register,
    train_length_model,
)
from steersman.control.training.retrain import history_records
from steersman.control.training.tiny_model import served_model
from steersman.data import PROMPT_SETS, path
from steersman.learners.bases import Base, BaseModelError, check_directory, packaged
from steersman.learners.datasets import PromptRecord, load_prompt_set
from steersman.learners.tokens import TokenCounter
from steersman.storage import migrate
from steersman.storage.engine import (
    DatabaseUnavailable,
    check_connection,
    make_engine,
    mask_url,
)

err = Console(stderr=True, highlight=False, soft_wrap=True)


class Size(StrEnum):
    tiny = "tiny"  # tests: hidden 32, one layer
    small = "small"  # the offline default: hidden 128, two layers


SIZES = {Size.tiny: TINY, Size.small: SMALL}


def train_command(
    ctx: typer.Context,
    data: Annotated[list[Path] | None, typer.Option(help="JSONL prompt/response file(s).")] = None,
    bundled: Annotated[
        str, typer.Option(help=f"Bundled sets when no --data: {', '.join(PROMPT_SETS)}.")
    ] = "alpaca,codealpaca,alpaca_eval",
    base_model: Annotated[
        Path | None,
        typer.Option(
            help="A local Hugging Face encoder directory to fine-tune (roberta-base, a BERT, "
            "MiniLM, MPNet or DeBERTa); default: the packaged all-MiniLM-L6-v2 where it is "
            "installed, else a small RoBERTa trained from scratch."
        ),
    ] = None,
    scratch: Annotated[
        bool, typer.Option("--scratch", help="Train a small RoBERTa from scratch (no base).")
    ] = False,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Served model directory whose tokenizer counts lengths "
            "(default: the tiny demo model)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Model directory (default: <data_dir>/models/roberta-<time>)."),
    ] = None,
    size: Annotated[Size, typer.Option(help="Model size when training from scratch.")] = Size.small,
    epochs: Annotated[int, typer.Option(min=1)] = 5,
    time_budget: Annotated[
        float | None, typer.Option(help="Stop training after this many seconds.")
    ] = None,
    max_rows: Annotated[
        int | None, typer.Option(min=10, help="Use at most this many rows.")
    ] = None,
    val_fraction: Annotated[float, typer.Option(min=0.05, max=0.5)] = 0.2,
    seed: Annotated[int, typer.Option()] = 0,
    db: Annotated[str | None, typer.Option("--db", help="Database URL for the registry.")] = None,
    from_history: Annotated[
        bool,
        typer.Option(
            "--from-history",
            help="Train on the SQL history's finished requests (prompt text and actual tokens).",
        ),
    ] = False,
    promote: Annotated[
        bool, typer.Option(help="Mark it promoted: `steersman serve` then loads it by default.")
    ] = False,
    rank_weight: Annotated[
        float,
        typer.Option(min=0.0, help="Weight of the ranking loss (ListMLE) beside the regression."),
    ] = 1.0,
    device: Annotated[
        str,
        typer.Option(
            help="The torch device to train on: cpu, cuda, cuda:1 (a GPU fine-tunes the "
            "pretrained base in minutes)."
        ),
    ] = "cpu",
    compare: Annotated[
        bool,
        typer.Option(
            help="Train the scratch RoBERTa and the pretrained base, each with the regression "
            "alone and with the ranking loss, on the same split, and report all four per prompt "
            "set: Kendall tau (within each served model too), within-30% and MAE; the last "
            "(the base with the ranking loss) is saved and registered."
        ),
    ] = False,
) -> None:
    """Train the length regressor on log1p(tokens), validate on held-out prompt groups, save a
    versioned model directory and register it in model_versions."""
    settings: Settings = ctx.obj.settings(db=db)
    records: list[PromptRecord] = []
    lengths: list[int] | None = None
    named = [path(n.strip()) for n in bundled.split(",") if n.strip()]
    sources = [] if from_history else data or named
    if from_history:
        try:
            records, lengths = history_records(
                make_engine(settings.database_url), max_rows or 20_000
            )
        except Exception as exc:
            err.print(f"cannot read the SQL history at {mask_url(settings.database_url)}: {exc}",
                      markup=False)  # fmt: skip
            raise typer.Exit(1) from None
        err.print(f"{len(records)} finished requests with prompt text in the history", markup=False)
    for source in sources:
        if not Path(source).exists():
            err.print(f"--data {source}: no such file", markup=False)
            raise typer.Exit(2)
        loaded, report = load_prompt_set(Path(source))
        err.print(report.summary(), markup=False)
        records.extend(loaded)
    if max_rows is not None and len(records) > max_rows and lengths is None:
        records = random.Random(seed).sample(records, max_rows)
    if len(records) < 10:
        err.print(f"too few usable rows to train on: {len(records)}", markup=False)
        raise typer.Exit(2)
    counter = None if lengths else TokenCounter(tokenizer or served_model(settings.data_dir))
    try:
        base = _base(base_model, scratch)
    except BaseModelError as exc:
        err.print(f"error: --base-model: {exc}", markup=False)
        raise typer.Exit(2) from None
    if base.directory is None:
        err.print(f"base: none, a RoBERTa trained from scratch ({base.reason})", markup=False)
    else:
        err.print(f"base: {base.name} ({base.directory})", markup=False)
    if compare and base.directory is None:
        err.print("--compare needs a pretrained base beside the scratch model", markup=False)
        raise typer.Exit(2)
    runs: list[tuple[str, Base, float]] = [("base", base, rank_weight)]
    if compare:
        none = Base("scratch RoBERTa", None)
        runs = [("scratch RoBERTa", none, 0.0), ("scratch RoBERTa", none, rank_weight),
                (base.name, base, 0.0), (base.name, base, rank_weight)]  # fmt: skip
    results: list[tuple[str, float, TrainedModel]] = []
    failure = None
    for k, (label, start, weight) in enumerate(runs):
        last = k == len(runs) - 1
        with StepProgress(err, f"training {label}, ListMLE weight {weight:g}") as progress:

            def tick(step: int, total: int, info: dict, progress=progress) -> None:
                progress.update(
                    completed=step, total=total,
                    info=f"epoch {info['epoch']} loss {info['loss']:.3f}",
                )  # fmt: skip

            try:
                trained = train_length_model(
                    records,
                    counter,
                    out_dir=out if last else None,
                    models_dir=settings.data_dir / "models",
                    lengths=lengths,
                    base_model=start.directory,
                    base_name=start.name if start.directory is not None else None,
                    scratch=SIZES[size],
                    epochs=epochs,
                    time_budget_s=time_budget,
                    val_fraction=val_fraction,
                    seed=seed,
                    progress=tick,
                    rank_weight=weight,
                    device=device,
                )
            except ValueError as exc:  # a directory that is not an encoder: the reason
                failure = str(exc)
                progress.remove()
                break
        results.append((label, weight, trained))
    if failure is not None:
        err.print(f"error: {failure}", markup=False)
        raise typer.Exit(2)
    if compare:
        Console(width=140).print(_comparison(results))
    target_dir, metrics, version = trained.directory, trained.metrics, trained.version
    try:
        engine = make_engine(settings.database_url)
        check_connection(engine)
        migrate.upgrade(engine)
        register(engine, trained, notes=f"steersman train, seed {seed}", promote=promote)
    except DatabaseUnavailable as exc:
        err.print(f"model saved in {target_dir} but not registered: {exc}", markup=False)
        raise typer.Exit(1) from None
    typer.echo(str(target_dir))
    err.print(
        f"{version}: val MAE {metrics['val_mae_tokens']:.1f} tokens, within 30% "
        f"{metrics['val_within_30']:.3f} ({metrics['stopped']}, "
        f"{metrics['train_seconds']} s)",
        markup=False,
    )


def _base(base_model: Path | None, scratch: bool) -> Base:
    """The base to fine-tune: the operator's directory (checked), none with --scratch, else the
    packaged one where it is installed and intact."""
    if scratch:
        return Base("scratch RoBERTa", None, "--scratch")
    if base_model is not None:
        return Base(base_model.name, check_directory(base_model))
    return packaged()


def _comparison(results: list[tuple[str, float, TrainedModel]]) -> Table:
    table = Table(
        "prompt set", "start", "objective", "rows", "Kendall tau", "within 30%", "MAE (tokens)",
        title="Validation on held-out prompt groups (AlpacaEval also within each served model)",
    )  # fmt: skip
    for label, weight, trained in results:
        objective = "regression" if weight == 0 else f"+ {weight:g} x ListMLE"
        m = trained.metrics
        overall = {"n": trained.val_rows, "kendall_tau": m["val_kendall_tau"],
                   "within_30": m["val_within_30"], "mae": m["val_mae_tokens"]}  # fmt: skip
        rows = [*m["val_per_set"].items(), ("all", overall)]
        within = m.get("val_within_model")
        if within:
            rows.append((f"within {within['models']} models", {**within, "n": "", "mae": None}))
        for name, got in rows:
            table.add_row(name, label, objective, str(got["n"]), *(_num(got[k]) for k in
                          ("kendall_tau", "within_30", "mae")))  # fmt: skip
    return table


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
