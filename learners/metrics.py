"""Progressive validation of length predictions: rolling MAE, within-30% rate, Kendall tau."""

from __future__ import annotations

import math
from collections import deque

from river import metrics, stats, utils
from scipy.stats import kendalltau


def within(predicted: float, actual: float, tolerance: float = 0.3) -> bool:
    """Whether a prediction is within ``tolerance`` of the actual length (relative to actual).

    >>> within(130, 100), within(131, 100), within(1, 0)
    (True, False, False)
    """
    if actual <= 0:
        return predicted <= 0
    return abs(predicted - actual) <= tolerance * actual


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
