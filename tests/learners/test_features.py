"""Request features: the documented class rule, the length hints, and odd input."""

from __future__ import annotations

import math

import pytest

from steersman.learners.features import prompt_text, request_class, request_features


@pytest.mark.parametrize(
    ("text", "turns", "expected"),
    [
        ("Write a function that checks whether a number is prime.", 1, "code"),
        ("```python\nprint('hi')\n```\nWhy does this print hi?", 1, "code"),
        ("How do I sort a list in JavaScript?", 1, "code"),
        ("Summarize the following article in two sentences: ...", 1, "summarization"),
        ("Give me the TL;DR of this thread.", 1, "summarization"),
        ("What is the capital of France?", 1, "chat"),
        ("Tell me more.", 3, "chat"),
        ("Generate a haiku about autumn.", 1, "other"),
    ],
)
def test_request_class_rule(text, turns, expected):
    assert request_class(text, turns) == expected


def test_length_hints():
    f = request_features(
        "Explain photosynthesis step by step in 50 words.", prompt_tokens=10, max_tokens=300
    )
    assert f["hint_words_log"] == pytest.approx(math.log1p(50))
    assert f["detailed"] == 1.0 and f["brief"] == 0.0
    assert f["max_tokens_log"] == pytest.approx(math.log1p(300))
    assert f["prompt_tokens_log"] == pytest.approx(math.log1p(10))
    assert request_features("List 10 ideas for a party.")["list_n"] == 10.0
    assert request_features("Write an essay on trust.")["long_form"] == 1.0
    assert request_features("Answer in three sentences.")["hint_sentences"] == 3.0


@pytest.mark.parametrize("odd", ["", "   ", "\x00\x01", "🙂" * 5000, None, 42])
def test_odd_input_never_raises(odd):
    f = request_features(odd, prompt_tokens=-3, max_tokens=0)  # type: ignore[arg-type]
    assert f["request_class"] in {"chat", "code", "summarization", "other"}
    assert all(math.isfinite(v) for k, v in f.items() if k != "request_class")


def test_prompt_text_from_both_request_shapes():
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "sum this up"}]},
    ]
    assert prompt_text(messages=messages) == ("sum this up", 4)
    assert prompt_text(prompt="plain") == ("plain", 1)
    assert prompt_text(prompt=["a", "b"]) == ("a\nb", 1)
    assert prompt_text(prompt=[1, 2, 3]) == ("", 1)
    assert prompt_text(messages="not a list") == ("", 1)
