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
from steersman.learners.metrics import error_quantiles, score
from steersman.learners.tokens import TokenCounter
from steersman.storage.registry import (
    model_versions,
    new_version,
    register_model_version,
    set_status,
)

TINY = {"vocab_size": 1000, "hidden": 32, "layers": 1, "heads": 2}  # tests
SMALL = {"vocab_size": 4096, "hidden": 128, "layers": 2, "heads": 2}  # without a pretrained base
# How each start is trained: a pretrained encoder gently, its new head faster; a RoBERTa built
# from scratch at a higher rate.
PRETRAINED_FIT = {"lr": 5e-5, "head_lr": 1e-3, "batch_size": 16}
SCRATCH_FIT = {"lr": 5e-4}
# The layers of a pretrained base that are kept: the lower layers carry what a prompt says of
# its answer's length, and half of all-MiniLM's six serve int8 within 5 ms on one CPU core
# (docs/predictions.md).
BASE_LAYERS = 3


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


def within_model(by_source: dict[str, list[tuple[float, float]]]) -> dict[str, Any] | None:
    """Scores within each served model of a prompt set that answers each prompt with several
    models (AlpacaEval's ``alpaca_eval/<model>`` sources): a pool serves one model, so ranking
    is judged among one model's answers. The mean over the models, and each one's tau.

    >>> got = within_model({"alpaca_eval/a": [(1, 1), (2, 2), (3, 3)],
    ...                     "alpaca_eval/b": [(1, 2), (2, 1), (3, 3)], "alpaca": [(1, 1)]})
    >>> got["models"], round(got["kendall_tau"], 3)
    (2, 0.667)
    """
    scores = {
        source.split("/", 1)[1]: score(pairs)
        for source, pairs in by_source.items()
        if "/" in source and len(pairs) > 2
    }
    taus = {m: s["kendall_tau"] for m, s in scores.items() if s["kendall_tau"] is not None}
    if not taus:
        return None
    return {
        "models": len(taus),
        "kendall_tau": sum(taus.values()) / len(taus),
        "within_30": sum(s["within_30"] for s in scores.values()) / len(scores),
        "per_model": dict(sorted(taus.items())),
    }


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
    model_type: str = "roberta"
    base_model: str | None = None  # what it was fine-tuned from (None: a new RoBERTa)


def train_length_model(
    records: list[PromptRecord],
    counter: TokenCounter | None,
    *,
    models_dir: Path,
    lengths: Sequence[int] | None = None,
    out_dir: Path | None = None,
    base_model: Path | None = None,
    base_name: str | None = None,
    base_layers: int | None = BASE_LAYERS,
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
    a versioned directory with its metadata. ``base_model`` is a pretrained encoder (its first
    ``base_layers`` layers are kept) or a length model trained before (trained further);
    ``base_name`` is what the registry calls it. The targets are ``lengths`` when given (the SQL
    history's actual token counts), else the responses counted by ``counter``."""
    from steersman.learners.hf import LengthModel  # torch: only when training

    if lengths is None:
        assert counter is not None, "a counter or the lengths"
        lengths = counter.count_many([r.response for r in records])
    targets = [math.log1p(max(n, 0)) for n in lengths]
    train_idx, val_idx = grouped_split([r.group for r in records], val_fraction, seed)
    texts = [r.prompt for r in records]
    if base_model is not None:
        model = LengthModel.load(base_model, device=device, layers=base_layers)
        recipe = PRETRAINED_FIT
    else:
        model = LengthModel.from_scratch(
            [texts[i] for i in train_idx], seed=seed, **(scratch or SMALL)
        )
        recipe = SCRATCH_FIT
    report = model.fit(
        [texts[i] for i in train_idx],
        [targets[i] for i in train_idx],
        val_texts=[texts[i] for i in val_idx],
        val_targets_log=[targets[i] for i in val_idx],
        epochs=epochs,
        time_budget_s=time_budget_s,
        seed=seed,
        progress=progress,
        **{"rank_weight": rank_weight, **recipe, **(fit_options or {})},
    )
    predicted = model.predict_many([texts[i] for i in val_idx])
    pairs = [
        (math.expm1(p), math.expm1(targets[i])) for p, i in zip(predicted, val_idx, strict=True)
    ]
    val = score(pairs)
    by_set: dict[str, list[tuple[float, float]]] = {}
    by_source: dict[str, list[tuple[float, float]]] = {}
    for i, pair in zip(val_idx, pairs, strict=True):
        by_set.setdefault(prompt_set(records[i].source), []).append(pair)
        by_source.setdefault(records[i].source, []).append(pair)
    metrics = {
        "val_mae_tokens": val["mae"],
        "val_within_30": val["within_30"],
        "val_median_rel_error": val["median_rel_error"],
        "val_kendall_tau": val["kendall_tau"],
        "val_within_model": within_model(by_source),
        "val_mae_log": report["best_val_mae_log"],
        # the corrector's bands before outcomes (LengthCorrector.adopt_errors)
        "val_error_quantiles": error_quantiles(predicted, [targets[i] for i in val_idx]),
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
    version = new_version(created, model.model_type)
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
            "base_model": base_name or (str(base_model) if base_model else None),
            "base_path": str(base_model) if base_model else None,
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
        model.model_type,
        base_name or (str(base_model) if base_model else None),
    )


def register(engine: Engine, trained: TrainedModel, *, notes: str, promote: bool) -> None:
    """A row in model_versions; ``promote`` makes it the one `steersman serve` loads by default."""
    register_model_version(
        engine,
        {
            "version": trained.version,
            "created_at": trained.created,
            "kind": trained.model_type,
            "base_model": trained.base_model,
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
