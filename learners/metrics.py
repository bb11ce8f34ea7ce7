"""Progressive validation of length predictions: rolling MAE, within-30% rate, Kendall tau."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

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


def error_quantiles(
    predicted_log: list[float], actual_log: list[float], parts: int = 20
) -> list[float] | None:
    """The cut points of ``actual - predicted`` (log lengths) into ``parts`` equal parts: what a
    model's validation says of its errors, for the corrector's bands before any outcome
    (``LengthCorrector.adopt_errors``). ``None`` with fewer than ``parts`` pairs.

    >>> error_quantiles([0.0] * 4, [-1.0, 0.0, 1.0, 2.0], parts=4)
    [-0.75, 0.5, 1.75]
    """
    errors = [a - p for p, a in zip(predicted_log, actual_log, strict=True)]
    errors = [e for e in errors if math.isfinite(e)]
    if len(errors) < parts:
        return None
    return [round(q, 4) for q in statistics.quantiles(errors, n=parts)]


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


class RankWindow:
    """How well a model has ordered its last ``window`` outcomes: River's rolling Pearson
    correlation of log predicted and log actual lengths (0 for a model that says the same for
    every request); None until the window is full.

    Feed it in the order the predictions were made (``InOrder``): requests that finish together
    are a biased sample when the predictions decide who waits (a long prediction waits longer,
    and finishes beside short requests predicted long ago), which can read as no correlation
    where the model ranks well.

    >>> r = RankWindow(window=20)
    >>> for k in range(20):
    ...     r.update(128.0, 10 + 7 * k)
    >>> r.get()
    0
    >>> for k in range(20):
    ...     r.update(10 + 7 * k, 12 + 6 * k)
    >>> r.get() > 0.99
    True
    """

    def __init__(self, window: int = 100) -> None:
        self.window = window
        self._corr = utils.Rolling(stats.PearsonCorr, window_size=window)

    def update(self, predicted: float, actual: float) -> None:
        if math.isfinite(predicted) and math.isfinite(actual):
            self._corr.update(math.log1p(max(predicted, 0.0)), math.log1p(max(actual, 0.0)))

    @property
    def count(self) -> int:
        """Outcomes in the window so far."""
        return len(self._corr.window)

    def get(self) -> float | None:
        if self.count < self.window:
            return None
        try:
            return self._corr.get()
        except (ValueError, ZeroDivisionError):  # a rolled-back variance a hair below zero
            return 0.0


class InOrder:
    """Outcomes that come back in any order, handed on in the order of their sequence numbers.
    An outcome still missing once ``patience`` later ones wait is given up on (a request that
    runs very long must not hold the others back).

    >>> got = []
    >>> order = InOrder(got.append, patience=3)
    >>> for seq, item in [(1, "b"), (0, "a"), (3, "d"), (4, "e"), (5, "f"), (6, "g")]:
    ...     order.put(seq, item)
    >>> got  # 2 never came: given up on once 3, 4 and 5 waited
    ['a', 'b', 'd', 'e', 'f', 'g']
    """

    def __init__(self, emit: Callable[[Any], None], patience: int = 200) -> None:
        self.emit = emit
        self.patience = patience
        self.next = 0
        self.pending: dict[int, Any] = {}

    def put(self, seq: int, item: Any) -> None:
        """``item`` None: the sequence number is done with nothing to hand on."""
        if seq < self.next:
            return
        self.pending[seq] = item
        while self.pending:
            if self.next not in self.pending:
                if len(self.pending) < self.patience:
                    return
                self.next = min(self.pending)
            item = self.pending.pop(self.next)
            self.next += 1
            if item is not None:
                self.emit(item)
