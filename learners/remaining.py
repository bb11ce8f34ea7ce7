"""Remaining length, refined while a request decodes: what is left of a request that has produced
``k`` tokens, given the length it was scheduled with and how actual lengths have compared with
scheduled ones, per request class, learned online.

Response lengths are heavy-tailed: a request that has passed its prediction is not almost done.
With ``rho = actual / scheduled`` over a window of recent requests of the class, the expected
remaining length of a request scheduled for ``s`` tokens that has produced ``k`` is
``s * m(k / s)``, where ``m(u) = E[rho - u | rho > u]`` (the mean residual of the ratio). Before
a request starts that is ``s * E[rho]``; beyond every ratio seen, a request is taken to have at
least a quarter of what it produced still to go (a heavy tail's residual grows with its age).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from river import utils

# Ratios produced/scheduled at which m is tabulated: fine below 1, coarser beyond.
GRID = np.concatenate([np.linspace(0.0, 1.0, 41), np.geomspace(1.05, 64.0, 40)])


class RemainingLength:
    """``learn_one({"request_class": c, "scheduled": s}, actual)``; ``table()`` gives, per
    class, ``m`` on ``GRID`` for vectorised lookups; ``predict_one`` one value.

    >>> r = RemainingLength(window=100, refresh_every=10)
    >>> for k in range(100):  # actual lengths spread around half of what was scheduled
    ...     r.learn_one({"request_class": "chat", "scheduled": 100.0}, 25 + k % 50)
    >>> round(r.predict_one({"request_class": "chat", "scheduled": 100.0, "produced": 0}))
    50
    >>> round(r.predict_one({"request_class": "chat", "scheduled": 100.0, "produced": 60}))
    8
    >>> r.predict_one({"request_class": "code", "scheduled": 100.0, "produced": 30})  # no data
    70.0
    """

    def __init__(self, window: int = 500, refresh_every: int = 50, min_samples: int = 30) -> None:
        self.window = window
        self.refresh_every = refresh_every
        self.min_samples = min_samples
        self.ratios: dict[str, utils.SortedWindow] = {}
        self._tables: dict[str, np.ndarray] = {}
        self._since: dict[str, int] = {}

    def learn_one(self, x: Mapping[str, Any], y: float) -> None:
        scheduled = x.get("scheduled")
        if not _positive(scheduled) or not _positive(y, allow_zero=True):
            return
        cls = str(x.get("request_class", "other"))
        ratios = self.ratios.setdefault(cls, utils.SortedWindow(self.window))
        ratios.append(float(y) / float(scheduled))
        self._since[cls] = self._since.get(cls, 0) + 1
        if self._since[cls] >= self.refresh_every or cls not in self._tables:
            self._since[cls] = 0
            if len(ratios) >= self.min_samples:
                self._tables[cls] = mean_residual(np.asarray(ratios))

    def table(self, request_class: str) -> np.ndarray | None:
        """``m`` on ``GRID`` for the class; None until it has ``min_samples`` outcomes."""
        return self._tables.get(request_class)

    def predict_one(self, x: Mapping[str, Any]) -> float:
        s = float(x.get("scheduled") or 0.0)
        produced = float(x.get("produced") or 0.0)
        if s <= 0:
            return 1.0
        table = self.table(str(x.get("request_class", "other")))
        return float(remaining(np.array([s]), np.array([produced]), table)[0])


TAIL = 0.25  # beyond the data: at least this share of what was produced is left


def mean_residual(ratios: np.ndarray) -> np.ndarray:
    """``m(u) = E[rho - u | rho > u]`` on ``GRID``; beyond the largest ratio, the residual at
    the last point with data, or ``TAIL * u`` when that is more."""
    rho = np.sort(ratios[np.isfinite(ratios)])
    suffix = np.cumsum(rho[::-1])[::-1]  # suffix[i] = sum(rho[i:])
    at = np.searchsorted(rho, GRID, side="right")  # first index with rho > u
    count = len(rho) - at
    m = np.empty(len(GRID))
    has = count > 0
    m[has] = suffix[at[has]] / count[has] - GRID[has]
    if not has.all():
        last = m[np.flatnonzero(has)[-1]] if has.any() else 0.0
        m[~has] = np.maximum(last, TAIL * GRID[~has])
    return np.maximum(m, 1e-3)


def remaining(scheduled: np.ndarray, produced: np.ndarray, table: np.ndarray | None) -> np.ndarray:
    """Expected tokens left per request; without a table, the prediction less what was
    produced, but at least a tenth of the prediction (and always at least one token)."""
    if table is None:
        left = np.maximum(scheduled - produced, 0.1 * scheduled)
    else:
        u = produced / np.maximum(scheduled, 1e-9)
        left = scheduled * np.interp(u, GRID, table)
    return np.maximum(left, 1.0)


def _positive(value: Any, allow_zero: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value >= 0 if allow_zero else value > 0
