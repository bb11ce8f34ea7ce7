"""Retraining from the SQL history: train a candidate, validate it against the served model on
the same held-out rows, promote only if clearly better, and hot-swap it in without dropping a
request."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from steersman.control.training.length_model import promote_version, register, train_length_model
from steersman.learners.bases import Base, packaged
from steersman.learners.datasets import PromptRecord
from steersman.storage.models import RequestRow
from steersman.storage.registry import set_status

log = logging.getLogger(__name__)

MIN_ROWS = 50


@dataclass
class RetrainOutcome:
    status: str  # "promoted", "rejected", "skipped" or "failed"
    reason: str
    version: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def history_records(engine: Engine, max_rows: int) -> tuple[list[PromptRecord], list[int]]:
    """The newest finished requests that kept their prompt text, as records grouped by prompt
    (the id is the prompt's hash), and their actual lengths in the served model's tokens (the
    server's usage counts)."""
    r = RequestRow
    query = (
        select(r.prompt_text, r.actual_tokens, r.prompt_sha256)
        .where(r.prompt_text.is_not(None), r.actual_tokens.is_not(None), r.error.is_(None))
        .order_by(r.id.desc())
        .limit(max_rows)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    records = [
        PromptRecord(sha or hashlib.sha256(text.encode()).hexdigest(), "history", text, "")
        for text, _, sha in rows
    ]
    return records, [max(actual, 0) for _, actual, _ in rows]


def retrain_base(base_model: Path | None) -> Base:
    """The base retraining fine-tunes from: the operator's (``predictor.base_model``, checked
    when the settings were read), else the packaged all-MiniLM-L6-v2, else none (the reason)."""
    if base_model is not None:
        return Base(Path(base_model).name, Path(base_model))
    return packaged()


class Retrainer:
    """``run()`` is the daemon's retraining job. ``swap(model, version, directory)`` is called
    with a loaded, validated model to serve; ``event(kind, reason, details)`` records what
    happened; ``current()`` says which model directory and version serve now."""

    def __init__(
        self,
        engine: Engine,
        models_dir: Path,
        *,
        swap: Callable[[Any, str, Path], None],
        event: Callable[[str, str, dict[str, Any]], None],
        current: Callable[[], tuple[Path | None, str | None]],
        budget_s: float = 600.0,
        max_rows: int = 20_000,
        min_gain: float = 0.02,
        val_fraction: float = 0.2,
        epochs: int = 3,
        seed: int = 0,
        device: str = "cpu",
        scratch: dict[str, Any] | None = None,
        fit: dict[str, Any] | None = None,
        base: Base | None = None,
    ) -> None:
        self.engine = engine
        self.models_dir = models_dir
        self.swap = swap
        self.event = event
        self.current = current
        self.budget_s = budget_s
        self.max_rows = max_rows
        self.min_gain = min_gain  # the share by which a candidate must beat the served model
        self.val_fraction = val_fraction
        self.epochs = epochs
        self.seed = seed
        self.device = device
        self.scratch = scratch  # from_scratch hyperparameters (the size of a new model)
        self.fit = fit  # more fit() options: lr, patience, batch_size
        # The pretrained encoder each candidate is fine-tuned from; without one, the served
        # model is trained further (or, with none served, a RoBERTa from scratch).
        self.base = base

    def run(self) -> RetrainOutcome:
        try:
            outcome = self._run()
        except Exception as exc:
            log.exception("retraining failed")
            outcome = RetrainOutcome("failed", f"{type(exc).__name__}: {exc}")
        details = {"version": outcome.version, **outcome.metrics}
        self.event("retrain", f"retraining {outcome.status}: {outcome.reason}", details)
        return outcome

    def _run(self) -> RetrainOutcome:
        from steersman.learners.hf import LengthModel  # torch: only when retraining

        records, lengths = history_records(self.engine, self.max_rows)
        if len(records) < MIN_ROWS or len({r.group for r in records}) < 5:
            return RetrainOutcome("skipped", f"{len(records)} usable rows in the history")
        current_dir, current_version = self.current()
        pretrained = self.base is not None and self.base.directory is not None
        start = self.base.directory if pretrained else current_dir
        trained = train_length_model(
            records,
            None,
            lengths=lengths,
            models_dir=self.models_dir,
            base_model=start,
            base_name=self.base.name if pretrained else current_version,
            scratch=self.scratch,
            epochs=self.epochs,
            time_budget_s=self.budget_s,
            val_fraction=self.val_fraction,
            seed=self.seed,
            fit_options=self.fit,
            device=self.device,
        )
        val_texts = [trained.texts[i] for i in trained.val_idx]
        val_targets = [trained.targets_log[i] for i in trained.val_idx]
        candidate_mae = trained.model.validation_mae_log(val_texts, val_targets)
        current_mae = None
        if current_dir is not None:  # the served model, scored on the very same rows
            served = LengthModel.load(current_dir, device=self.device)
            current_mae = served.validation_mae_log(val_texts, val_targets)
        trained.metrics.update(
            val_mae_log=round(candidate_mae, 5),
            current_val_mae_log=None if current_mae is None else round(current_mae, 5),
            current_version=current_version,
        )
        register(self.engine, trained, notes="retrained from the SQL history", promote=False)
        keep = ("val_mae_log", "current_val_mae_log", "current_version", "stopped", "train_seconds")
        metrics = {k: trained.metrics[k] for k in keep}
        if current_mae is not None and candidate_mae > (1 - self.min_gain) * current_mae:
            set_status(self.engine, trained.version, "rejected")
            reason = (
                f"val MAE(log) {candidate_mae:.4f} not {self.min_gain:.0%} below current "
                f"{current_mae:.4f}"
            )
            return RetrainOutcome("rejected", reason, trained.version, metrics)
        # Load what was saved: a directory that does not load is never swapped in.
        fresh = LengthModel.load(trained.directory, device=self.device)
        self.swap(fresh, trained.version, trained.directory)
        promote_version(self.engine, trained.version)
        was = "none" if current_mae is None else f"{current_mae:.4f}"
        reason = f"val MAE(log) {candidate_mae:.4f} vs current {was}"
        return RetrainOutcome("promoted", reason, trained.version, metrics)
