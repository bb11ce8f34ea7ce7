"""Progressive validation of length predictions: rolling MAE, within-30% rate, Kendall tau."""

from __future__ import annotations

import math
import statistics
from collections import deque

from river import metrics, stats, utils
from scipy.stats import kendalltau


def within(predicted: float, actual: float, tolerance: float = 0.3) -> bool:
    """Whether a prediction is within ``tolerance`` of the actual length (relative to the actual
    length, counted as at least one token). The one statement of the 30% rule: the controller's
    misses use it too.

    >>> within(130, 100), within(131, 100), within(0, 0), within(1, 0)
    (True, False, True, False)
    """
    return abs(predicted - actual) <= tolerance * max(actual, 1)


class ProgressiveScore:
    """Scores each prediction against its outcome, over a window of the most recent ones."""

    def __init__(self, window: int = 200, tolerance: float = 0.3) -> None:
        self.window = window
        self.tolerance = tolerance
        self.mae = utils.Rolling(metrics.MAE, window_size=window)
        self.hit_rate = utils.Rolling(stats.Mean, window_size=window)
        self.pairs: deque[tuple[float, float]] = deque(maxlen=window)
        self.count = 0

    def update(self, predicted: float, actual: float) -> None:
        self.mae.update(actual, predicted)
        self.hit_rate.update(float(within(predicted, actual, self.tolerance)))
        self.pairs.append((predicted, actual))
        self.count += 1

    def kendall_tau(self) -> float | None:
        if len(self.pairs) < 3:
            return None
        tau = kendalltau([p for p, _ in self.pairs], [a for _, a in self.pairs]).statistic
        return None if tau is None or math.isnan(tau) else float(tau)

    def snapshot(self) -> dict[str, float | int | None]:
        return {
            "n": self.count,
            "mae": self.mae.get() if self.count else None,
            "within_30": self.hit_rate.get() if self.count else None,
            "kendall_tau": self.kendall_tau(),
        }


def score(pairs: list[tuple[float, float]]) -> dict[str, float | None]:
    """MAE, median relative error, within-30% rate and Kendall tau of (predicted, actual)."""
    if not pairs:
        return {
            "n": 0,
            "mae": None,
            "median_rel_error": None,
            "within_30": None,
            "kendall_tau": None,
        }
    predicted, actual = zip(*pairs, strict=True)
    tau = kendalltau(predicted, actual).statistic if len(pairs) > 2 else math.nan
    return {
        "n": len(pairs),
        "mae": statistics.fmean(abs(p - a) for p, a in pairs),
        "median_rel_error": statistics.median(abs(p - a) / max(a, 1.0) for p, a in pairs),
        "within_30": statistics.fmean(within(p, a) for p, a in pairs),
        "kendall_tau": None if math.isnan(tau) else float(tau),
    }
