"""The online corrector: River regressors that learn from every finished request.

With a base prediction (RoBERTa's) it learns the residual ``log1p(actual) - log1p(base)`` from
request features and telemetry; without one it is the fast feature-only predictor: the request
class's mean ``log1p(length)`` so far plus what the features say about the difference (so that
even the fast path orders requests). A River ADWIN detector on the absolute log error flags drift.

A prefix prior (``learners.prefix_prior``) remembers what earlier prompts that began the same way
generated: ``with_prior(x)`` looks the prompt's segments up once, when the request arrives, and
the point moves toward that prior as far as its evidence goes (the fast path's prior, a feature
of the correction of the base model's).

A similar-prompt prior (``learners.similar_prior``) remembers what the served model answered to
the prompts nearest to this one (``x[VECTOR_KEY]``: the length model's vector of the prompt):
``with_prior`` looks it up too, and the point of either path moves toward it as far as the
history goes (a pool's own model says how long it answers, the text model what many models did).

Beside the point, a band: the prediction times the ``(1 - c) / 2`` and ``(1 + c) / 2`` quantiles
of ``log1p(actual) - log1p(predicted)`` over the class's recent requests (River's rolling
quantiles: the jackknife's conformal interval, per class). It holds coverage ``c`` by construction
over the window, and widens or narrows as the predictions get worse or better. Until a class has
``band_min`` outcomes its band is what the served model's validation errors say (``adopt_errors``:
the quantiles its training measured, the Block article's preload of typical requests), or a
factor of 2 each way for a model that measured none and for the fast path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from river import compose, drift, linear_model, optim, preprocessing, stats, utils

from steersman.learners.features import CLASSES
from steersman.learners.metrics import ProgressiveScore
from steersman.learners.prefix_prior import PrefixPrior
from steersman.learners.similar_prior import SimilarPrior

BASE_KEY = "base_tokens"
PREFIX_KEY = "prefix_segments"  # the prompt's segment hashes (learners.prefix_prior), a tuple
PRIOR_MEAN = "prefix_log_mean"  # what with_prior found: the prior's mean log1p(tokens) ...
PRIOR_WEIGHT = "prefix_weight"  # ... and how far to trust it, n / (n + prior_strength)
VECTOR_KEY = "prompt_vector"  # the length model's vector of the prompt (learners.similar_prior)
SIMILAR_MEAN = "similar_log_mean"  # what the nearest earlier prompts produced, log1p(tokens) ...
SIMILAR_WEIGHT = "similar_weight"  # ... and how far to trust it, n / (n + similar_strength)
_NOT_FEATURES = frozenset({BASE_KEY, PRIOR_MEAN, PRIOR_WEIGHT, SIMILAR_MEAN, SIMILAR_WEIGHT})
DEFAULT_SPREAD = math.log(2.0)  # a class's band before it has outcomes: a factor of 2 each way


@dataclass(frozen=True)
class Band:
    """A prediction in tokens with its band: ``lo <= mid <= hi``."""

    lo: float
    mid: float
    hi: float


_NUMBER_TYPES = (float, int, bool)


def _numeric(x: Mapping[str, Any]) -> dict[str, float]:
    """Finite numbers only; the request class one-hot; the base prediction and the prior left
    out (they enter as what they say against the point, not as raw values)."""
    out: dict[str, float] = {}
    for key, value in x.items():
        if type(value) in _NUMBER_TYPES:
            if key in _NOT_FEATURES or (type(value) is float and not math.isfinite(value)):
                continue
            out[key] = float(value) if abs(value) < 1e300 else (1e300 if value > 0 else -1e300)
        elif key == "request_class":
            for name in CLASSES:
                out[f"class_{name}"] = float(value == name)
    return out


def _model(lr: float, l2: float, intercept_lr: float) -> compose.Pipeline:
    # Clipped gradients: one outlandish outcome (or a feature far outside what was scaled so
    # far) must not throw the weights off for the next thousand requests.
    return preprocessing.StandardScaler() | linear_model.LinearRegression(
        optimizer=optim.SGD(lr), l2=l2, intercept_lr=intercept_lr, clip_gradient=1.0
    )


class LengthCorrector:
    """``predict_one(x) -> tokens``, ``learn_one(x, actual_tokens)``, River style.

    ``x`` holds request features and telemetry; ``x["base_tokens"]``, when present, is the base
    model's prediction to correct. Predictions are clamped to ``[1, max_tokens]`` (``x`` may carry
    ``max_tokens``); a NaN or infinite value is clamped too and counted in ``clamped``.

    >>> c = LengthCorrector(lr=0.05)
    >>> for _ in range(300):
    ...     c.learn_one({"brief": 1.0, "base_tokens": 200.0}, 100)
    >>> 80 < c.predict_one({"brief": 1.0, "base_tokens": 200.0}) < 125
    True
    """

    def __init__(
        self,
        lr: float = 0.005,
        l2: float = 0.0,
        intercept_lr: float = 0.1,
        window: int = 200,
        drift_delta: float = 0.002,
        max_tokens: int = 32_768,
        direct_prior: float = 128.0,
        coverage: float = 0.8,
        band_window: int = 500,
        band_min: int = 20,
        prior_entries: int = 200_000,
        prior_min_tokens: int = 64,
        prior_strength: float = 2.0,
        similar_window: int = 4096,
        similar_strength: float = 100.0,
    ) -> None:
        self.lr = lr
        self.l2 = l2
        self.intercept_lr = intercept_lr
        self.window = window
        self.drift_delta = drift_delta
        self.max_tokens = max_tokens
        self.direct_prior = direct_prior
        self.coverage = coverage
        self.band_window = band_window
        self.band_min = band_min
        self.prior = PrefixPrior(prior_entries)
        self.prior_min_tokens = prior_min_tokens  # a shorter shared start says little
        self.prior_strength = prior_strength
        self.similar_window = similar_window
        self.similar = SimilarPrior(similar_window)
        self.similar_strength = similar_strength
        self.band_resets = 0  # bands that came out NaN or inverted: reset, never used
        self.bands: dict[str, tuple[stats.RollingQuantile, stats.RollingQuantile, int]] = {}
        self.base_spread: tuple[float, float] | None = None  # adopt_errors: the model's claim
        self.class_means: dict[str, utils.Rolling] = {}
        self.residual = _model(lr, l2, intercept_lr)
        self.direct = _model(lr, l2, intercept_lr)
        self.detector = drift.ADWIN(delta=drift_delta)
        self.score = ProgressiveScore(window)
        self.base_score = ProgressiveScore(window)
        self.learned = 0
        self.clamped = 0
        self.drifts: list[int] = []  # the learn_one count at each detected drift

    def predict_one(self, x: Mapping[str, Any]) -> float:
        return self._predict(x)

    def with_prior(self, x: Mapping[str, Any], segment_tokens: int) -> dict[str, Any]:
        """``x`` with what the prefix prior knows of the prompt's segments (``x[PREFIX_KEY]``,
        each ``segment_tokens`` long) and the similar-prompt prior of its vector
        (``x[VECTOR_KEY]``): looked up once, when the request arrives, so that its prediction
        and what is learned from its outcome read the same priors.

        >>> c = LengthCorrector(prior_min_tokens=32)
        >>> for k in range(20):
        ...     c.learn_one({PREFIX_KEY: (1, 2, 3, 100 + k)}, 400)
        ...     c.learn_one({PREFIX_KEY: (5, 6, 7, 200 + k)}, 20)
        >>> a = c.with_prior({PREFIX_KEY: (1, 2, 3, 999)}, segment_tokens=16)
        >>> b = c.with_prior({PREFIX_KEY: (5, 6, 7, 999)}, segment_tokens=16)
        >>> round(c.predict_one(a)), round(c.predict_one(b))  # the fast path, from the prior
        (350, 23)
        """
        out = dict(x)
        segments = x.get(PREFIX_KEY)
        got = self.prior.predict_one(segments) if isinstance(segments, tuple) else None
        if got is not None and got.depth * segment_tokens >= self.prior_min_tokens:
            out[PRIOR_MEAN] = got.mean
            out[PRIOR_WEIGHT] = got.n / (got.n + self.prior_strength)
        vector = x.get(VECTOR_KEY)
        near = self.similar.predict_one(vector) if vector is not None else None
        if near is not None:
            out[SIMILAR_MEAN] = near.mean
            out[SIMILAR_WEIGHT] = near.n / (near.n + self.similar_strength)
        return out

    def adopt_errors(self, quantiles: Sequence[float] | None) -> None:
        """Bands before a class has outcomes, from the served model's validation errors:
        ``quantiles`` cut ``log1p(actual) - log1p(predicted)`` into ``len + 1`` equal parts
        (``learners.metrics.error_quantiles``; ``None``, or anything that is not an increasing
        list of finite numbers: a factor of 2).

        >>> c = LengthCorrector(coverage=0.8)
        >>> c.adopt_errors([-2.2, -1.0, -0.5, -0.2, 0.0, 0.3, 0.6, 1.0, 1.8])  # deciles
        >>> c.base_spread
        (-2.2, 1.8)
        >>> band = c.predict_band({"base_tokens": 100.0})
        >>> round(band.lo), round(band.hi), round(c.predict_band({}).hi)  # the fast path: x2
        (10, 610, 257)
        """
        self.base_spread = None
        values = [v for v in quantiles or () if _finite(v) is not None]
        if len(values) < 2 or len(values) != len(quantiles or ()) or values != sorted(values):
            return
        half = (1 - self.coverage) / 2
        low, high = _interpolated(values, half), _interpolated(values, 1 - half)
        # A band must hold the point: a model biased one way still gets a band around it.
        self.base_spread = (round(min(low, 0.0), 6), round(max(high, 0.0), 6))

    def predict_band(self, x: Mapping[str, Any]) -> Band:
        """The prediction with its band (see the module docstring)."""
        mid = self.predict_one(x)
        cls = str(x.get("request_class", "other"))
        default = -DEFAULT_SPREAD, DEFAULT_SPREAD
        if self.base_spread is not None and _finite(x.get(BASE_KEY)) is not None:
            default = self.base_spread
        low, high = default
        got = self.bands.get(cls)
        if got is not None and got[2] >= self.band_min:
            low, high = got[0].get(), got[1].get()
            if not (math.isfinite(low) and math.isfinite(high)) or low > high:
                self.band_resets += 1
                del self.bands[cls]
                low, high = default
        base = math.log1p(mid)
        upper = self._upper(x.get("max_tokens"))
        lo = min(max(math.expm1(base + low), 1.0), mid)
        hi = min(max(math.expm1(min(base + high, 50.0)), mid), max(upper, mid))
        return Band(lo, mid, hi)

    def _class_mean(self, x: Mapping[str, Any]) -> float:
        mean = self.class_means.get(str(x.get("request_class", "other")))
        return mean.get() if mean is not None and mean.obj.n else math.log1p(self.direct_prior)

    def _inputs(self, x: Mapping[str, Any], base: float | None) -> tuple[dict[str, float], float]:
        """(features, center) of one path: the correction of the base model's log length, or
        without one the fast path's, around the class mean; either moved toward the
        similar-prompt prior, the fast path's toward the prefix prior too."""
        features = _numeric(x)
        anchor = math.log1p(max(base, 0.0)) if base is not None else self._class_mean(x)
        similar, share = _finite(x.get(SIMILAR_MEAN)), _finite(x.get(SIMILAR_WEIGHT))
        if similar is not None and share is not None:
            anchor += share * (similar - anchor)
        prior, weight = _finite(x.get(PRIOR_MEAN)), _finite(x.get(PRIOR_WEIGHT))
        if prior is None or weight is None:
            return features, anchor
        gap = weight * (prior - anchor)
        features["prefix_gap"] = gap
        return features, anchor if base is not None else anchor + gap

    def _predict(self, x: Mapping[str, Any]) -> float:
        base = _finite(x.get(BASE_KEY))
        features, center = self._inputs(x, base)
        if base is not None:
            correction = self.residual.predict_one(features)
        else:
            correction = self.direct.predict_one(features) if self.learned else 0.0
        # A correction beyond a factor of e^3 (about 20) is not a correction.
        return self._clamp(center + max(-3.0, min(3.0, correction)), x.get("max_tokens"))

    def learn_one(self, x: Mapping[str, Any], y: float) -> None:
        actual = _finite(y)
        if actual is None or actual < 0:
            return
        base = _finite(x.get(BASE_KEY))
        predicted = self._predict(x)
        self.score.update(predicted, actual)
        target = math.log1p(actual)
        cls = str(x.get("request_class", "other"))
        self._learn_band(cls, target - math.log1p(predicted))
        if base is not None:
            self.base_score.update(base, actual)
            features, center = self._inputs(x, base)
            self.residual.learn_one(features, target - center)
        features, center = self._inputs(x, None)
        self.direct.learn_one(features, target - center)
        segments = x.get(PREFIX_KEY)
        if isinstance(segments, tuple):
            self.prior.learn_one(segments, actual)
        vector = x.get(VECTOR_KEY)
        if vector is not None:
            self.similar.learn_one(vector, actual)
        means = self.class_means.get(cls)
        if means is None:
            means = self.class_means[cls] = utils.Rolling(stats.Mean, window_size=500)
        means.update(target)
        self.learned += 1
        self.detector.update(abs(math.log1p(predicted) - target))
        if self.detector.drift_detected:
            self.drifts.append(self.learned)

    def _learn_band(self, cls: str, error: float) -> None:
        got = self.bands.get(cls)
        if got is None:
            half = (1 - self.coverage) / 2
            got = (
                stats.RollingQuantile(half, self.band_window),
                stats.RollingQuantile(1 - half, self.band_window),
                0,
            )
        got[0].update(error)
        got[1].update(error)
        self.bands[cls] = (got[0], got[1], got[2] + 1)

    def reset(self, *, new_model: bool = False) -> None:
        """Forget what was learned online (the controller's hot model update, a new model): the
        corrections, and the bands, which described the errors of the corrected predictions
        (what the model's validation said stays: ``adopt_errors`` for a new model). What the
        served model answered to similar prompts stays true; the prompts' vectors go only with
        ``new_model`` (a new model's encoder places prompts elsewhere)."""
        if new_model:
            self.similar = SimilarPrior(self.similar_window)
        self.residual = _model(self.lr, self.l2, self.intercept_lr)
        self.direct = _model(self.lr, self.l2, self.intercept_lr)
        self.detector = drift.ADWIN(delta=self.drift_delta)
        self.bands.clear()

    def _upper(self, max_tokens: Any) -> float:
        return float(max_tokens) if _finite(max_tokens) and max_tokens > 0 else self.max_tokens

    def _clamp(self, log_pred: float, max_tokens: Any) -> float:
        upper = self._upper(max_tokens)
        if not math.isfinite(log_pred):
            self.clamped += 1
            return upper if log_pred > 0 else 1.0
        value = math.expm1(min(log_pred, 50.0))
        if value < 1.0 or value > upper:
            return min(max(value, 1.0), upper)
        return value


def _interpolated(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile from the cut points of ``len + 1`` equal parts, linearly interpolated
    (beyond the outer cut points: those)."""
    at = min(max(q * (len(values) + 1) - 1, 0.0), len(values) - 1.0)
    k = min(int(at), len(values) - 2)
    return values[k] + (at - k) * (values[k + 1] - values[k])


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
