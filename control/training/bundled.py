"""The bundled prompt sets as training data: one held-out split by prompt group, shared by the
demo, the benchmark and their length model, so what they replay was never trained on."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from steersman.control.training.length_model import SMALL, grouped_split, train_length_model
from steersman.data import PROMPT_SETS, path
from steersman.learners.datasets import PromptRecord, load_prompt_set
from steersman.learners.tokens import TokenCounter

SPLIT_SEED = 0
VAL_FRACTION = 0.2


def bundled_records() -> list[PromptRecord]:
    records: list[PromptRecord] = []
    for name in PROMPT_SETS:
        records.extend(load_prompt_set(path(name))[0])
    return records


def held_out(records: list[PromptRecord]) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """(training prompts, held-out prompts): the demo and the benchmark replay only prompts whose
    group the length model never saw."""
    train, val = grouped_split([r.group for r in records], VAL_FRACTION, SPLIT_SEED)
    return [records[i] for i in train], [records[i] for i in val]


def ensure_length_model(
    data_dir: Path,
    counter: TokenCounter,
    *,
    budget_s: float = 180.0,
    max_rows: int = 6000,
    progress: Callable[[int, int, dict], None] | None = None,
) -> Path:
    """The demo's RoBERTa length model, trained once within ``budget_s`` and cached."""
    directory = data_dir / "models" / "demo-roberta"
    if (directory / "steersman.json").exists() and (directory / "config.json").exists():
        return directory
    train, _ = held_out(bundled_records())
    rows = random.Random(SPLIT_SEED).sample(train, min(max_rows, len(train)))
    train_length_model(
        rows,
        counter,
        models_dir=data_dir / "models",
        out_dir=directory,
        scratch=SMALL,
        epochs=4,
        time_budget_s=budget_s,
        seed=SPLIT_SEED,
        progress=progress,
    )
    return directory
