"""What a served model's directory says of its validation errors: read, or nothing."""

from __future__ import annotations

import json

import pytest

from steersman.control.serve.served_model import validation_errors


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
