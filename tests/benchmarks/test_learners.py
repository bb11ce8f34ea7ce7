"""benchmarks.learners: each answering model's answers served in order, and the mean tau with
its interval over a draw of prompts."""

from __future__ import annotations

import random

import numpy as np

from benchmarks.learners import by_model
from steersman.learners.datasets import PromptRecord
from steersman.learners.tokens import TokenCounter


def test_the_mean_within_model_tau_comes_with_its_interval_over_the_prompts(tiny_model):
    rng = random.Random(0)
    counter = TokenCounter(tiny_model)
    prompts = [f"question {k}: " + "word " * rng.randrange(1, 30) for k in range(60)]
    length = {p: rng.randrange(5, 400) for p in prompts}
    records = [
        PromptRecord(f"q{k}-{model}", f"alpaca_eval/{model}", p, "tok " * (length[p] * scale))
        for model, scale in (("terse", 1), ("verbose", 3))
        for k, p in enumerate(prompts)
        if not (model == "verbose" and k == 0)  # one model left one prompt unanswered
    ]
    # The base model knows each prompt's length up to noise; the vectors tell prompts apart.
    base = {
        p: (length[p] * rng.lognormvariate(0, 0.5), np.eye(60)[k]) for k, p in enumerate(prompts)
    }
    got = by_model(records, counter, base)
    assert got["models"] == 2 and set(got["per_model"]) == {"terse", "verbose"}
    for name, mean in got["mean_within_model"].items():
        lo, hi = mean["kendall_tau_90%"]
        assert lo <= mean["kendall_tau"] <= hi, name
    lo, hi = got["mean_within_model"]["base"]["kendall_tau_90%"]
    assert 0.2 < lo < hi < 0.9  # the base ranks, and 59 prompts do not pin it down
    assert "kendall_tau_over_base_90%" not in got["mean_within_model"]["base"]
    for name in ("corrected", "fast", "similar"):
        lo, hi = got["mean_within_model"][name]["kendall_tau_over_base_90%"]
        assert lo <= hi
    # The fast path never sees the base model's point: it ranks worse on every draw.
    assert got["mean_within_model"]["fast"]["kendall_tau_over_base_90%"][1] < 0
