"""KV-aware admission: the KV cache each instance will need for the requests steersman has there,
rolled forward over their predicted remaining lengths as they finish and free their blocks.

All requests at an instance decode in lockstep, one token a step. At step ``k`` request ``i`` holds
``c_i + k`` tokens (``c_i`` = prompt + produced) until its remaining length ``r_i`` runs out, then
none. So the footprint peaks just before some request finishes: with the requests ordered by
remaining length, longest first, the peak is ``max_t (c_(1) + ... + c_(t) + t * r_(t))``, plus a
partly used block per request. A newcomer of prompt ``p`` and length ``L`` adds ``p + r_(t)`` at
every point where it is still there (``r_(t) < L``), and a point of its own just before it ends.
Everything is computed for all instances at once, in a few array operations.

>>> p = Projection(np.array([0, 0, 1]), np.array([100.0, 10.0, 50.0]),
...                np.array([20.0, 30.0, 5.0]), instances=2, block=0)
>>> p.peak().tolist()  # instance 0: 20 + 100 alone (120) beats 20 + 30 + 2 * 10 (70)
[120.0, 55.0]
>>> p.peak_with(prompt=10, length=40).tolist()  # on 1: 5 + 40 and 10 + 40, as the newcomer ends
[120.0, 95.0]
"""

from __future__ import annotations

import numpy as np


class Projection:
    def __init__(
        self,
        inst: np.ndarray,
        remaining: np.ndarray,
        size: np.ndarray,
        *,
        instances: int,
        block: int = 16,
    ) -> None:
        self.instances = instances
        self.block = block
        order = np.lexsort((-remaining, inst))  # by instance, longest remaining first
        self.inst = inst[order]
        self.r = remaining[order]
        c = size[order]
        self.starts = np.searchsorted(self.inst, np.arange(instances))
        rank = np.arange(len(order)) - self.starts[self.inst] + 1
        cum = np.cumsum(c)
        before = np.concatenate(([0.0], cum))[self.starts][self.inst]  # sum before the group
        self.c = c
        self.points = cum - before + rank * (self.r + block)  # the footprint at each finish

    def peak(self) -> np.ndarray:
        """Per instance, the most KV tokens its requests will hold at once (0 when none)."""
        return self._group_max(self.points)

    def peak_with(self, prompt: float, length: float) -> np.ndarray:
        """Per instance, the peak with a newcomer of ``prompt`` tokens that will produce
        ``length``: at the points it outlasts it adds what it holds then; and its own end."""
        outlasts = self.r < length
        grown = np.where(outlasts, self.points + prompt + self.r + self.block, self.points)
        ahead = ~outlasts  # the requests still there when the newcomer ends
        count = np.bincount(self.inst, weights=ahead, minlength=self.instances)
        held = np.bincount(self.inst, weights=self.c * ahead, minlength=self.instances)
        own = held + (count + 1) * (length + self.block) + prompt
        return np.maximum(self._group_max(grown), own)

    def _group_max(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.instances)
        if len(values):
            np.maximum.at(out, self.inst, values)
        return out
