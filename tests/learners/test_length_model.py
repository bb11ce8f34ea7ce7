"""The length regressor on a Hugging Face encoder: a RoBERTa from scratch, the packaged pretrained
MiniLM, fine-tuned, saved, loaded, served int8 and traced, refused with the reason."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from steersman.data import path
from steersman.learners import bases
from steersman.learners.datasets import load_prompt_set
from steersman.learners.hf import LengthModel
from tests.conftest import skip_or_fail


@pytest.fixture(scope="module")
def small_data():
    records = load_prompt_set(path("alpaca"))[0][:240]
    targets = [math.log1p(len(r.response.split()) * 1.3) for r in records]
    return [r.prompt for r in records], targets


def test_train_save_load_predict(small_data, tmp_path):
    texts, targets = small_data
    model = LengthModel.from_scratch(
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
    again = LengthModel.load(saved, max_length=64)
    assert again.predict_log([*texts[200:210], "", "x" * 5000]) == pytest.approx(before, abs=1e-5)
    assert (saved / "steersman.json").read_text().count("test-1") == 1


def test_the_time_budget_stops_training(small_data):
    texts, targets = small_data
    model = LengthModel.from_scratch(
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
        LengthModel.load(broken)
    with pytest.raises(ValueError, match="not a loadable model"):
        LengthModel.load(tmp_path / "missing")


def test_a_model_that_is_not_an_encoder_is_refused_naming_its_type(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="model_type 'llama' is not an encoder"):
        LengthModel.load(tiny_model)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "nonesuch-7"}))
    with pytest.raises(ValueError, match="model_type 'nonesuch-7' is not an architecture"):
        LengthModel.load(unknown)


def test_a_saved_model_served_in_int8_predicts_nearly_the_same(tmp_path):
    texts = [f"Explain topic {k} " + "in detail " * (k % 7) for k in range(40)]
    targets = [1.0 + (k % 7) for k in range(40)]
    model = LengthModel.from_scratch(texts, vocab_size=600, hidden=32, layers=1, heads=2)
    model.fit(texts, targets, val_texts=texts, val_targets_log=targets, epochs=30, lr=3e-3)
    model.save(tmp_path / "m", {"version": "t"})
    plain = LengthModel.load(tmp_path / "m").predict_log(texts)
    quick = LengthModel.load(tmp_path / "m", quantize=True).predict_log(texts)
    gaps = [abs(a - b) for a, b in zip(plain, quick, strict=True)]
    assert max(gaps) < 0.25 and sum(gaps) / len(gaps) < 0.05  # in log1p(tokens)
    assert max(plain) - min(plain) > 1.0  # a model that learned something, not a constant


@pytest.fixture(scope="module")
def minilm():
    base = bases.packaged()
    if base.directory is None:
        skip_or_fail(f"the packaged base is not usable: {base.reason}")
    return base.directory


def test_the_packaged_base_fine_tunes_saves_and_serves_traced_int8(minilm, small_data, tmp_path):
    texts, targets = small_data
    model = LengthModel.load(minilm, layers=3, max_length=64)
    assert model.model_type == "bert" and not model.trained
    assert model.net.encoder.config.num_hidden_layers == 3
    report = model.fit(
        texts[:64], targets[:64], val_texts=texts[200:], val_targets_log=targets[200:],
        epochs=1, batch_size=16, lr=5e-5, head_lr=1e-3, rank_weight=1.0,
    )  # fmt: skip
    assert report["steps"] == 4 and model.trained
    saved = model.save(tmp_path / "m", {"version": "t"})
    meta = json.loads((saved / "steersman.json").read_text())
    assert meta["model_type"] == "bert" and meta["head"] == "_Pooled"
    again = LengthModel.load(saved, max_length=64)
    assert again.trained and again.net.encoder.config.num_hidden_layers == 3
    odd = ["", "   ", "[CLS] [SEP] [PAD]", "x " * 3000, *texts[200:206]]
    eager = again.predict_log(odd)
    assert eager == pytest.approx(model.predict_log(odd), abs=1e-5)
    assert all(math.isfinite(v) for v in eager)
    # The prompts' vectors (the similar-prompt prior's) come with the same predictions.
    values, vectors = again.predict_with_vectors(odd)
    assert values == pytest.approx(eager, abs=1e-5)
    assert all(v.shape == (384,) and np.isfinite(v).all() for v in vectors)
    assert again.predict_with_vectors([]) == ([], [])
    # Traced, the graph runs batches of other sizes and lengths than it was traced with: the
    # same numbers as the network, padding or not.
    traced = LengthModel.load(saved, max_length=64, compiled=True)
    assert traced.forward is not traced.net
    assert traced.predict_log(odd) == pytest.approx(eager, abs=1e-4)
    assert [traced.predict_log([t])[0] for t in odd] == pytest.approx(eager, abs=1e-4)
    # Served int8 and traced: the int8 network's numbers, near the float ones.
    served = LengthModel.load(saved, max_length=64, quantize=True, compiled=True)
    plain = LengthModel.load(saved, max_length=64, quantize=True)
    assert served.predict_log(odd) == pytest.approx(plain.predict_log(odd), abs=1e-4)
    gaps = [abs(a - b) for a, b in zip(eager, served.predict_log(odd), strict=True)]
    assert max(gaps) < 0.25
    # Serving reads the vectors from the same traced pass as the predictions.
    values, vectors = served.predict_with_vectors(odd)
    assert values == pytest.approx(served.predict_log(odd), abs=1e-5)
    assert all(v.shape == (384,) and np.isfinite(v).all() for v in vectors)
    assert served.predict_with_vectors(odd, vectors=False)[1] == [None] * len(odd)


def test_a_one_output_classifier_checkpoint_loads_as_a_trained_regressor(tmp_path):
    from transformers import RobertaConfig, RobertaForSequenceClassification

    scratch = LengthModel.from_scratch(["some text", "more text"], vocab_size=300, hidden=32,
                                       layers=1, heads=2)  # fmt: skip
    config = RobertaConfig(vocab_size=len(scratch.tokenizer), hidden_size=32,
                           num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=66, pad_token_id=scratch.tokenizer.pad_token_id,
                           num_labels=1, problem_type="regression")  # fmt: skip
    RobertaForSequenceClassification(config).save_pretrained(tmp_path / "c")
    scratch.tokenizer.save_pretrained(tmp_path / "c")
    model = LengthModel.load(tmp_path / "c")
    assert model.trained and model.max_length == 64
    assert len(model.predict_log(["hello", ""])) == 2
    assert model.predict_with_vectors(["hello", ""])[1] == [None, None]  # a classifier has none


def test_a_base_directory_with_a_missing_or_altered_file_is_refused_naming_it(minilm, tmp_path):
    copy = tmp_path / "base"
    copy.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (copy / name).write_bytes((minilm / name).read_bytes())
    with pytest.raises(bases.BaseModelError, match=r"base/model\.safetensors: missing"):
        bases.check_directory(copy, sha256=bases.SHA256)
    (copy / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(
        bases.BaseModelError, match=r"model\.safetensors: sha256 .* is not the pinned"
    ):
        bases.check_directory(copy, sha256=bases.SHA256)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(bases.BaseModelError, match=r"tokenizer\.json: missing"):
        bases.check_directory(copy, sha256=bases.SHA256)
    assert bases.check_directory(minilm, sha256=bases.SHA256) == minilm
