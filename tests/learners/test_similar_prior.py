"""The similar-prompt prior: what the served model answered to the nearest earlier prompts, in a
bounded ring, and the corrector's use of it beside a base model that cannot tell them apart."""

from __future__ import annotations

import math
import random

import numpy as np
from scipy.stats import kendalltau

from steersman.learners.corrector import BASE_KEY, VECTOR_KEY, LengthCorrector
from steersman.learners.evaluation import History, evaluate
from steersman.learners.similar_prior import SimilarPrior


def topics(rng: random.Random, n: int, dims: int = 16) -> list[tuple[np.ndarray, int]]:
    """Prompts on eight topics: each topic's vectors lie near its own direction, and its answers
    have their own typical length (20 to 2,560 tokens)."""
    centres = np.random.default_rng(0).normal(size=(8, dims))
    out = []
    for _ in range(n):
        t = rng.randrange(8)
        vector = centres[t] + np.random.default_rng(rng.randrange(1 << 30)).normal(0, 0.3, dims)
        out.append((vector, max(1, round(20 * 2**t * rng.lognormvariate(0, 0.4)))))
    return out


def test_the_prior_ranks_prompts_by_what_similar_ones_produced():
    rng = random.Random(0)
    prior, pairs = SimilarPrior(), []
    for vector, tokens in topics(rng, 600):
        got = prior.predict_one(vector)
        if got is not None:
            pairs.append((got.mean, tokens))
            assert -1.0 <= got.similarity <= 1.0
        prior.learn_one(vector, tokens)
    assert len(pairs) == 600 - prior.min_history
    assert kendalltau(*zip(*pairs, strict=True)).statistic > 0.7


def test_memory_is_a_ring_of_the_last_window_requests():
    prior = SimilarPrior(window=50, k=5)
    for _ in range(100):
        prior.learn_one([1.0, 0.0], 1000)  # an old topic ...
    for _ in range(50):
        prior.learn_one([0.0, 1.0], 10)  # ... pushed out by a new one
    assert len(prior) == 50
    got = prior.predict_one([1.0, 0.0])
    assert round(math.expm1(got.mean)) == 10 and got.n == 50
    off = SimilarPrior(window=0)
    off.learn_one([1.0], 10)
    assert len(off) == 0 and off.predict_one([1.0]) is None


def test_odd_input_is_ignored_not_raised():
    prior = SimilarPrior(min_history=1)
    for vector in ([], [0.0, 0.0], [math.nan, 1.0], "text", None, [[1.0], [2.0, 3.0]]):
        prior.learn_one(vector, 10)
        assert prior.predict_one(vector) is None
    for tokens in (math.nan, math.inf, -1):
        prior.learn_one([1.0, 2.0], tokens)
    assert len(prior) == 0
    prior.learn_one([1.0, 2.0], 10)
    assert prior.predict_one([1.0, 2.0, 3.0]) is None  # another width than those remembered
    assert prior.predict_one([2.0, 4.0]) is not None


def test_beside_a_base_model_that_cannot_tell_topics_apart_the_corrector_ranks_them():
    rng = random.Random(1)
    with_vectors, without = LengthCorrector(), LengthCorrector()
    scored: dict[str, list[tuple[float, int]]] = {"with": [], "without": []}
    for k, (vector, tokens) in enumerate(topics(rng, 800)):
        x = {"request_class": "chat", BASE_KEY: 200.0}  # the same base prediction for all
        seen = with_vectors.with_prior({**x, VECTOR_KEY: vector}, segment_tokens=0)
        if k >= 400:
            scored["with"].append((with_vectors.predict_one(seen), tokens))
            scored["without"].append((without.predict_one(x), tokens))
        with_vectors.learn_one(seen, tokens)
        without.learn_one(x, tokens)
    tau = {n: kendalltau(*zip(*p, strict=True)).statistic for n, p in scored.items()}
    assert tau["with"] > 0.6 and tau["with"] > tau["without"] + 0.5, tau
    # A hot model update keeps what the model answered; a new model's encoder places prompts
    # elsewhere: what the old one's vectors said goes.
    with_vectors.reset()
    assert len(with_vectors.similar) == 800
    with_vectors.reset(new_model=True)
    assert len(with_vectors.similar) == 0
    assert "similar_log_mean" not in with_vectors.with_prior({VECTOR_KEY: vector}, 0)


def test_served_in_order_the_similar_path_is_scored_and_a_pools_history_helps_it():
    rng = random.Random(3)
    served = topics(rng, 200)
    earlier = topics(rng, 600)
    texts = [f"prompt {k}" for k in range(len(served))]
    actual = [t for _, t in served]
    common = (texts, actual, [10] * len(served), [200.0] * len(served))
    cold = evaluate(*common, checkpoints=(), vectors=[v for v, _ in served])
    n = len(earlier)
    history = History([f"old {k}" for k in range(n)], [t for _, t in earlier], [10] * n,
                      [200.0] * n, [v for v, _ in earlier])  # fmt: skip
    warm = evaluate(*common, checkpoints=(), vectors=[v for v, _ in served], history=history)
    assert set(cold["overall"]) == {"base", "corrected", "fast", "similar"}
    assert "similar" in cold["band"]
    tau = warm["overall"]["similar"]["kendall_tau"]
    assert tau > cold["overall"]["similar"]["kendall_tau"] and tau > 0.6
    assert "similar" not in evaluate(*common, checkpoints=())["overall"]  # no vectors, no path
