"""The served model: the prompts' vectors handed on while the similar-prompt prior is on, and
what its directory says of its validation errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from steersman.control.serve.predictor import Predictor
from steersman.control.serve.sections import PredictorSettings
from steersman.control.serve.served_model import ServedModel, validation_errors
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY
from steersman.learners.hf import LengthModel


@pytest.mark.parametrize("similar_prompts", [4096, 0])
def test_prompt_vectors_reach_the_features_while_the_similar_prior_is_on(tmp_path, similar_prompts):
    model = LengthModel.from_scratch(["some text", "more text"], vocab_size=300, hidden=32,
                                     layers=1, heads=2)  # fmt: skip
    predictor = Predictor(deadline_s=60.0)
    settings = PredictorSettings(similar_prompts=similar_prompts)
    served = ServedModel(predictor, settings, tmp_path, event=lambda *e: None,
                         forget=lambda errors: None, model=model)  # fmt: skip
    try:
        got = [asyncio.run(predictor.predict(t)) for t in ("How are you?", "", "x " * 2000)]
    finally:
        served.close()
    assert all(p.path == "roberta" and BASE_KEY in p.x for p in got)
    if similar_prompts:
        assert all(p.x[VECTOR_KEY].shape == (32,) for p in got)
    else:
        assert not any(VECTOR_KEY in p.x for p in got)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"metrics": {"val_error_quantiles": [-1.0, 0, 1.5]}}, [-1.0, 0.0, 1.5]),
        ({"metrics": {"val_mae_log": 0.7}}, None),  # trained before the errors were kept
        ({"metrics": {"val_error_quantiles": None}}, None),  # too few validation rows
        ({"metrics": {"val_error_quantiles": ["a"]}}, None),
        ({"version": "v1"}, None),
        ([1, 2], None),
        ("{not json", None),
        (None, None),  # no steersman.json
    ],
)
def test_validation_errors_of_a_model_directory(tmp_path, content, expected):
    if content is not None:
        text = content if isinstance(content, str) else json.dumps(content)
        (tmp_path / "steersman.json").write_text(text)
    assert validation_errors(tmp_path) == expected
    assert validation_errors(None) is None
