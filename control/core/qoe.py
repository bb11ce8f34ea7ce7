"""Quality of experience of a streamed response, after Andes (arXiv 2404.16283).

The user expects the first token after ``expected_ttft`` seconds and then one token every
``expected_pace`` seconds. Tokens delivered faster than that bring nothing (the user cannot read
them sooner), so the delivered curve is capped by the expected one. QoE is the area under the
capped delivered curve divided by the area under the expected curve, both up to the later of the
expected and the actual end, plus one expected token interval (so the last token counts): 1.0
when the stream kept up, smaller the more it lagged.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def qoe(
    token_times: Sequence[tuple[float, int]],
    total_tokens: int,
    *,
    expected_ttft: float = 1.0,
    expected_pace: float = 0.2,
) -> float | None:
    """``token_times``: (seconds since the request arrived, tokens delivered so far).

    >>> qoe([(0.1, 1), (0.2, 2), (0.3, 3)], 3)             # faster than expected: perfect
    1.0
    >>> round(qoe([(3.0, 3)], 3), 3)                 # all three tokens at 3.0 s, none before
    0.1
    >>> qoe([], 0) is None
    True
    """
    if total_tokens <= 0 or not token_times:
        return None
    expected_end = expected_ttft + (total_tokens - 1) * expected_pace
    horizon = max(expected_end, token_times[-1][0]) + expected_pace

    def expected(t: float) -> int:
        """The expected curve, a staircase: k tokens from the k-th expected time on."""
        if t < expected_ttft:
            return 0
        return min(total_tokens, 1 + int((t - expected_ttft) / expected_pace + 1e-9))

    # Exact areas: both curves are staircases that step at the expected token times and at
    # the actual delivery times, so integrate between consecutive breakpoints.
    points = {0.0, horizon, *(t for t, _ in token_times)}
    points.update(expected_ttft + k * expected_pace for k in range(total_tokens))
    grid = sorted(p for p in points if 0.0 <= p <= horizon)
    delivered_area = expected_area = 0.0
    i, delivered = 0, 0
    for a, b in itertools.pairwise(grid):
        while i < len(token_times) and token_times[i][0] <= a:
            delivered = token_times[i][1]
            i += 1
        e = expected(a)
        expected_area += e * (b - a)
        delivered_area += min(delivered, e) * (b - a)
    return min(1.0, delivered_area / expected_area) if expected_area > 0 else None
