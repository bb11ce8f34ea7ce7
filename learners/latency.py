"""The latency model: River regressors of one instance's decode step time and prefill cost.

Decode: time per output token (TPOT) against the batch it ran in (running sequences, KV usage)
and the GPU's state (SM activity, SM clock, temperature: a throttled GPU decodes slower).
Prefill: time to first token against prompt tokens and the batch. Until ``warmup`` outcomes have
been learned, predictions come from the prior coefficients (a calibrated step-time profile).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from river import compose, linear_model, optim, preprocessing

DECODE_KEYS = ("running", "kv_usage", "sm_activity", "sm_clock_mhz", "temperature_c")
PREFILL_KEYS = ("prompt_tokens", "running", "kv_usage", "sm_activity")


@dataclass(frozen=True)
class StepCoefficients:
    """``step(n) = base_s + per_seq_s * n``; prefill costs ``prefill_s_per_token`` a token."""

    base_s: float
    per_seq_s: float
    prefill_s_per_token: float


def _pick(x: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for key in keys:
        value = x.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


def _model(lr: float) -> compose.Pipeline:
    return preprocessing.StandardScaler() | linear_model.LinearRegression(
        optimizer=optim.SGD(lr), intercept_lr=lr, clip_gradient=1.0
    )


class LatencyModel:
    """``predict_one(x)`` -> decode step time (s) with ``x["running"]`` sequences;
    ``learn_one(x, tpot_s, ttft_s)`` after each finished request; ``coefficients(x)`` for the
    predictive dispatch policy.

    >>> m = LatencyModel(prior=StepCoefficients(0.01, 0.001, 0.0001), warmup=50, lr=0.05)
    >>> round(m.predict_one({"running": 4}), 4)  # the prior
    0.014
    >>> for i in range(2000):
    ...     n = 1 + i % 8
    ...     m.learn_one({"running": n, "prompt_tokens": 100}, 0.02 + 0.002 * n, 0.05)
    >>> c = m.coefficients({})
    >>> 0.015 < c.base_s < 0.025 and 0.0015 < c.per_seq_s < 0.0025
    True
    """

    def __init__(
        self, prior: StepCoefficients, warmup: int = 30, lr: float = 0.02, max_step_s: float = 10.0
    ) -> None:
        self.prior = prior
        self.warmup = warmup
        self.lr = lr
        self.max_step_s = max_step_s
        self.decode = _model(lr)
        self.prefill = _model(lr)
        self.decode_learned = 0
        self.prefill_learned = 0

    def learn_one(
        self, x: Mapping[str, Any], tpot_s: float | None = None, ttft_s: float | None = None
    ) -> None:
        if _usable(tpot_s, self.max_step_s):
            self.decode.learn_one(_pick(x, DECODE_KEYS), float(tpot_s))  # type: ignore[arg-type]
            self.decode_learned += 1
        if _usable(ttft_s, 10 * self.max_step_s) and _usable(x.get("prompt_tokens"), math.inf):
            self.prefill.learn_one(_pick(x, PREFILL_KEYS), float(ttft_s))  # type: ignore[arg-type]
            self.prefill_learned += 1

    def predict_one(self, x: Mapping[str, Any]) -> float:
        c = self.coefficients(x)
        running = x.get("running", 1)
        n = float(running) if _usable(running, math.inf) else 1.0
        return c.base_s + c.per_seq_s * n

    def coefficients(self, x: Mapping[str, Any]) -> StepCoefficients:
        prior = self.prior
        base, per_seq, prefill = prior.base_s, prior.per_seq_s, prior.prefill_s_per_token
        if self.decode_learned >= self.warmup:
            one = _pick({**x, "running": 1.0}, DECODE_KEYS)
            two = _pick({**x, "running": 2.0}, DECODE_KEYS)
            at_one = self.decode.predict_one(one)
            slope = self.decode.predict_one(two) - at_one
            per_seq = max(slope, 0.0)
            base = max(at_one - per_seq, prior.base_s * 0.1)
        if self.prefill_learned >= self.warmup:
            lo = self.prefill.predict_one(_pick({**x, "prompt_tokens": 0.0}, PREFILL_KEYS))
            hi = self.prefill.predict_one(_pick({**x, "prompt_tokens": 1000.0}, PREFILL_KEYS))
            prefill = max((hi - lo) / 1000.0, 0.0)
        values = (base, per_seq, prefill)
        if not all(math.isfinite(v) for v in values):
            return prior
        return StepCoefficients(min(base, self.max_step_s), min(per_seq, self.max_step_s), prefill)


def _usable(value: Any, upper: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= upper
    )
