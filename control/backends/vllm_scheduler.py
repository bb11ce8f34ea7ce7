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

Requests that carry their reader's expectation (``steersman_expected_ttft_s`` and
``steersman_expected_pace_s``: steersman sends them with streamed QoE on) are also served for
their streams' quality of experience: while they wait and the KV cache is nearly full or every
seat taken, the rule of ``steersman.control.core.qoe_rule`` (the simulator's too) admits the
waiting ones that gain most per KV block first and, with ``max_pauses``, pauses running streams
far ahead of their readers by vLLM's own preemption; a paused stream waits behind the queue
until the rule readmits it or the pressure ends. Requests without an expectation keep vLLM's
order.

vLLM runs the asynchronous scheduler by default (the CPU platform turns it off): this class
extends whichever one the engine would have chosen, so asynchronous scheduling is kept.
It needs only vllm, pydantic (a vllm dependency) and the standard library, so the vLLM
environment imports it without steersman's dependencies (``pip install --no-deps`` of this
project there is enough).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from steersman.control.core.qoe_rule import (
    Stream,
    decide,
    expectation,
    knobs_of,
    under_pressure,
)
from steersman.control.core.settings import QoeSettings

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
    extra = _extra(request)
    predicted = extra.get(PREDICTED)
    if isinstance(predicted, bool) or not isinstance(predicted, int | float):
        return None
    if not math.isfinite(predicted) or predicted <= 0:
        return None
    aging = extra.get(AGING, DEFAULT_AGING_S)
    if isinstance(aging, bool) or not isinstance(aging, int | float) or not aging > 0:
        aging = DEFAULT_AGING_S
    return float(predicted), float(aging)


log = logging.getLogger(__name__)
FIRST = -(2**40)  # admitted by the QoE rule: ahead of every steered priority
PARKED = 2**40  # paused by it: behind them


class _Readers:
    """What the QoE rule remembers between engine steps."""

    def __init__(self) -> None:
        self.rule = QoeSettings(enabled=True)
        self.started: dict[str, float] = {}  # request id -> when it last started running
        self.parked: dict[str, int] = {}  # paused by the rule -> its priority before
        self.boosted: dict[str, int] = {}  # admitted by the rule -> its priority before
        self.step_s = 0.05  # an engine step, as observed between schedule() calls
        self.last: float | None = None
        self.next_at = 0.0
        self.knobs: dict[str, Any] = {}
        self.warned = False

    def configure(self, knobs: dict[str, Any]) -> None:
        """The rule's knobs as steersman's settings send them; ones that do not validate are
        ignored (the previous knobs stay), with one warning."""
        if not knobs or knobs == self.knobs:
            return
        try:
            self.rule = QoeSettings(enabled=True, **knobs)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            if not self.warned:
                log.warning("steersman: QoE knobs %s ignored: %s", knobs, exc)
                self.warned = True
        self.knobs = knobs

    def tick(self, now: float, busy: bool) -> None:
        if busy and self.last is not None and 0 < now - self.last < 5.0:
            self.step_s += 0.2 * (now - self.last - self.step_s)
        self.last = now if busy else None


