"""`steersman eval-predictor`: every predictor path scored, progressively, per class."""

from __future__ import annotations

import gzip
import json
import math

from typer.testing import CliRunner

from steersman.control.cli.main import app
from steersman.data import path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.evaluation import evaluate
from steersman.learners.hf import LengthModel
from steersman.learners.metrics import score


def test_score():
    s = score([(100, 100), (150, 100), (10, 20), (300, 200)])
    assert s["n"] == 4 and s["mae"] == (0 + 50 + 10 + 100) / 4
    assert s["within_30"] == 0.25 and s["median_rel_error"] == 0.5 and s["kendall_tau"] > 0


def test_the_corrector_fixes_a_base_model_that_is_off_by_a_factor():
    prompts = [f"Briefly say {i}." if i % 2 else f"Write an essay about {i}." for i in range(600)]
    actual = [30 if i % 2 else 300 for i in range(600)]
    result = evaluate(prompts, actual, [8] * 600, base=[3.0 * a for a in actual])
    assert result["rows"] == 600
    overall = result["overall"]
    assert overall["corrected"]["mae"] < 0.5 * overall["base"]["mae"]
    assert result["rolling_mae"][200]["corrected"] < result["rolling_mae"][200]["base"]
    assert sum(c["base"]["n"] for c in result["per_class"].values()) == 600


def test_cli_with_and_without_a_model(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("STEERSMAN_DATA_DIR", str(tmp_path / "d"))
    data = tmp_path / "eval.jsonl"
    with gzip.open(path("codealpaca"), "rt") as fh:
        data.write_text("".join(line for _, line in zip(range(250), fh, strict=False)))
    runner = CliRunner()
    plain = runner.invoke(
        app, ["eval-predictor", "--data", str(data), "--tokenizer", str(tiny_model), "--json"]
    )
    assert plain.exit_code == 0, plain.output
    result = json.loads(plain.stdout)
    assert set(result["overall"]) == {"fast"} and result["overall"]["fast"]["n"] == 250
    assert "200" in result["rolling_mae"] and "code" in result["per_class"]

    records = load_prompt_set(data)[0]
    model = LengthModel.from_scratch(
        [r.prompt for r in records], vocab_size=500, hidden=32, layers=1, heads=2, max_length=64
    )
    model.fit(
        [r.prompt for r in records],
        [math.log1p(40.0)] * len(records),
        val_texts=[records[0].prompt],
        val_targets_log=[math.log1p(40.0)],
        epochs=1,
    )
    model.save(tmp_path / "m", {"version": "t"})
    full = runner.invoke(
        app,
        [
            "eval-predictor",
            "--data",
            str(data),
            "--tokenizer",
            str(tiny_model),
            "--model",
            str(tmp_path / "m"),
            "--json",
        ],
    )
    assert full.exit_code == 0, full.output
    assert set(json.loads(full.stdout)["overall"]) == {"base", "corrected", "fast"}

    broken = runner.invoke(
        app, ["eval-predictor", "--data", str(data), "--model", str(tmp_path / "nothing-here")]
    )
    assert broken.exit_code == 2 and "not a loadable model" in broken.stderr
