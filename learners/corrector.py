"""The online corrector: River regressors that learn from every finished request.

With a base prediction (RoBERTa's) it learns the residual ``log1p(actual) - log1p(base)`` from
request features and telemetry; without one it is the fast feature-only predictor, learning
``log1p(actual)`` directly. A River ADWIN detector on the absolute log error flags drift.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from river import compose, drift, linear_model, optim, preprocessing

from steersman.learners.features import CLASSES
from steersman.learners.metrics import ProgressiveScore

BASE_KEY = "base_tokens"


_NUMBER_TYPES = (float, int, bool)


def _numeric(x: Mapping[str, Any]) -> dict[str, float]:
    """Finite numbers only; the request class one-hot; the base prediction left out."""
    out: dict[str, float] = {}
    for key, value in x.items():
        if type(value) in _NUMBER_TYPES:
            if key == BASE_KEY or (type(value) is float and not math.isfinite(value)):
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
        lr: float = 0.02,
        l2: float = 0.0,
        intercept_lr: float = 0.05,
        window: int = 200,
        drift_delta: float = 0.002,
        max_tokens: int = 32_768,
        direct_prior: float = 128.0,
    ) -> None:
        self.lr = lr
        self.l2 = l2
        self.intercept_lr = intercept_lr
        self.window = window
        self.drift_delta = drift_delta
        self.max_tokens = max_tokens
        self.direct_prior = direct_prior
        self.residual = _model(lr, l2, intercept_lr)
        self.direct = _model(lr, l2, intercept_lr)
        self.detector = drift.ADWIN(delta=drift_delta)
        self.score = ProgressiveScore(window)
        self.base_score = ProgressiveScore(window)
        self.learned = 0
        self.clamped = 0
        self.drifts: list[int] = []  # the learn_one count at each detected drift

    def predict_one(self, x: Mapping[str, Any]) -> float:
        return self._predict(_numeric(x), x)

    def _predict(self, features: dict[str, float], x: Mapping[str, Any]) -> float:
        base = _finite(x.get(BASE_KEY))
        if base is not None:
            residual = self.residual.predict_one(features)
            # A correction beyond a factor of e^3 (about 20) is not a correction.
            log_pred = math.log1p(max(base, 0.0)) + max(-3.0, min(3.0, residual))
        elif self.learned:
            log_pred = self.direct.predict_one(features)
        else:
            log_pred = math.log1p(self.direct_prior)
        return self._clamp(log_pred, x.get("max_tokens"))

    def learn_one(self, x: Mapping[str, Any], y: float) -> None:
        actual = _finite(y)
        if actual is None or actual < 0:
            return
        features = _numeric(x)
        base = _finite(x.get(BASE_KEY))
        predicted = self._predict(features, x)
        self.score.update(predicted, actual)
        target = math.log1p(actual)
        if base is not None:
            self.base_score.update(base, actual)
            self.residual.learn_one(features, target - math.log1p(max(base, 0.0)))
        self.direct.learn_one(features, target)
        self.learned += 1
        self.detector.update(abs(math.log1p(predicted) - target))
        if self.detector.drift_detected:
            self.drifts.append(self.learned)

    def reset(self) -> None:
        """Forget what was learned online (the controller's hot model update)."""
        self.residual = _model(self.lr, self.l2, self.intercept_lr)
        self.direct = _model(self.lr, self.l2, self.intercept_lr)
        self.detector = drift.ADWIN(delta=self.drift_delta)

    def _clamp(self, log_pred: float, max_tokens: Any) -> float:
        upper = float(max_tokens) if _finite(max_tokens) and max_tokens > 0 else self.max_tokens
        if not math.isfinite(log_pred):
            self.clamped += 1
            return upper if log_pred > 0 else 1.0
        value = math.expm1(min(log_pred, 50.0))
        if value < 1.0 or value > upper:
            return min(max(value, 1.0), upper)
        return value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
