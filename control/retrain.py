"""Retraining from the SQL history: train a candidate, validate it against the served model on
the same held-out rows, promote only if better, and hot-swap it in without dropping a request."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from steersman.control.training import grouped_split
from steersman.storage.models import RequestRow
from steersman.storage.registry import (
    model_versions,
    new_version,
    register_model_version,
    set_status,
)

log = logging.getLogger(__name__)

MIN_ROWS = 50


@dataclass
class HistoryData:
    texts: list[str]
    targets_log: list[float]
    groups: list[str]
    digest: str


@dataclass
class RetrainOutcome:
    status: str  # "promoted", "rejected", "skipped" or "failed"
    reason: str
    version: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def history_data(engine: Engine, max_rows: int) -> HistoryData:
    """The newest finished requests that kept their prompt text, with their actual lengths in
    the served model's tokens (from the server's usage counts)."""
    r = RequestRow
    query = (
        select(r.prompt_text, r.actual_tokens, r.prompt_sha256)
        .where(r.prompt_text.is_not(None), r.actual_tokens.is_not(None), r.error.is_(None))
        .order_by(r.id.desc())
        .limit(max_rows)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    digest = hashlib.sha256()
    texts, targets, groups = [], [], []
    for text, actual, sha in rows:
        texts.append(text)
        targets.append(math.log1p(max(actual, 0)))
        groups.append(sha or hashlib.sha256(text.encode()).hexdigest())
        digest.update(f"{groups[-1]}\t{actual}\n".encode())
    return HistoryData(texts, targets, groups, digest.hexdigest())


class Retrainer:
    """``run()`` is the daemon's retraining job. ``swap(model, version)`` is called with a
    loaded, validated model to serve; ``event(kind, reason, details)`` records what happened."""

    def __init__(
        self,
        engine: Engine,
        models_dir: Path,
        *,
        swap: Callable[[Any, str], None],
        event: Callable[[str, str, dict[str, Any]], None],
        current: Callable[[], tuple[Path | None, str | None]],
        budget_s: float = 600.0,
        max_rows: int = 20_000,
        val_fraction: float = 0.2,
        epochs: int = 3,
        seed: int = 0,
        device: str = "cpu",
        scratch: dict[str, Any] | None = None,
        fit: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.models_dir = models_dir
        self.swap = swap
        self.event = event
        self.current = current
        self.budget_s = budget_s
        self.max_rows = max_rows
        self.val_fraction = val_fraction
        self.epochs = epochs
        self.seed = seed
        self.device = device
        self.scratch = scratch or {}  # from_scratch hyperparameters (size of a new model)
        self.fit = fit or {}  # more fit() options: lr, patience, batch_size

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
        from steersman.learners.hf import RobertaLengthModel  # torch: only when retraining

        data = history_data(self.engine, self.max_rows)
        if len(data.texts) < MIN_ROWS or len(set(data.groups)) < 5:
            return RetrainOutcome("skipped", f"{len(data.texts)} usable rows in the history")
        train, val = grouped_split(data.groups, self.val_fraction, self.seed)
        pick = lambda idx, xs: [xs[i] for i in idx]  # noqa: E731
        val_texts, val_targets = pick(val, data.texts), pick(val, data.targets_log)
        current_dir, current_version = self.current()
        current_mae = None
        if current_dir is not None:
            served = RobertaLengthModel.load(current_dir, device=self.device)
            current_mae = served.validation_mae_log(val_texts, val_targets)
            candidate = RobertaLengthModel.load(current_dir, device=self.device)
        else:
            candidate = RobertaLengthModel.from_scratch(
                pick(train, data.texts), seed=self.seed, **self.scratch
            )
        report = candidate.fit(
            pick(train, data.texts),
            pick(train, data.targets_log),
            val_texts=val_texts,
            val_targets_log=val_targets,
            epochs=self.epochs,
            time_budget_s=self.budget_s,
            seed=self.seed,
            **self.fit,
        )
        candidate_mae = candidate.validation_mae_log(val_texts, val_targets)
        created = datetime.now(UTC)
        version = new_version(created)
        better = current_mae is None or candidate_mae < current_mae
        metrics = {
            "val_mae_log": round(candidate_mae, 5),
            "current_val_mae_log": None if current_mae is None else round(current_mae, 5),
            "current_version": current_version,
            "stopped": report["stopped"],
            "train_seconds": report["train_seconds"],
        }
        directory = self.models_dir / version
        candidate.save(directory, {"version": version, "metrics": metrics, "source": "history"})
        register_model_version(
            self.engine,
            {
                "version": version,
                "created_at": created,
                "kind": "roberta",
                "path": str(directory),
                "data_hash": data.digest,
                "train_rows": len(train),
                "val_rows": len(val),
                "metrics": metrics,
                "status": "candidate",
                "notes": "retrained from the SQL history",
            },
        )
        if not better:
            set_status(self.engine, version, "rejected")
            reason = f"val MAE(log) {candidate_mae:.4f} not below current {current_mae:.4f}"
            return RetrainOutcome("rejected", reason, version, metrics)
        # Load what was saved: a directory that does not load is never swapped in.
        fresh = RobertaLengthModel.load(directory, device=self.device)
        self.swap(fresh, version)
        for row in model_versions(self.engine):
            if row["status"] == "promoted" and row["version"] != version:
                set_status(self.engine, row["version"], "retired")
        set_status(self.engine, version, "promoted", promoted_at=datetime.now(UTC))
        was = "none" if current_mae is None else f"{current_mae:.4f}"
        reason = f"val MAE(log) {candidate_mae:.4f} vs current {was}"
        return RetrainOutcome("promoted", reason, version, metrics)
