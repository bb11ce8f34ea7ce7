"""A vLLM scheduler that orders by steersman's predictions: the one module that imports vllm.

Start the server with ``--scheduling-policy priority --scheduler-cls
steersman.control.backends.vllm_scheduler.SteersmanScheduler``. Each request that carries
``vllm_xargs.steersman_predicted_tokens`` gets, before every engine step, the priority
``10 * log2(1 + predicted remaining) - 10 * age / aging``, waiting and running alike: the waiting
queue goes shortest predicted remaining first, with aging so that long requests do not starve,
and when KV blocks run out vLLM's own victim choice (the running request with the largest
priority) preempts the one that order puts last, the longest predicted remaining length among
the youngest, rather than the newest. One order for both, so that a victim is never the next to
be readmitted. Requests without a prediction keep the priority they were sent with.

vLLM runs the asynchronous scheduler by default (the CPU platform turns it off): this class
extends whichever one the engine would have chosen, so asynchronous scheduling is kept.
It needs only vllm and the standard library, so the vLLM environment imports it without
steersman's dependencies (``pip install --no-deps`` of this project there is enough).
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler

PREDICTED = "steersman_predicted_tokens"
AGING = "steersman_aging_s"
DEFAULT_AGING_S = 2.0


def predicted_remaining(predicted: float, produced: int) -> float:
    """What is left of a prediction: never less than a tenth of it, nor one token (a request
    past its prediction is not done).

    >>> predicted_remaining(100, 30), predicted_remaining(100, 250)
    (70.0, 10.0)
    """
    return max(float(predicted) - produced, 0.1 * predicted, 1.0)


def steered_priority(predicted: float, produced: int, waited_s: float, aging_s: float) -> int:
    """The priority a request gets (lower first): shortest predicted remaining first; waiting
    ``aging_s`` longer outranks a prediction twice as long.

    >>> steered_priority(100, 0, 0.0, 1.0) < steered_priority(1000, 0, 0.0, 1.0)
    True
    >>> steered_priority(1000, 0, 5.0, 1.0) < steered_priority(100, 0, 0.0, 1.0)
    True
    """
    size = math.log2(1.0 + predicted_remaining(predicted, produced))
    return round(10 * (size - waited_s / aging_s))


def _prediction(request: Any) -> tuple[float, float] | None:
    extra = getattr(request.sampling_params, "extra_args", None) or {}
    predicted = extra.get(PREDICTED)
    if isinstance(predicted, bool) or not isinstance(predicted, int | float):
        return None
    if not math.isfinite(predicted) or predicted <= 0:
        return None
    aging = extra.get(AGING, DEFAULT_AGING_S)
    if isinstance(aging, bool) or not isinstance(aging, int | float) or not aging > 0:
        aging = DEFAULT_AGING_S
    return float(predicted), float(aging)


class _Steered:
    """The behaviour, on top of vLLM's Scheduler or AsyncScheduler."""

    running: list[Any]
    waiting: Any
    policy: SchedulingPolicy

    def add_request(self, request: Any) -> None:
        self._steer(request, time.time())  # before it enters the heap
        super().add_request(request)  # type: ignore[misc]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.policy == SchedulingPolicy.PRIORITY:
            now = time.time()
            for request in self.running:
                self._steer(request, now)
            heap = getattr(self.waiting, "_heap", None)
            if heap:
                for request in heap:
                    self._steer(request, now)
                heapq.heapify(heap)
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    @staticmethod
    def _steer(request: Any, now: float) -> None:
        found = _prediction(request)
        if found is None:
            return
        predicted, aging = found
        age = max(now - request.arrival_time, 0.0)
        request.priority = steered_priority(predicted, request.num_output_tokens, age, aging)


class _SteeredSync(_Steered, Scheduler):
    pass


class _SteeredAsync(_Steered, AsyncScheduler):
    pass


class SteersmanScheduler:
    """What ``--scheduler-cls`` names: builds the steered version of the scheduler class the
    engine would have used (asynchronous when ``async_scheduling`` is on)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("vllm_config", args[0] if args else None)
        asynchronous = bool(getattr(config.scheduler_config, "async_scheduling", False))
        concrete = _SteeredAsync if asynchronous else _SteeredSync
        instance = concrete.__new__(concrete)
        instance.__init__(*args, **kwargs)  # not a SteersmanScheduler: Python will not call it
        return instance
