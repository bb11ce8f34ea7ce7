"""Retraining from the SQL history: validate against the served model, promote only if clearly
better, hot-swap without dropping requests; a model directory that does not load is refused."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, text

from steersman.control.serve.admin import admin_state
from steersman.control.serve.daemon import Daemon
from steersman.control.training.retrain import Retrainer, history_records
from steersman.data import path
from steersman.learners.bases import packaged
from steersman.learners.datasets import load_prompt_set
from steersman.storage.models import RequestRow
from steersman.storage.registry import model_versions
from tests.conftest import skip_or_fail
from tests.control.serve.serving import settings_for

TINY = {"vocab_size": 500, "hidden": 32, "layers": 1, "heads": 2}


def fill_history(engine, topics=150) -> None:
    """Real prompts' topics, asked for briefly or at length: what a model can learn quickly."""
    records, _ = load_prompt_set(path("alpaca"))
    rows = []
    for k, r in enumerate(records[:topics]):
        topic = r.prompt[:60]
        for style, n in (("In one word: ", 2 + k % 3), ("Write a long essay: ", 400 + k % 50)):
            prompt = style + topic
            rows.append(
                {
                    "request_id": f"h{len(rows)}",
                    "received_at": datetime.now(UTC),
                    "prompt_text": prompt,
                    "prompt_sha256": prompt,
                    "actual_tokens": n,
                }
            )
    with engine.begin() as conn:
        conn.execute(insert(RequestRow), rows)


@pytest.fixture
def daemon(tmp_path):
    # The model swapped in answers, however busy the machine: these tests are not about time.
    settings = settings_for(tmp_path, [{"sim": "cpu-tiny"}], predictor={"deadline_ms": 10_000})
    d = Daemon(settings)
    d.writer.start()
    yield d
    d.close()


def retrainer(daemon, **kw) -> Retrainer:
    kw.setdefault("epochs", 2)
    return Retrainer(
        daemon.engine,
        daemon.settings.data_dir / "models",
        swap=daemon.model.swap,
        event=daemon.event,
        current=lambda: (daemon.model.directory, daemon.service.predictor.model_version),
        scratch=TINY,
        **kw,
    )


def test_too_little_history_is_skipped(daemon):
    outcome = retrainer(daemon).run()
    assert outcome.status == "skipped"
    assert daemon.model.batcher is None


def test_promote_then_reject_a_worse_candidate_and_serve_throughout(daemon):
    fill_history(daemon.engine)
    records, lengths = history_records(daemon.engine, 10_000)
    assert len(records) == len(lengths) == 300 and min(lengths) >= 2
    assert len({r.group for r in records}) == 300

    first = retrainer(daemon, epochs=40, fit={"lr": 3e-3, "patience": 8}).run()
    assert first.status == "promoted", first.reason
    assert daemon.service.predictor.model_version == first.version
    assert daemon.model.batcher is not None
    assert daemon.model.directory.name == first.version
    # Its validation errors are the bands a class starts with (as /admin/state shows).
    errors = json.loads((daemon.model.directory / "steersman.json").read_text())["metrics"][
        "val_error_quantiles"
    ]
    assert len(errors) == 19 and errors == sorted(errors)
    low, high = daemon.service.scheduler.corrector.base_spread
    assert low <= 0 <= high and (low, high) != (0, 0)
    assert admin_state(daemon.service)["initial_band"] == (low, high)

    async def predict():
        return await daemon.service.predictor.predict("List 5 fruits.", max_tokens=300)

    p = asyncio.run(predict())
    assert p.path == "roberta" and p.base is not None and math.isfinite(p.base)
    assert first.metrics["val_mae_log"] < 1.0, first.metrics  # it learned brief vs long

    # A candidate that learns nothing is the served model again, no better: rejected.
    second = retrainer(daemon, budget_s=1e-6, fit={"lr": 0.0, "head_lr": 0.0}).run()
    assert second.status == "rejected", second.reason
    assert "2% below current" in second.reason
    assert daemon.service.predictor.model_version == first.version
    versions = {v["version"]: v for v in model_versions(daemon.engine)}
    assert versions[first.version]["status"] == "promoted"
    assert versions[second.version]["status"] == "rejected"
    assert versions[second.version]["metrics"]["current_version"] == first.version
    assert daemon.writer.flush(10)
    with daemon.engine.connect() as conn:
        reasons = [r for (r,) in conn.execute(text("SELECT reason FROM controller_events"))]
    assert any(r.startswith("retraining promoted") for r in reasons)
    assert any(r.startswith("retraining rejected") for r in reasons)


def test_corrupt_model_directory_is_refused_and_the_current_model_stays(daemon, tmp_path):
    bad = tmp_path / "broken-model"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert daemon.model.swap_from(bad) is False
    assert daemon.service.predictor.model_version is None and daemon.model.batcher is None
    assert daemon.writer.flush(10)
    with daemon.engine.connect() as conn:
        kind, reason = conn.execute(text("SELECT kind, reason FROM controller_events")).one()
    assert kind == "model" and reason.startswith(f"refused {bad}")


def test_corrupt_model_directory_at_start_serves_the_fast_predictor(tmp_path):
    bad = tmp_path / "broken-model"
    bad.mkdir()
    settings = settings_for(tmp_path, [{"sim": "cpu-tiny"}], predictor={"model_dir": str(bad)})
    d = Daemon(settings)
    try:
        assert d.model.batcher is None and d.service.predictor.model_version is None
        d.writer.start()
        assert d.writer.flush(10)
        with d.engine.connect() as conn:
            reason = conn.execute(text("SELECT reason FROM controller_events")).scalar_one()
        assert "cannot be loaded" in reason
    finally:
        d.close()


def test_retraining_fine_tunes_the_pretrained_base_and_records_it(daemon):
    base = packaged()
    if base.directory is None:
        skip_or_fail(f"the packaged base is not usable: {base.reason}")
    fill_history(daemon.engine)
    outcome = retrainer(daemon, base=base, budget_s=5.0).run()
    assert outcome.status == "promoted", outcome.reason
    (row,) = model_versions(daemon.engine)
    assert (row["kind"], row["base_model"]) == ("bert", "all-MiniLM-L6-v2")
    meta = json.loads((daemon.model.directory / "steersman.json").read_text())
    assert meta["base_model"] == "all-MiniLM-L6-v2" and meta["model_type"] == "bert"
