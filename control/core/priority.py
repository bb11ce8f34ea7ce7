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
