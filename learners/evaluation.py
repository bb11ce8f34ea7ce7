"""Progressive evaluation of the length predictors on data served in order, as in production:
each request is predicted, then learned from; the base, corrected and feature-only paths scored,
and, given the prompts' vectors, the corrected path with the similar-prompt prior."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from steersman.learners.corrector import BASE_KEY, VECTOR_KEY, LengthCorrector
from steersman.learners.features import request_features
from steersman.learners.metrics import score

PATHS = ("base", "corrected", "fast", "similar")


@dataclass(frozen=True)
class History:
    """Requests a pool served before the evaluated ones: every path learns them first."""

    prompts: list[str]
    actual: list[int]
    prompt_tokens: list[int]
    base: list[float]
    vectors: list[Any]


def evaluate(
    prompts: list[str],
    actual: list[int],
    prompt_tokens: list[int],
    base: list[float] | None,
    checkpoints: tuple[int, ...] = (200, 1000),
    window: int = 200,
    vectors: list[Any] | None = None,
    history: History | None = None,
    with_pairs: bool = False,
) -> dict[str, Any]:
    """Progressive evaluation in the given order; rolling MAE at each checkpoint. ``vectors``
    (the length model's, per prompt; with ``base``) adds the ``similar`` path: the corrected
    prediction with the similar-prompt prior. ``history``: learned first by every path.
    ``with_pairs``: each path's (predicted, actual) per request too, in the order served."""
    fast, corrected, similar = LengthCorrector(), LengthCorrector(), LengthCorrector()
    with_vectors = base is not None and vectors is not None

    def learn(x: dict[str, Any], b: float | None, near: dict[str, Any] | None, y: int) -> None:
        fast.learn_one(x, y)
        if b is not None:
            corrected.learn_one({**x, BASE_KEY: b}, y)
        if near is not None:
            similar.learn_one(near, y)

    h = history
    for i, (text, y) in enumerate(zip(h.prompts, h.actual, strict=True) if h else ()):
        x = request_features(text, prompt_tokens=h.prompt_tokens[i])
        near = {**x, BASE_KEY: h.base[i], VECTOR_KEY: h.vectors[i]}
        learn(x, h.base[i], similar.with_prior(near, 0) if with_vectors else None, y)
    pairs: dict[str, list[tuple[float, float]]] = {p: [] for p in PATHS}
    per_class: dict[str, dict[str, list[tuple[float, float]]]] = {}
    rolling: dict[int, dict[str, float]] = {}
    bands: dict[str, list[tuple[float, float, float]]] = {"fast": [], "corrected": []}
    for i, (text, y) in enumerate(zip(prompts, actual, strict=True)):
        x: dict[str, Any] = request_features(text, prompt_tokens=prompt_tokens[i])
        band = fast.predict_band(x)
        guesses = {"fast": band.mid}
        bands["fast"].append((band.lo, band.hi, float(y)))
        if base is not None:
            band = corrected.predict_band({**x, BASE_KEY: base[i]})
            guesses["base"] = base[i]
            guesses["corrected"] = band.mid
            bands["corrected"].append((band.lo, band.hi, float(y)))
        near = None
        if with_vectors:
            near = similar.with_prior({**x, BASE_KEY: base[i], VECTOR_KEY: vectors[i]}, 0)
            band = similar.predict_band(near)
            guesses["similar"] = band.mid
            bands.setdefault("similar", []).append((band.lo, band.hi, float(y)))
        for name, value in guesses.items():
            pairs[name].append((value, float(y)))
            per_class.setdefault(x["request_class"], {p: [] for p in PATHS})[name].append(
                (value, float(y))
            )
        learn(x, base[i] if base is not None else None, near, y)
        if i + 1 in checkpoints:
            rolling[i + 1] = {
                name: statistics.fmean(abs(p - a) for p, a in got[-window:])
                for name, got in pairs.items()
                if got
            }
    out = {
        "rows": len(actual),
        "overall": {name: score(got) for name, got in pairs.items() if got},
        "per_class": {
            cls: {name: score(got) for name, got in paths.items() if got}
            for cls, paths in sorted(per_class.items())
        },
        "rolling_mae": rolling,
        "band": {name: band_score(got) for name, got in bands.items() if got},
        "drift_events": corrected.drifts if base is not None else fast.drifts,
    }
    if with_pairs:
        out["pairs"] = {name: got for name, got in pairs.items() if got}
    return out


def band_score(bands: list[tuple[float, float, float]], tolerance: float = 0.3) -> dict[str, float]:
    """Of (low, high, actual): the share inside the band (its coverage), the share more than
    ``tolerance`` outside it (the controller's misses), and the median width high / low.

    >>> band_score([(10, 20, 15), (10, 20, 30), (10, 20, 5)])
    {'coverage': 0.333, 'miss_rate': 0.667, 'median_width': 2.0}
    """
    inside = sum(lo <= y <= hi for lo, hi, y in bands)
    missed = sum(y < lo * (1 - tolerance) or y > hi * (1 + tolerance) for lo, hi, y in bands)
    widths = [hi / max(lo, 1.0) for lo, hi, _ in bands]
    n = len(bands)
    return {
        "coverage": round(inside / n, 3),
        "miss_rate": round(missed / n, 3),
        "median_width": round(statistics.median(widths), 3),
    }
