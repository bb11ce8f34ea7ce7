"""The bundled prompt sets as training data: one held-out split by prompt group, shared by the
demo, the benchmark and their length model, so what they replay was never trained on."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from steersman.control.training.length_model import (
    BASE_LAYERS,
    SMALL,
    grouped_split,
    train_length_model,
)
from steersman.data import PROMPT_SETS, path
from steersman.learners.bases import Base, packaged
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


@dataclass(frozen=True)
class DemoModel:
    directory: Path
    base: Base  # the pretrained base it was fine-tuned from; ``base.directory`` None: scratch
    trained_now: bool

    def describe(self) -> str:
        """Which base, in words: what the demo and the bench say they used."""
        if self.base.directory is not None:
            return f"fine-tuned from {self.base.name} (its first {BASE_LAYERS} layers)"
        return f"a RoBERTa trained from scratch ({self.base.reason})"


def ensure_length_model(
    data_dir: Path,
    counter: TokenCounter,
    *,
    budget_s: float = 180.0,
    max_rows: int = 20_000,
    progress: Callable[[int, int, dict], None] | None = None,
    base: Base | None = None,
) -> DemoModel:
    """The demo's and the bench's length model, trained once within ``budget_s`` and cached:
    fine-tuned from the packaged pretrained encoder where it is installed and intact, else a
    small RoBERTa from scratch (each cached under its own name)."""
    base = base if base is not None else packaged()
    name = "demo-minilm" if base.directory is not None else "demo-roberta"
    directory = data_dir / "models" / name
    if (directory / "steersman.json").exists() and (directory / "config.json").exists():
        return DemoModel(directory, base, trained_now=False)
    train, _ = held_out(bundled_records())
    rows = random.Random(SPLIT_SEED).sample(train, min(max_rows, len(train)))
    train_length_model(
        rows,
        counter,
        models_dir=data_dir / "models",
        out_dir=directory,
        base_model=base.directory,
        base_name=base.name if base.directory is not None else None,
        scratch=SMALL,
        epochs=4,
        time_budget_s=budget_s,
        val_fraction=0.05,  # the demo's held-out prompts are scored by benchmarks.learners
        seed=SPLIT_SEED,
        progress=progress,
    )
    return DemoModel(directory, base, trained_now=True)
