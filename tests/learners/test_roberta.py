"""The RoBERTa length regressor: built and trained here from scratch, saved, loaded, refused."""

from __future__ import annotations

import math

import pytest

from steersman.data import path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.hf import RobertaLengthModel


@pytest.fixture(scope="module")
def small_data():
    records = load_prompt_set(path("alpaca"))[0][:240]
    targets = [math.log1p(len(r.response.split()) * 1.3) for r in records]
    return [r.prompt for r in records], targets


def test_train_save_load_predict(small_data, tmp_path):
    texts, targets = small_data
    model = RobertaLengthModel.from_scratch(
        texts, vocab_size=600, hidden=32, layers=1, heads=2, max_length=64, seed=3
    )
    calls = []
    report = model.fit(
        texts[:200],
        targets[:200],
        val_texts=texts[200:],
        val_targets_log=targets[200:],
        epochs=2,
        batch_size=32,
        lr=3e-3,
        progress=lambda step, total, info: calls.append((step, total)),
    )
    assert report["steps"] == 14 and calls[-1] == (14, 14)
    assert len(report["history"]) == 2 and math.isfinite(report["best_val_mae_log"])
    # Calibrated to the targets, and telling prompts apart.
    preds = model.predict_log(texts[200:])
    assert abs(sum(preds) / 40 - sum(targets[200:]) / 40) < 0.5
    assert max(preds) - min(preds) > 1e-3

    before = model.predict_log([*texts[200:210], "", "x" * 5000])
    assert len(before) == 12 and all(math.isfinite(v) for v in before)
    saved = model.save(tmp_path / "m", {"version": "test-1"})
    again = RobertaLengthModel.load(saved, max_length=64)
    assert again.predict_log([*texts[200:210], "", "x" * 5000]) == pytest.approx(before, abs=1e-5)
    assert (saved / "steersman.json").read_text().count("test-1") == 1


def test_the_time_budget_stops_training(small_data):
    texts, targets = small_data
    model = RobertaLengthModel.from_scratch(
        texts, vocab_size=600, hidden=32, layers=1, heads=2, max_length=64
    )
    report = model.fit(
        texts,
        targets,
        val_texts=texts[:20],
        val_targets_log=targets[:20],
        epochs=50,
        time_budget_s=0.0,
    )
    assert report["stopped"] == "time budget" and report["steps"] == 1


def test_a_corrupt_model_directory_is_refused(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a loadable model"):
        RobertaLengthModel.load(broken)
    with pytest.raises(ValueError, match="not a loadable model"):
        RobertaLengthModel.load(tmp_path / "missing")


def test_an_encoder_that_is_not_roberta_is_refused_with_the_reason(tiny_model):
    with pytest.raises(ValueError, match="model_type 'llama' is not a RoBERTa-family encoder"):
        RobertaLengthModel.load(tiny_model)


def test_a_saved_model_served_in_int8_predicts_nearly_the_same(tmp_path):
    texts = [f"Explain topic {k} " + "in detail " * (k % 7) for k in range(40)]
    targets = [1.0 + (k % 7) for k in range(40)]
    model = RobertaLengthModel.from_scratch(texts, vocab_size=600, hidden=32, layers=1, heads=2)
    model.fit(texts, targets, val_texts=texts, val_targets_log=targets, epochs=30, lr=3e-3)
    model.save(tmp_path / "m", {"version": "t"})
    plain = RobertaLengthModel.load(tmp_path / "m").predict_log(texts)
    quick = RobertaLengthModel.load(tmp_path / "m", quantize=True).predict_log(texts)
    gaps = [abs(a - b) for a, b in zip(plain, quick, strict=True)]
    assert max(gaps) < 0.25 and sum(gaps) / len(gaps) < 0.05  # in log1p(tokens)
    assert max(plain) - min(plain) > 1.0  # a model that learned something, not a constant
