"""`steersman train`: bad rows reported, a grouped split, a saved and registered model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from typer.testing import CliRunner

from steersman.control.cli.main import app
from steersman.control.serve.daemon import Daemon
from steersman.control.training.length_model import grouped_split
from steersman.data import path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.hf import LengthModel
from steersman.storage.engine import make_engine
from steersman.storage.registry import model_versions
from tests.control.serve.serving import settings_for


def test_grouped_split_keeps_each_prompt_on_one_side():
    records = load_prompt_set(path("alpaca_eval"))[0]
    train, val = grouped_split([r.group for r in records], 0.2, seed=1)
    assert set(train).isdisjoint(val) and len(train) + len(val) == len(records)
    assert {records[i].group for i in train}.isdisjoint({records[i].group for i in val})
    assert 0.15 < len(val) / len(records) < 0.25
    assert grouped_split([r.group for r in records], 0.2, seed=1) == (train, val)
    assert grouped_split(["p"] * 3, 0.2, 0)[1] == [0, 1, 2]


def test_train_saves_registers_and_reports_bad_rows(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("STEERSMAN_DATA_DIR", str(tmp_path / "data"))
    rows = []
    with gzip.open(path("alpaca"), "rt") as fh:
        for _, line in zip(range(120), fh, strict=False):
            rows.append(line.rstrip("\n"))
    rows.insert(5, "this is not json")
    rows.insert(9, json.dumps({"id": "x", "prompt": "", "response": "empty prompt"}))
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(rows) + "\n")
    db = f"sqlite:///{tmp_path / 'h.db'}"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--data",
            str(data),
            "--tokenizer",
            str(tiny_model),
            "--scratch",
            "--size",
            "tiny",
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "model"),
            "--db",
            db,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "skipped 2 bad row(s) at line(s) 6, 10" in result.stderr
    assert result.stdout.strip() == str(tmp_path / "model")
    (registered,) = model_versions(make_engine(db))
    assert registered["kind"] == "roberta" and registered["status"] == "candidate"
    assert registered["base_model"] is None  # a RoBERTa trained from scratch
    assert registered["train_rows"] + registered["val_rows"] == 120
    assert registered["metrics"]["val_mae_tokens"] > 0
    meta = json.loads((tmp_path / "model" / "steersman.json").read_text())
    assert meta["version"] == registered["version"] and meta["data_hash"] == registered["data_hash"]
    assert len(LengthModel.load(tmp_path / "model").predict_log(["hi", "there"])) == 2

    # --promote: the daemon serves it without being told where it is.
    args = [
        "train", "--data", str(data), "--tokenizer", str(tiny_model), "--scratch", "--size",
        "tiny", "--epochs", "1", "--out", str(tmp_path / "model2"), "--db", db, "--promote",
    ]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    first, second = model_versions(make_engine(db))
    assert (first["status"], second["status"]) == ("candidate", "promoted")
    settings = settings_for(tmp_path, [{"sim": "cpu-tiny"}], storage={"url": db})
    daemon = Daemon(settings)
    try:
        assert daemon.service.predictor.model_version == second["version"]
        assert daemon.model.directory == tmp_path / "model2"
    finally:
        daemon.close()


def test_train_refuses_a_missing_file(tmp_path):
    result = CliRunner().invoke(app, ["train", "--data", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_train_from_the_sql_history(tmp_path):
    from steersman.storage import migrate
    from tests.control.training.test_retrain import fill_history

    db = f"sqlite:///{tmp_path / 'h.db'}"
    engine = make_engine(db)
    migrate.upgrade(engine)
    fill_history(engine)
    args = [
        "train", "--from-history", "--db", db, "--scratch", "--size", "tiny", "--epochs", "1",
        "--out", str(tmp_path / "from-history"),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "300 finished requests with prompt text in the history" in result.stderr
    (registered,) = model_versions(engine)
    assert registered["train_rows"] + registered["val_rows"] == 300
    assert (tmp_path / "from-history" / "steersman.json").exists()


def _mixed_data(tmp_path) -> Path:
    """A few rows of each bundled prompt set, so the report has one line per set."""
    rows = []
    for name, n in (("alpaca", 40), ("codealpaca", 40), ("alpaca_eval", 480)):
        with gzip.open(path(name), "rt") as fh:  # AlpacaEval: 12 answers a prompt, 40 prompts
            rows += [line.rstrip("\n") for _, line in zip(range(n), fh, strict=False)]
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(rows) + "\n")
    return data


def test_compare_trains_scratch_and_the_base_with_both_objectives(
    tmp_path, tiny_model, monkeypatch
):
    monkeypatch.setenv("STEERSMAN_DATA_DIR", str(tmp_path / "data"))
    db = f"sqlite:///{tmp_path / 'h.db'}"
    args = [
        "train", "--data", str(_mixed_data(tmp_path)), "--tokenizer", str(tiny_model),
        "--size", "tiny", "--epochs", "1", "--time-budget", "5", "--compare",
        "--out", str(tmp_path / "m"), "--db", db,
    ]  # fmt: skip
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "base: all-MiniLM-L6-v2" in result.stderr
    table = result.stdout
    for name in ("alpaca", "codealpaca", "alpaca_eval", "all", "within 12 models"):
        assert table.count(name) >= 4, name  # a row for each of the four runs
    for start in ("scratch RoBERTa", "all-MiniLM-L6-v2"):
        assert table.count(start) >= 2 * 5, start  # both objectives, every prompt set
    assert "regression" in table and "ListMLE" in table
    meta = json.loads((tmp_path / "m" / "steersman.json").read_text())
    assert meta["rank_weight"] == 1.0 and meta["base_model"] == "all-MiniLM-L6-v2"
    assert meta["model_type"] == "bert"
    assert set(meta["metrics"]["val_per_set"]) == {"alpaca", "codealpaca", "alpaca_eval"}
    assert meta["metrics"]["val_within_model"]["models"] == 12
    (registered,) = model_versions(make_engine(db))  # the last of the four
    assert (registered["kind"], registered["base_model"]) == ("bert", "all-MiniLM-L6-v2")


def test_a_local_encoder_directory_is_fine_tuned_and_anything_else_refused(
    tmp_path, tiny_model, monkeypatch
):
    monkeypatch.setenv("STEERSMAN_DATA_DIR", str(tmp_path / "data"))
    base = tmp_path / "small-roberta"  # stands in for roberta-base: a local HF directory
    LengthModel.from_scratch(["some text", "more text"], vocab_size=300, hidden=32,
                                    layers=1, heads=2).save(base, {"version": "base"})  # fmt: skip
    common = ["train", "--data", str(_mixed_data(tmp_path)), "--tokenizer", str(tiny_model),
              "--epochs", "1", "--db", f"sqlite:///{tmp_path / 'h.db'}"]  # fmt: skip
    done = CliRunner().invoke(
        app, [*common, "--base-model", str(base), "--out", str(tmp_path / "t")]
    )
    assert done.exit_code == 0, done.output
    meta = json.loads((tmp_path / "t" / "steersman.json").read_text())
    assert (meta["base_model"], meta["base_path"]) == ("small-roberta", str(base))
    refused = CliRunner().invoke(app, [*common, "--base-model", str(tiny_model)])
    assert refused.exit_code == 2
    assert "model_type 'llama' is not an encoder" in refused.stderr
    nowhere = CliRunner().invoke(app, [*common, "--base-model", str(base), "--device", "bogus"])
    assert nowhere.exit_code == 2
    assert nowhere.stderr.strip().splitlines()[-1].startswith("error: device 'bogus': Expected")
    (base / "model.safetensors").unlink()
    missing = CliRunner().invoke(app, [*common, "--base-model", str(base)])
    assert missing.exit_code == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        f"error: --base-model: {base / 'model.safetensors'}: missing (the encoder's weights)"
    )
