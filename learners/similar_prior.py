"""A length prior from similar prompts: what the served model answered to the most similar prompts
it was sent before.

A pool serves one model, and that model's own history says more about how long it answers than
a text model trained on many models' answers: how verbose it is, and for which kinds of prompt.
Each finished request leaves its prompt's vector (the length model's mean-pooled encoder state,
computed for its prediction anyway) and ``log1p(output tokens)``; a new prompt's prior is the
similarity-weighted mean over its ``k`` nearest by cosine. Memory is bounded: a ring of the last
``window`` requests, searched exactly with one matrix-vector product (River's ``neighbors``
search walks dictionaries in Python: at 384 dimensions and thousands of requests, a hundred
times too slow for the hot path).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SimilarStat:
    """What the nearest earlier prompts produced: their weighted mean ``log1p(tokens)``, how many
    prompts are remembered, and the mean cosine similarity of the nearest."""

    mean: float
    n: int
    similarity: float


class SimilarPrior:
    """``predict_one(vector) -> SimilarStat | None``, ``learn_one(vector, tokens)``.

    >>> prior = SimilarPrior(window=8, k=2, min_history=2)
    >>> prior.learn_one([1.0, 0.0], 400)
    >>> prior.learn_one([0.9, 0.1], 300)
    >>> prior.learn_one([0.0, 1.0], 10)
    >>> got = prior.predict_one([1.0, 0.05])  # like the first two
    >>> round(math.expm1(got.mean)), got.n
    (347, 3)
    >>> prior.predict_one([0.0, 0.0]) is None  # no direction: nothing is like it
    True
    """

    def __init__(
        self, window: int = 4096, k: int = 30, temperature: float = 0.05, min_history: int = 3
    ) -> None:
        self.window = window
        self.k = k
        self.temperature = temperature  # softmax of the similarities: the nearest weigh most
        self.min_history = min_history
        self._vectors: np.ndarray | None = None
        self._targets = np.zeros(window)
        self._count = 0  # learned so far; the ring's next slot is count % window

    def __len__(self) -> int:
        return min(self._count, self.window)

    def predict_one(self, vector: Sequence[float] | np.ndarray) -> SimilarStat | None:
        unit = self._unit(vector)
        n = len(self)
        if unit is None or n < max(self.min_history, 1):
            return None
        similarity = self._vectors[:n] @ unit
        k = min(self.k, n)
        nearest = np.argpartition(-similarity, k - 1)[:k]
        s = similarity[nearest]
        weights = np.exp((s - s.max()) / self.temperature)
        mean = float(weights @ self._targets[nearest] / weights.sum())
        return SimilarStat(mean, n, float(s.mean()))

    def learn_one(self, vector: Sequence[float] | np.ndarray, tokens: float) -> None:
        unit = self._unit(vector)
        if unit is None or not math.isfinite(tokens) or tokens < 0 or self.window < 1:
            return
        if self._vectors is None:
            self._vectors = np.zeros((self.window, len(unit)), dtype=np.float32)
        slot = self._count % self.window
        self._vectors[slot] = unit
        self._targets[slot] = math.log1p(tokens)
        self._count += 1

    def _unit(self, vector: Sequence[float] | np.ndarray) -> np.ndarray | None:
        """The vector at unit length; None for one of another width than those remembered, with
        no direction, or not finite (odd data never raises here)."""
        try:
            v = np.asarray(vector, dtype=np.float32).ravel()
        except (TypeError, ValueError):
            return None
        if v.size == 0 or (self._vectors is not None and v.size != self._vectors.shape[1]):
            return None
        norm = float(np.linalg.norm(v))
        if not math.isfinite(norm) or norm == 0.0:
            return None
        return v / norm
