"""Training the RoBERTa length model on prompts with known response lengths, and registering it.

Shared by `steersman train`, the demo and the benchmark. Lengths are counted with the served
model's tokenizer; the validation split is grouped by prompt (AlpacaEval repeats each prompt for
many models), so no prompt is on both sides.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from steersman.learners.datasets import PromptRecord
from steersman.learners.metrics import score
from steersman.learners.tokens import TokenCounter
from steersman.storage.registry import (
    model_versions,
    new_version,
    register_model_version,
    set_status,
)

TINY = {"vocab_size": 1000, "hidden": 32, "layers": 1, "heads": 2}  # tests
SMALL = {"vocab_size": 4096, "hidden": 128, "layers": 2, "heads": 2}  # the offline default


def prompt_set(source: str) -> str:
    """The bundled set a record's source belongs to (or the source itself).

    >>> prompt_set("alpaca_eval/gpt4"), prompt_set("codealpaca_2k"), prompt_set("history")
    ('alpaca_eval', 'codealpaca', 'history')
    """
    head = source.split("/")[0]
    return "codealpaca" if head.startswith("codealpaca") else head or "other"


def grouped_split(groups: Sequence[str], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of train and validation rows (one group per row); a group is never on both
    sides.

    >>> grouped_split(["a", "a", "b", "c", "b"], 0.34, seed=0)
    ([2, 3, 4], [0, 1])
    """
    unique = sorted(set(groups))
    random.Random(seed).shuffle(unique)
    held = set(unique[: max(1, round(len(unique) * fraction))])
    train = [i for i, g in enumerate(groups) if g not in held]
    val = [i for i, g in enumerate(groups) if g in held]
    return train, val


@dataclass
class TrainedModel:
    version: str
    directory: Path
    created: datetime
    data_hash: str
    train_rows: int
    val_rows: int
    metrics: dict[str, Any]
    model: Any
    texts: list[str]
    targets_log: list[float]
    val_idx: list[int]


def train_length_model(
    records: list[PromptRecord],
    counter: TokenCounter | None,
    *,
    models_dir: Path,
    lengths: Sequence[int] | None = None,
    out_dir: Path | None = None,
    base_model: Path | None = None,
    scratch: dict[str, int] | None = None,
    epochs: int = 5,
    time_budget_s: float | None = None,
    val_fraction: float = 0.2,
    seed: int = 0,
    progress: Callable[[int, int, dict], None] | None = None,
    fit_options: dict[str, Any] | None = None,
    device: str = "cpu",
    rank_weight: float = 1.0,
) -> TrainedModel:
    """Train (fine-tune ``base_model``, or a new small RoBERTa) on the log-length regression plus
    ``rank_weight`` times a ranking loss (ListMLE), validate on held-out prompt groups and save
    a versioned directory with its metadata. The targets are ``lengths`` when
    given (the SQL history's actual token counts), else the responses counted by ``counter``."""
    from steersman.learners.hf import RobertaLengthModel  # torch: only when training

    if lengths is None:
        assert counter is not None, "a counter or the lengths"
        lengths = counter.count_many([r.response for r in records])
    targets = [math.log1p(max(n, 0)) for n in lengths]
    train_idx, val_idx = grouped_split([r.group for r in records], val_fraction, seed)
    texts = [r.prompt for r in records]
    if base_model is not None:
        model = RobertaLengthModel.load(base_model, device=device)
    else:
        model = RobertaLengthModel.from_scratch(
            [texts[i] for i in train_idx], seed=seed, **(scratch or SMALL)
        )
    report = model.fit(
        [texts[i] for i in train_idx],
        [targets[i] for i in train_idx],
        val_texts=[texts[i] for i in val_idx],
        val_targets_log=[targets[i] for i in val_idx],
        epochs=epochs,
        time_budget_s=time_budget_s,
        seed=seed,
        progress=progress,
        **{"rank_weight": rank_weight, **(fit_options or {})},
    )
    predicted = model.predict_log([texts[i] for i in val_idx])
    pairs = [
        (math.expm1(p), math.expm1(targets[i])) for p, i in zip(predicted, val_idx, strict=True)
    ]
    val = score(pairs)
    by_set: dict[str, list[tuple[float, float]]] = {}
    for i, pair in zip(val_idx, pairs, strict=True):
        by_set.setdefault(prompt_set(records[i].source), []).append(pair)
    metrics = {
        "val_mae_tokens": val["mae"],
        "val_within_30": val["within_30"],
        "val_median_rel_error": val["median_rel_error"],
        "val_kendall_tau": val["kendall_tau"],
        "val_mae_log": report["best_val_mae_log"],
        "val_per_set": {
            name: {k: got[k] for k in ("n", "kendall_tau", "within_30", "mae")}
            for name, got in sorted((n, score(p)) for n, p in by_set.items())
        },
        **{k: report[k] for k in ("stopped", "train_seconds", "steps")},
    }
    digest = hashlib.sha256()
    for r, t in zip(records, targets, strict=True):
        digest.update(f"{r.id}\t{t:.6f}\n".encode())
    created = datetime.now(UTC)
    version = new_version(created)
    directory = out_dir or models_dir / version
    model.save(
        directory,
        {
            "version": version,
            "created_at": created.isoformat(),
            "data_hash": digest.hexdigest(),
            "train_rows": len(train_idx),
            "val_rows": len(val_idx),
            "seed": seed,
            "metrics": metrics,
            "base_model": str(base_model) if base_model else None,
            "rank_weight": rank_weight,
        },
    )
    return TrainedModel(
        version,
        directory,
        created,
        digest.hexdigest(),
        len(train_idx),
        len(val_idx),
        metrics,
        model,
        texts,
        targets,
        val_idx,
    )


def register(engine: Engine, trained: TrainedModel, *, notes: str, promote: bool) -> None:
    """A row in model_versions; ``promote`` makes it the one `steersman serve` loads by default."""
    register_model_version(
        engine,
        {
            "version": trained.version,
            "created_at": trained.created,
            "kind": "roberta",
            "path": str(trained.directory),
            "data_hash": trained.data_hash,
            "train_rows": trained.train_rows,
            "val_rows": trained.val_rows,
            "metrics": trained.metrics,
            "status": "candidate",
            "notes": notes,
        },
    )
    if promote:
        promote_version(engine, trained.version)


def promote_version(engine: Engine, version: str) -> None:
    """Make ``version`` the promoted one; the one promoted before is retired."""
    for row in model_versions(engine):
        if row["status"] == "promoted" and row["version"] != version:
            set_status(engine, row["version"], "retired")
    set_status(engine, version, "promoted", promoted_at=datetime.now(UTC))
