"""`steersman train`: train the RoBERTa length model on prompt/response data and register it."""

from __future__ import annotations

import hashlib
import math
import random
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from steersman.control.eval_cmd import score
from steersman.control.model_cmd import served_model
from steersman.control.settings import Settings
from steersman.data import PROMPT_SETS, path
from steersman.learners.datasets import PromptRecord, load_prompt_set
from steersman.learners.tokens import TokenCounter
from steersman.storage import migrate
from steersman.storage.engine import DatabaseUnavailable, check_connection, make_engine
from steersman.storage.registry import (
    model_versions,
    new_version,
    register_model_version,
    set_status,
)

err = Console(stderr=True, highlight=False)


class Size(StrEnum):
    tiny = "tiny"  # tests: hidden 32, one layer
    small = "small"  # the offline default: hidden 128, two layers


SIZES = {
    Size.tiny: {"vocab_size": 1000, "hidden": 32, "layers": 1, "heads": 2},
    Size.small: {"vocab_size": 4096, "hidden": 128, "layers": 2, "heads": 2},
}


def grouped_split(
    records: list[PromptRecord], fraction: float, seed: int
) -> tuple[list[int], list[int]]:
    """Indices of train and validation rows; a prompt group is never on both sides."""
    groups = sorted({r.group for r in records})
    random.Random(seed).shuffle(groups)
    held = set(groups[: max(1, round(len(groups) * fraction))])
    train = [i for i, r in enumerate(records) if r.group not in held]
    val = [i for i, r in enumerate(records) if r.group in held]
    return train, val


def train_command(
    ctx: typer.Context,
    data: Annotated[list[Path] | None, typer.Option(help="JSONL prompt/response file(s).")] = None,
    bundled: Annotated[
        str, typer.Option(help=f"Bundled sets when no --data: {', '.join(PROMPT_SETS)}.")
    ] = "alpaca,codealpaca,alpaca_eval",
    base_model: Annotated[
        Path | None,
        typer.Option(
            help="Local HF encoder to fine-tune (e.g. roberta-base); none trains from scratch."
        ),
    ] = None,
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
    promote: Annotated[
        bool, typer.Option(help="Mark it promoted: `steersman serve` then loads it by default.")
    ] = False,
) -> None:
    """Train the length regressor on log1p(tokens), validate on held-out prompt groups, save a
    versioned model directory and register it in model_versions."""
    settings: Settings = ctx.obj.settings(db=db)
    from steersman.learners.hf import RobertaLengthModel  # torch: only for this command

    records: list[PromptRecord] = []
    sources = data or [path(n.strip()) for n in bundled.split(",") if n.strip()]
    for source in sources:
        if not Path(source).exists():
            err.print(f"--data {source}: no such file", markup=False)
            raise typer.Exit(2)
        loaded, report = load_prompt_set(Path(source))
        err.print(report.summary(), markup=False)
        records.extend(loaded)
    if max_rows is not None and len(records) > max_rows:
        records = random.Random(seed).sample(records, max_rows)
    if len(records) < 10:
        err.print(f"too few usable rows to train on: {len(records)}", markup=False)
        raise typer.Exit(2)
    counter = TokenCounter(tokenizer or served_model(settings.data_dir))
    targets = [math.log1p(n) for n in counter.count_many([r.response for r in records])]
    train_idx, val_idx = grouped_split(records, val_fraction, seed)
    texts = [r.prompt for r in records]

    if base_model is not None:
        model = RobertaLengthModel.load(base_model)
    else:
        model = RobertaLengthModel.from_scratch(
            [texts[i] for i in train_idx], seed=seed, **SIZES[size]
        )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
    ) as progress:
        task = progress.add_task("training", total=None, info="")

        def tick(step: int, total: int, info: dict) -> None:
            progress.update(
                task,
                completed=step,
                total=total,
                info=f"epoch {info['epoch']} loss {info['loss']:.3f}",
            )

        report = model.fit(
            [texts[i] for i in train_idx],
            [targets[i] for i in train_idx],
            val_texts=[texts[i] for i in val_idx],
            val_targets_log=[targets[i] for i in val_idx],
            epochs=epochs,
            time_budget_s=time_budget,
            seed=seed,
            progress=tick,
        )
    predicted = model.predict_log([texts[i] for i in val_idx])
    val = score(
        [(math.expm1(p), math.expm1(targets[i])) for p, i in zip(predicted, val_idx, strict=True)]
    )
    metrics = {
        "val_mae_tokens": val["mae"],
        "val_within_30": val["within_30"],
        "val_median_rel_error": val["median_rel_error"],
        "val_kendall_tau": val["kendall_tau"],
        "val_mae_log": report["best_val_mae_log"],
        **{k: report[k] for k in ("stopped", "train_seconds", "steps")},
    }
    digest = hashlib.sha256()
    for r, t in zip(records, targets, strict=True):
        digest.update(f"{r.id}\t{t:.6f}\n".encode())
    created = datetime.now(UTC)
    version = new_version(created)
    target_dir = out or settings.data_dir / "models" / version
    model.save(
        target_dir,
        {
            "version": version,
            "created_at": created.isoformat(),
            "data_hash": digest.hexdigest(),
            "train_rows": len(train_idx),
            "val_rows": len(val_idx),
            "seed": seed,
            "metrics": metrics,
            "base_model": str(base_model) if base_model else None,
        },
    )
    try:
        engine = make_engine(settings.database_url)
        check_connection(engine)
        migrate.upgrade(engine)
        register_model_version(
            engine,
            {
                "version": version,
                "created_at": created,
                "kind": "roberta",
                "path": str(target_dir),
                "data_hash": digest.hexdigest(),
                "train_rows": len(train_idx),
                "val_rows": len(val_idx),
                "metrics": metrics,
                "status": "candidate",
                "notes": f"steersman train, seed {seed}",
            },
        )
        if promote:
            for row in model_versions(engine):
                if row["status"] == "promoted":
                    set_status(engine, row["version"], "retired")
            set_status(engine, version, "promoted", promoted_at=datetime.now(UTC))
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
