"""Realistic history rows for tests and benchmarks."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def request_row(i: int, **overrides: Any) -> dict[str, Any]:
    received = T0 + timedelta(milliseconds=10 * i)
    prompt = f"Explain topic number {i} in a few sentences."
    row: dict[str, Any] = {
        "request_id": f"req-{i:08d}",
        "received_at": received,
        "dispatched_at": received + timedelta(milliseconds=1),
        "first_token_at": received + timedelta(milliseconds=80),
        "finished_at": received + timedelta(seconds=2),
        "instance": f"vllm-{i % 2}",
        "policy": "predictive",
        "mode": "NORMAL",
        "request_class": "chat",
        "priority": 3,
        "prompt_tokens": 12 + i % 50,
        "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
        "prompt_text": prompt,
        "features": {"question_words": 1, "length_hint": None},
        "max_tokens": 512,
        "predictor_path": "roberta",
        "base_prediction": 100.0,
        "corrected_prediction": 110.0,
        "scheduled_prediction": 142.0,
        "actual_tokens": 120,
        "abs_error": 22.0,
        "rel_error": 22.0 / 120,
        "miss": False,
        "ttft_s": 0.08,
        "e2e_s": 2.0,
        "tpot_s": 0.016,
        "qoe": 1.0,
        "model_version": "roberta-0001",
        "finish_reason": "length",
        "error": None,
    }
    row.update(overrides)
    return row
