"""KV-aware admission: the KV cache each instance will need for the requests steersman has there,
rolled forward over their predicted remaining lengths as they finish and free their blocks.

All requests at an instance decode in lockstep, one token a step. At step ``k`` request ``i`` holds
``c_i + k`` tokens (``c_i`` = prompt + produced) until its remaining length ``r_i`` runs out, then
none. So the footprint peaks just before some request finishes: with the requests ordered by
remaining length, longest first, the peak is ``max_t (c_(1) + ... + c_(t) + t * r_(t))``, plus a
partly used block per request. A newcomer of prompt ``p`` and length ``L`` is judged over its own
lifetime: it adds ``p + r_(t)`` at every end it outlasts (``r_(t) < L``), and has a point of its
own just before it ends. Everything is computed for all instances at once, in a few array
operations. Where vLLM ranks by priority, the requests that rank behind a newcomer (and will
outlast it) do not count against it: vLLM preempts them for it when the cache runs short.

>>> p = Projection(np.array([0, 0, 1]), np.array([100.0, 10.0, 50.0]),
...                np.array([20.0, 30.0, 5.0]), instances=2, block=0)
>>> p.peak().tolist()  # instance 0: 20 + 100 alone (120) beats 20 + 30 + 2 * 10 (70)
[120.0, 55.0]
>>> p.peak_with(prompt=10, length=40).tolist()  # on 0, as it ends: 20 + 40 and 10 + 40
[110.0, 95.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from steersman.control.core.running import InFlight
from steersman.control.core.settings import DispatchSettings


class Projection:
    def __init__(
        self,
        inst: np.ndarray,
        remaining: np.ndarray,
        size: np.ndarray,
        *,
        instances: int,
        block: np.ndarray | float = 16,
    ) -> None:
        """``block`` (per instance, or one for all): a partly used block per request."""
        self.instances = instances
        self.block = np.broadcast_to(np.asarray(block, dtype=float), (instances,))
        order = np.argsort(inst * 1e12 - remaining)  # by instance, longest remaining first
        self.inst = inst[order]
        self.r = remaining[order]
        self.c = size[order]
        self.counts = np.bincount(self.inst, minlength=instances)
        self.starts = np.cumsum(self.counts) - self.counts
        first = np.minimum(self.starts, max(len(order) - 1, 0))
        cum = np.cumsum(self.c)
        before = np.repeat(cum[first] - self.c[first], self.counts) if len(order) else cum
        rank = np.arange(1, len(order) + 1) - np.repeat(self.starts, self.counts)
        self._slack = self.block[self.inst]
        self.points = cum - before + rank * (self.r + self._slack)  # the footprint at each end

    def peak(self) -> np.ndarray:
        """Per instance, the most KV tokens its requests will hold at once (0 when none)."""
        return self._group_max(self.points)

    def peak_with(self, prompt: float, length: float) -> np.ndarray:
        """Per instance, the most its requests will hold while a newcomer of ``prompt`` tokens
        that will produce ``length`` is there: at the ends it outlasts, what they hold plus what
        it holds then; and at its own end. What the others do after it is gone is not its
        doing: a newcomer that will be done before a crowd grows is welcome."""
        outlasts = self.r < length
        grown = np.where(outlasts, self.points + prompt + self.r + self._slack, 0.0)
        ahead = ~outlasts  # the requests still there when the newcomer ends
        count = np.bincount(self.inst, weights=ahead, minlength=self.instances)
        held = np.bincount(self.inst, weights=self.c * ahead, minlength=self.instances)
        own = held + (count + 1) * (length + self.block) + prompt
        return np.maximum(self._group_max(grown), own)

    def _group_max(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.instances)
        some = self.counts > 0
        if some.any():
            out[some] = np.maximum.reduceat(values, self.starts[some])
        return out


class KvRoom:
    """KV admission over one ``schedule`` call: per instance, whether its KV cache has room for a
    request over the predicted horizon, and where only the measured usage says so."""

    def __init__(
        self,
        instances: Sequence[Any],
        flying: InFlight,
        dispatch: DispatchSettings,
        *,
        measured: bool = True,
    ) -> None:
        """``measured`` False: the projection alone admits (steersman's queue is backlogged)."""
        self.flying = flying
        self.outrank = dispatch.outrank
        self.names = [i.name for i in instances]
        self.order = np.array([flying.instance(n) for n in self.names], dtype=np.intp)
        self.capacity = np.array([i.kv_capacity or np.inf for i in instances], dtype=float)
        self.block = np.zeros(len(flying.counts))
        self.block[self.order] = [i.block for i in instances]
        usage = np.array([i.kv_usage or 0.0 for i in instances])
        # Where other schedulers' requests run too (replicas), what the engine holds beyond this
        # scheduler's own is theirs: it is not room.
        n = len(flying)
        own = np.bincount(flying.inst[:n], weights=flying.size(), minlength=len(self.block))
        known = np.isfinite(self.capacity)
        held = usage * np.where(known, self.capacity, 0.0)
        theirs = np.maximum(held - own[self.order], 0.0)
        shared = np.array([i.others > 0 for i in instances])
        self.limit = dispatch.target_fill * self.capacity - np.where(shared, theirs, 0.0)
        # Work-conserving: what the engines measure leaves room, and hardly anything waits there.
        short = [i.waiting <= dispatch.override_waiting for i in instances]
        idle = np.array(short) & np.isfinite(self.capacity)
        self.headroom = (dispatch.target_fill - usage) * self.capacity  # inf: capacity unknown
        spare = (dispatch.override_fill - usage) * self.capacity
        self.spare = np.where(idle & measured, spare, -np.inf)

    def measured_room(self, prompt: int, cached: Sequence[int]) -> list[bool]:
        """Per instance, whether its engine's measured KV usage, with the prompt's new blocks,
        stays under ``target_fill``, whatever the projection says and however long its queue."""
        new = np.maximum(prompt - np.asarray(cached, dtype=float), 0.0)
        return (new <= self.headroom).tolist()

    def decide(
        self,
        prompt: int,
        scheduled: float,
        left: np.ndarray,
        cached: Sequence[int],
        priority: float,
        ranked: Sequence[bool],
    ) -> tuple[list[bool], set]:
        """``cached``: per instance, the prompt tokens it likely holds (they take no new room);
        ``ranked``: per instance, whether vLLM gets the newcomer's ``priority`` there."""
        flying, order = self.flying, self.order
        new = np.maximum(prompt - np.asarray(cached, dtype=float), 0.0)
        length = float(min(scheduled, self.limit.min()))  # an absurd prediction is cut
        n = len(flying)
        size, inst = flying.size(), flying.inst[:n]
        counts = np.array(flying.counts, dtype=float)[order]
        # Every request at its final size at once is the most it can take: if that fits, it fits.
        bound = np.bincount(inst, weights=size + left, minlength=len(self.block))[order]
        bound = bound.astype(float) + (counts + 1) * self.block[order] + new + length
        room = (bound <= self.limit) | (counts == 0)  # an instance with nothing of ours: anything
        if room.all():
            return [True] * len(room), set()
        unsettled = np.zeros(len(self.block), dtype=bool)
        unsettled[order[~room]] = True
        mine = unsettled[inst]  # project where the bound did not settle it
        peaks = Projection(
            inst[mine], left[mine], size[mine], instances=len(self.block), block=self.block
        )
        # The newcomer's new prompt blocks are there at every point of its lifetime: per
        # instance, its peak is the peak of a prompt-less newcomer plus them.
        room |= peaks.peak_with(0.0, length)[order] + new <= self.limit
        behind = ~room & np.asarray(ranked, dtype=bool) & self.outrank
        if behind.any():
            # Where vLLM orders by priority, the requests that rank behind the newcomer are the
            # ones it preempts when the cache runs short: the newcomer needs room only beside
            # those that stay ahead of it, as it would waiting in vLLM's own queue. One that
            # will be done before the newcomer stays too: preempting it would lose its work.
            there = np.zeros(len(self.block), dtype=bool)
            there[order[behind]] = True
            ahead = there[inst] & ((flying.priority[:n] <= priority) | (left <= length))
            peaks = Projection(
                inst[ahead], left[ahead], size[ahead], instances=len(self.block), block=self.block
            )
            room |= behind & (peaks.peak_with(0.0, length)[order] + new <= self.limit)
        forced = ~room & (new <= self.spare)
        return (room | forced).tolist(), {self.names[k] for k in np.flatnonzero(forced)}