class _Steered:
    """The behaviour, on top of vLLM's Scheduler or AsyncScheduler."""

    running: list[Any]
    waiting: Any
    policy: SchedulingPolicy
    block_size: int
    max_num_running_reqs: int
    kv_cache_manager: Any
    scheduler_config: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._readers = _Readers()

    def add_request(self, request: Any) -> None:
        self._steer(request, time.time())  # before it enters the heap
        self._readers.configure(knobs_of(_extra(request)))
        super().add_request(request)  # type: ignore[misc]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = time.time()
        if self.policy == SchedulingPolicy.PRIORITY:
            for request in self.running:
                self._steer(request, now)
            heap = getattr(self.waiting, "_heap", None)
            if heap:
                for request in heap:
                    self._steer(request, now)
                heapq.heapify(heap)
        self._serve_readers(now)
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def _steer(self, request: Any, now: float) -> None:
        readers = getattr(self, "_readers", None)
        if readers is not None and request.request_id in readers.parked:
            return  # behind the queue until the QoE rule readmits it
        found = _prediction(request)
        if found is None:
            return
        predicted, aging = found
        age = max(now - request.arrival_time, 0.0)
        request.priority = steered_priority(predicted, request.num_output_tokens, age, aging)

    # -- streamed QoE (core.qoe_rule) ----------------------------------------------------------

    def _serve_readers(self, now: float) -> None:
        readers = self._readers
        readers.tick(now, bool(self.running))
        started = readers.started
        readers.started = {r.request_id: started.get(r.request_id, now) for r in self.running}
        for request in self.running:
            if request.request_id in readers.boosted:  # admitted: its own priority again
                request.priority = readers.boosted.pop(request.request_id)
        queue = getattr(self.waiting, "_heap", None) or self.waiting  # the heap unsorted: cheaper
        waiting = [r for r in queue if expectation(_extra(r))]
        if not waiting and not readers.parked:
            return
        usage = self.kv_cache_manager.usage
        pressed = under_pressure(
            usage, len(self.running), len(waiting), self.max_num_running_reqs, readers.rule
        )
        if not pressed:
            if readers.parked:
                self._requeue(self._release_parked())
            return
        if now < readers.next_at:
            return
        readers.next_at = now + readers.rule.interval_s
        live = getattr(self, "requests", {})  # vLLM's every unfinished request, by id
        for held in (readers.parked, readers.boosted):
            for rid in [rid for rid in held if rid not in live]:  # finished or aborted
                del held[rid]
        streams = [self._stream(r, True, now) for r in self.running if expectation(_extra(r))]
        streams += [self._stream(r, False, now) for r in waiting]
        free = self.kv_cache_manager.block_pool.get_num_free_blocks() - len(self.running)
        chunk = int(getattr(self.scheduler_config, "max_num_batched_tokens", 2048) or 2048)
        d = decide(streams, free, self.max_num_running_reqs, readers.step_s, chunk, readers.rule)
        paused = [r for r in d.pause if self._pause(r, now)]
        if paused or d.admit:
            for k, request in enumerate(d.admit):
                original = readers.parked.pop(request.request_id, request.priority)
                readers.boosted[request.request_id] = original
                request.priority = FIRST + k
            self._requeue(list(d.admit), first=True)

    def _stream(self, request: Any, running: bool, now: float) -> Stream:
        ttft, pace = expectation(_extra(request)) or (1.0, 0.2)
        found = _prediction(request)
        produced = request.num_output_tokens
        left = predicted_remaining(found[0], produced) if found else None
        tokens = request.num_tokens
        started = self._readers.started.get(request.request_id) if running else None
        return Stream(
            request,
            running,
            -(-(request.num_computed_tokens if running else tokens + 1) // self.block_size),
            max(now - request.arrival_time, 0.0),
            produced,
            left,
            tokens if running else tokens - request.num_computed_tokens,
            ttft,
            pace,
            since_start_s=None if started is None else now - started,
            pauses=request.num_preemptions,
        )

    def _pause(self, request: Any, now: float) -> bool:
        """Preempt a running stream as vLLM itself does, and park it behind the queue."""
        if request.status != RequestStatus.RUNNING:
            return False
        if not self._request_blocks_can_be_freed(request):  # type: ignore[attr-defined]
            return False  # an asynchronous KV transfer still writes them
        self._readers.parked[request.request_id] = request.priority
        request.priority = PARKED
        self.running.remove(request)
        self._preempt_request(request, now)  # type: ignore[attr-defined]
        self._requeue([request])
        return True

    def _release_parked(self) -> list[Any]:
        parked = self._readers.parked
        out = [r for r in self.waiting if r.request_id in parked]
        for request in out:
            request.priority = parked.pop(request.request_id)
        parked.clear()
        return out

    def _requeue(self, requests: list[Any], first: bool = False) -> None:
        """Put requests back in the waiting queue at their new place: the heap reordered
        (priority policy), or the front (``first``) or the back of the line (FCFS)."""
        if not requests:
            return
        heap = getattr(self.waiting, "_heap", None)
        if heap is not None:
            heapq.heapify(heap)
            return
        self.waiting.remove_requests(requests)
        if first:
            self.waiting.prepend_requests(reversed(requests))  # it prepends them reversed
        else:
            for request in requests:
                self.waiting.add_request(request)


def _extra(request: Any) -> dict[str, Any]:
    params = getattr(request, "sampling_params", None)
    return getattr(params, "extra_args", None) or {}


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
