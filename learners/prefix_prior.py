"""A length prior from shared prompt prefixes: what earlier requests that began the same way went on
to generate.

Applications send the same system prompt, template or conversation history again and again; a
prompt's *segments* (runs of tokens, each named by a hash of everything up to it, as the prefix
cache sees them) tell which earlier prompts it shares a beginning with. For a sample of depths
along each finished prompt (1, 2, 4, 8, ... segments and the whole prompt) this keeps running
statistics of ``log1p(output tokens)``; a new prompt's prior is the statistics of the deepest
depth it shares with any of them. Memory is bounded: beyond ``max_entries`` prefixes the least
recently used go first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixStat:
    """What requests sharing a prefix produced: their mean ``log1p(tokens)``, how many there
    were, and how many segments deep the shared prefix is."""

    mean: float
    n: int
    depth: int


def depths(count: int) -> list[int]:
    """The depths (in segments) of a prompt of ``count`` segments that are remembered: powers of
    two, then the whole prompt. A longer shared prefix is found at the deepest of them it covers.

    >>> depths(1), depths(6), depths(8)
    ([1], [1, 2, 4, 6], [1, 2, 4, 8])
    """
    out, d = [], 1
    while d < count:
        out.append(d)
        d *= 2
    return [*out, count] if count else []


class PrefixPrior:
    """``predict_one(segments) -> PrefixStat | None``, ``learn_one(segments, tokens)``.

    >>> prior = PrefixPrior(max_entries=100)
    >>> system = (11, 12, 13, 14)  # a shared system prompt of four segments
    >>> prior.learn_one((*system, 101, 102), 300)
    >>> prior.learn_one((*system, 201), 500)
    >>> got = prior.predict_one((*system, 301, 302, 303))  # a new question after it
    >>> got.depth, got.n, round(math.expm1(got.mean))
    (4, 2, 387)
    >>> prior.predict_one((99, 98)) is None  # shares nothing
    True
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        # segment hash -> [n, mean]: the running mean of log1p(tokens)
        self._stats: OrderedDict[int, list[float]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._stats)

    def predict_one(self, segments: Sequence[int]) -> PrefixStat | None:
        if not segments or not self.max_entries:
            return None
        for depth in reversed(depths(len(segments))):
            got = self._stats.get(segments[depth - 1])
            if got is not None:
                self._stats.move_to_end(segments[depth - 1])
                return PrefixStat(got[1], int(got[0]), depth)
        return None

    def learn_one(self, segments: Sequence[int], tokens: float) -> None:
        if not segments or not self.max_entries or not math.isfinite(tokens) or tokens < 0:
            return
        y = math.log1p(tokens)
        stats = self._stats
        for depth in depths(len(segments)):
            key = segments[depth - 1]
            got = stats.get(key)
            if got is None:
                stats[key] = [1.0, y]
            else:
                got[0] += 1
                got[1] += (y - got[1]) / got[0]
                stats.move_to_end(key)
        while len(stats) > self.max_entries:
            stats.popitem(last=False)
            self.evicted += 1
