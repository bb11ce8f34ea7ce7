"""Request priority: shortest predicted first, with aging so that nothing starves."""

from __future__ import annotations

import math


def priority_key(predicted_tokens: float, arrived_at: float, aging_s: float) -> float:
    """Shortest predicted first, with aging: a request that arrived ``aging_s`` seconds earlier
    outranks one predicted twice as short, so nothing starves. Lower is served first.

    The key never changes while a request waits, so a heap orders the queue.

    >>> priority_key(100, 0.0, 5.0) < priority_key(10, 30.0, 5.0)  # waited 30 s longer
    True
    >>> priority_key(10, 0.0, 5.0) < priority_key(100, 0.0, 5.0)
    True
    """
    size = math.log2(1.0 + max(predicted_tokens, 0.0)) if math.isfinite(predicted_tokens) else 64
    return arrived_at / aging_s + size


def vllm_priority(key: float, origin: float, aging_s: float) -> int:
    """The key as vLLM's integer priority (lower first), relative to ``origin`` (the daemon's
    start) so the numbers stay small; a tenth of a doubling per unit."""
    return round((key - origin / aging_s) * 10)


class TypicalLength:
    """The geometric mean of recent scheduled lengths (over about the last ``window``): the size
    at which a request outside the length order joins it.

    >>> t = TypicalLength(127.0)
    >>> t.get()
    127.0
    >>> for length in (7.0, 31.0, float("nan"), -1.0):  # odd data is passed over
    ...     t.update(length)
    >>> t.get()  # 2 ** mean(log2(1 + length)) - 1
    15.0
    """

    def __init__(self, default_tokens: float, window: int = 1000) -> None:
        self.window = window
        self._log = math.log2(1.0 + max(default_tokens, 0.0))
        self._n = 0

    def update(self, tokens: float) -> None:
        if not math.isfinite(tokens) or tokens < 0:
            return  # the hot path never raises on odd data
        self._n += 1
        self._log += (math.log2(1.0 + tokens) - self._log) / min(self._n, self.window)

    def get(self) -> float:
        return 2.0**self._log - 1.0
