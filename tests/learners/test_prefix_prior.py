"""The prefix prior: what earlier prompts that began the same way generated, in bounded memory,
and the corrector's use of it (the fast path's prior, a feature beside a base model)."""

from __future__ import annotations

import math
import random

from scipy.stats import kendalltau

from steersman.learners.corrector import BASE_KEY, PREFIX_KEY, LengthCorrector
from steersman.learners.prefix_prior import PrefixPrior


def templated(rng: random.Random, n: int) -> list[tuple[tuple[int, ...], int]]:
    """Requests from eight applications: each sends its own system prompt of 2-6 segments, then a
    question of its own; each application's answers have their own typical length."""
    apps = [(tuple(1000 * a + s for s in range(2 + a % 5)), 20 * 2**a) for a in range(8)]
    out = []
    for k in range(n):
        system, typical = rng.choice(apps)
        question = tuple(10**6 + 10 * k + j for j in range(rng.randint(1, 3)))
        out.append(((*system, *question), max(1, round(typical * rng.lognormvariate(0, 0.4)))))
    return out


def test_the_prior_ranks_requests_that_share_a_system_prompt():
    rng = random.Random(0)
    prior, pairs = PrefixPrior(), []
    for segments, tokens in templated(rng, 600):
        got = prior.predict_one(segments)
        if got is not None:
            pairs.append((got.mean, tokens))
        prior.learn_one(segments, tokens)
    assert len(pairs) > 550  # all but each application's first few
    assert kendalltau(*zip(*pairs, strict=True)).statistic > 0.7


def test_memory_is_bounded_and_the_least_recently_used_go_first():
    prior = PrefixPrior(max_entries=50)
    for k in range(200):
        prior.learn_one((k, 10_000 + k), 10)
    assert len(prior) == 50 and prior.evicted > 0
    assert prior.predict_one((199, 99)) is not None  # recent: kept
    assert prior.predict_one((0, 99)) is None  # the oldest: gone
    off = PrefixPrior(max_entries=0)
    off.learn_one((1, 2), 10)
    assert len(off) == 0 and off.predict_one((1, 2)) is None


def test_odd_input_is_ignored_not_raised():
    prior = PrefixPrior()
    for tokens in (math.nan, math.inf, -1):
        prior.learn_one((1, 2), tokens)
    prior.learn_one((), 10)
    assert len(prior) == 0 and prior.predict_one(()) is None


def test_the_corrector_uses_the_prior_where_prefixes_repeat_and_not_elsewhere():
    rng = random.Random(1)
    with_prior, without = LengthCorrector(), LengthCorrector(prior_entries=0)
    scored: dict[str, list[tuple[float, int]]] = {"with": [], "without": []}
    for k, (segments, tokens) in enumerate(templated(rng, 800)):
        x = {"request_class": "chat", "prompt_tokens_log": math.log1p(16 * len(segments))}
        for name, c in (("with", with_prior), ("without", without)):
            seen = c.with_prior({**x, PREFIX_KEY: segments}, segment_tokens=32)
            if k >= 400:
                scored[name].append((c.predict_one(seen), tokens))
            c.learn_one(seen, tokens)
    tau = {n: kendalltau(*zip(*p, strict=True)).statistic for n, p in scored.items()}
    assert tau["with"] > tau["without"] + 0.3, tau
    # A prompt that shares nothing (or less than prior_min_tokens) predicts as without a prior.
    lone = {"request_class": "chat", PREFIX_KEY: (7, 8, 9)}
    assert with_prior.with_prior(lone, 16) == lone
    short = with_prior.with_prior({PREFIX_KEY: (1000, 99)}, segment_tokens=16)  # 16 tokens
    assert "prefix_log_mean" not in short


def test_beside_a_base_model_the_prior_is_a_correction_the_corrector_learns():
    rng = random.Random(2)
    c = LengthCorrector()
    errors = []
    for k, (segments, tokens) in enumerate(templated(rng, 1200)):
        # A base model that knows nothing of the applications: it says 100 to everyone.
        x = c.with_prior({BASE_KEY: 100.0, PREFIX_KEY: segments}, segment_tokens=32)
        if k >= 800:
            errors.append(abs(math.log1p(c.predict_one(x)) - math.log1p(tokens)))
        c.learn_one(x, tokens)
    assert sum(errors) / len(errors) < 0.7  # a constant 100 is off by about 1.6 on average
