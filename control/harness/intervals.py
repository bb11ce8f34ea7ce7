"""How sure a benchmark's comparison is: bootstrap intervals, from SciPy.

A figure from twelve runs of a chaotic overload, or from 156 prompts, moves by a point or two
with the runs or prompts drawn; a difference smaller than its interval is not one a reader can
act on. The resampling is seeded, so a report renders the same twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import bootstrap, kendalltau

CONFIDENCE = 0.9
RESAMPLES = 2000


def ratio_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float] | None:
    """The ratio of the means of paired runs (run i of ``a`` beside run i of ``b``: the same
    arrivals) and its bootstrap interval, the runs resampled in pairs. ``None`` with fewer
    than two pairs, a length mismatch or a non-positive mean of ``b``.

    >>> ratio_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    (0.5, 0.5, 0.5)
    >>> point, lo, hi = ratio_interval([1.0, 1.1, 0.9, 1.2], [1.0, 1.0, 1.0, 1.0])
    >>> round(point, 3), lo < point < hi
    (1.05, True)
    >>> ratio_interval([1.0], [1.0]) is None, ratio_interval([1.0, 2.0], [0.0, 0.0]) is None
    (True, True)
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or len(x) != len(y) or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    if y.sum() <= 0:
        return None
    point = float(x.sum() / y.sum())
    if np.allclose(x, point * y):  # every pair in the same proportion: nothing to resample
        return point, point, point

    def ratio(u: np.ndarray, v: np.ndarray, axis: int) -> np.ndarray:
        return u.sum(axis=axis) / v.sum(axis=axis)

    return (point, *_percentile((x, y), ratio, confidence, RESAMPLES, paired=True, vectorized=True))


def mean_tau_interval(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]],
    baseline: Sequence[Sequence[float]] | None = None,
    confidence: float = CONFIDENCE,
    resamples: int = 1000,
) -> tuple[float, float] | None:
    """The bootstrap interval of the mean Kendall tau over ``groups`` of (predicted, actual),
    each over the same items in the same order (one answering model's answers to the same
    prompts): the items are resampled together, as another draw of prompts would change every
    group at once. Given ``baseline`` (another predictor's predictions, group by group), the
    interval of the mean tau's gain over it, on the same draws: where the two predict alike,
    far narrower than either tau's own, since both move with the draw. ``None`` with groups of
    different sizes or fewer than three items.

    >>> ordered = (list(range(40)), list(range(40)))
    >>> scrambled = (list(range(40)), [(17 * k) % 40 for k in range(40)])  # tau -0.05
    >>> lo, hi = mean_tau_interval([scrambled])
    >>> lo < 0 < hi
    True
    >>> lo, hi = mean_tau_interval([scrambled, ordered])  # the mean, 0.48
    >>> 0.3 < lo < 0.48 < hi < 0.6
    True
    >>> mean_tau_interval([ordered], baseline=[list(range(40))])  # no gain over itself
    (0.0, 0.0)
    """
    sizes = {len(p) for p, _ in groups} | {len(a) for _, a in groups}
    sizes |= {len(b) for b in baseline or ()}
    if len(sizes) != 1 or (n := sizes.pop()) < 3:
        return None
    if baseline is not None and len(baseline) != len(groups):
        return None
    arrays = [(np.asarray(p, dtype=float), np.asarray(a, dtype=float)) for p, a in groups]
    others = [np.asarray(b, dtype=float) for b in baseline or ()]

    def mean_tau(predicted: list[np.ndarray], index: np.ndarray) -> float:
        pairs = zip(predicted, arrays, strict=True)
        taus = [kendalltau(p[index], a[index]).statistic for p, (_, a) in pairs]
        taus = [t for t in taus if not math.isnan(t)]
        return float(np.mean(taus)) if taus else 0.0

    def statistic(index: np.ndarray) -> float:
        got = mean_tau([p for p, _ in arrays], index)
        return got - mean_tau(others, index) if others else got

    return _percentile((np.arange(n),), statistic, confidence, resamples, vectorized=False)


def _percentile(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    confidence: float,
    resamples: int,
    **how: bool,
) -> tuple[float, float]:
    """SciPy's percentile bootstrap, seeded: the same interval every time for the same data."""
    got = bootstrap(
        data,
        statistic,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(0),
        **how,
    ).confidence_interval
    return float(got.low), float(got.high)
