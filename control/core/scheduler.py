"""The scheduling core, in the shape of vLLM's ``Scheduler``: requests are added, ``schedule(
instances, now)`` says which waiting request goes where as plain data, finished requests come
back with their outcome and return the controller's step and the events to record.

No I/O, no clock, no asyncio: the daemon's async shell and the simulator's virtual-time driver
both drive this one object, so the benchmark measures the code that serves.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from steersman.control.core import controller as ctl
from steersman.control.core.policies import POLICIES, DispatchContext, InstanceView
from steersman.control.core.priority import priority_key, vllm_priority
from steersman.control.core.running import InFlight
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.learners.corrector import BASE_KEY
from steersman.learners.latency import StepCoefficients

Admission = Literal["count", "none"]
DEFAULT_STEP = StepCoefficients(0.01, 0.0005, 0.0001)
PREDICTIVE = frozenset({"predictive", "oracle"})  # the policies that read predicted lengths


class QueueFull(Exception):
    """More requests are waiting than ``dispatch.max_queue``."""


class Learner(Protocol):
    """The online length predictor the core consults and teaches (River's shape)."""

    def predict_one(self, x: Mapping[str, Any]) -> float: ...

    def learn_one(self, x: Mapping[str, Any], y: float) -> None: ...

    def reset(self) -> None: ...


@dataclass(frozen=True, slots=True)
class InstanceState:
    """What the shell measures of one instance, handed in with every ``schedule`` call."""

    name: str
    healthy: bool = True
    cap: int = 1 << 30  # most requests steersman keeps there
    kv_usage: float | None = None
    waiting: int = 0  # in the engine's own queue
    step: StepCoefficients = DEFAULT_STEP


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request as the core sees it. ``x`` holds the predictor's features (and the base model's
    prediction under ``base_tokens``); ``max_tokens`` is the client's cap (a prediction above it
    is cut to it, and a request that hits it was cut off); ``true_tokens`` is for the oracle."""

    request_id: str
    prompt_tokens: int
    x: Mapping[str, Any] = field(default_factory=dict)
    request_class: str = "other"
    max_tokens: int | None = None
    true_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Ticket:
    """The prediction a request is scheduled with."""

    corrected: float  # the online corrector's prediction (tokens)
    scheduled: float  # after compensation: what the scheduler plans with
    key: float  # its place in the queue (lower first)
    priority: int  # vLLM's priority


@dataclass(frozen=True, slots=True)
class Assignment:
    request_id: str
    instance: str
    priority: int
    scheduled: float
    policy: str
    mode: ctl.Mode
    running: int  # requests steersman had there before this one


@dataclass(frozen=True, slots=True)
class Outcome:
    actual: int  # tokens generated
    cut_off: bool = False  # ended by its own max_tokens: the true length is at least ``actual``


@dataclass(frozen=True, slots=True)
class Report:
    """What a finished request (or time passing) did to the controller."""

    events: tuple[ctl.Event, ...] = ()
    miss: bool | None = None
    hot_update: bool = False  # the shell asks for an early retraining


@dataclass
class SchedulerStats:
    decisions: int = 0
    fallback_decisions: int = 0
    scored: int = 0
    misses: int = 0
    fallbacks: int = 0
    compensation_changes: int = 0


@dataclass(slots=True)
class _Entry:
    arrival: Arrival
    ticket: Ticket
    instance: str | None = None


class Scheduler:
    """One scheduling core over the instances the shell describes at each call.

    ``admission`` is ``"count"`` (steersman's queue: an instance takes at most its cap) or
    ``"none"`` (every request goes out on arrival, as a plain load balancer does; the caps are
    ignored). ``priorities`` False sends vLLM priority 0 (its FCFS order). ``corrector`` None
    plans with the base prediction in ``x`` as it is.

    >>> s = Scheduler(DispatchSettings(policy="round-robin"), ControllerSettings())
    >>> s.add(Arrival("r1", 10, {"base_tokens": 40.0}), now=0.0).scheduled  # 1.2 * 40 + 10
    58.0
    >>> s.tick(now=0.0).events
    ()
    >>> [(a.request_id, a.instance) for a in s.schedule([InstanceState("a")], now=0.0)]
    [('r1', 'a')]
    >>> s.finish("r1", Outcome(actual=50), now=1.0).miss
    False
    """

    def __init__(
        self,
        dispatch: DispatchSettings,
        controller: ControllerSettings,
        *,
        corrector: Learner | None = None,
        admission: Admission = "count",
        priorities: bool = True,
        origin: float = 0.0,
        state: ctl.ControllerState | None = None,
        default_tokens: float = 128.0,
    ) -> None:
        self.dispatch = dispatch
        self.controller = controller
        self.corrector = corrector
        self.admission = admission
        self.priorities = priorities
        self.origin = origin
        self.state = state or ctl.ControllerState(since=origin)
        self.default_tokens = default_tokens
        self.stats = SchedulerStats()
        self._policy = POLICIES[dispatch.policy]
        self._queue: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._entries: dict[str, _Entry] = {}
        self._running = InFlight()
        self._counter = 0
        self._waiting = 0

    # -- intake ---------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting in steersman's queue."""
        return self._waiting

    def add(self, arrival: Arrival, now: float) -> Ticket:
        """Predict, compensate and queue a request; raises QueueFull beyond ``max_queue``."""
        if arrival.request_id in self._entries:
            raise ValueError(f"request {arrival.request_id!r} is already scheduled")
        if self.admission != "none" and self.depth >= self.dispatch.max_queue:
            raise QueueFull(f"{self.depth} requests already waiting")
        ticket = self._ticket(arrival, now)
        self._entries[arrival.request_id] = _Entry(arrival, ticket)
        self._waiting += 1
        heapq.heappush(self._queue, (ticket.key, next(self._seq), arrival.request_id))
        return ticket

    def _ticket(self, arrival: Arrival, now: float) -> Ticket:
        corrected = self._predict(arrival)
        if self.dispatch.policy == "oracle" and arrival.true_tokens is not None:
            scheduled = corrected  # the truth is not compensated
        else:
            comp = self.state.compensation_for(arrival.request_class, self.controller)
            scheduled = comp.apply(corrected)
        if not math.isfinite(scheduled) or scheduled < 1.0:
            scheduled = max(corrected, 1.0) if math.isfinite(corrected) else self.default_tokens
        if arrival.max_tokens:
            scheduled = min(scheduled, float(arrival.max_tokens))
        ordered = self.priorities and self.state.mode == "NORMAL"
        key = priority_key(scheduled if ordered else 0.0, now, self.dispatch.aging_s)
        priority = vllm_priority(key, self.origin, self.dispatch.aging_s) if self.priorities else 0
        return Ticket(corrected, scheduled, key, priority)

    def _predict(self, arrival: Arrival) -> float:
        if self.dispatch.policy == "oracle" and arrival.true_tokens is not None:
            return float(arrival.true_tokens)
        if self.corrector is not None:
            value = self.corrector.predict_one(arrival.x)
        else:
            value = arrival.x.get(BASE_KEY, self.default_tokens)
        return float(value) if _finite(value) else self.default_tokens

    # -- decisions ------------------------------------------------------------------------------

    def schedule(self, instances: Sequence[InstanceState], now: float) -> list[Assignment]:
        """Hand waiting requests to instances, best key first, while one takes the head. The
        mode is the controller's as of the last ``tick`` or ``finish``: a shell ticks first."""
        if not self._queue:
            return []
        fallback = self.state.mode == "FALLBACK" and self.dispatch.policy in PREDICTIVE
        policy = POLICIES[self.dispatch.fallback_policy] if fallback else self._policy
        flying = self._running
        order = [flying.instance(i.name) for i in instances]
        views = [self._view(i) for i in instances]
        out: list[Assignment] = []
        while self._queue:
            _, _, rid = self._queue[0]
            entry = self._entries.get(rid)
            if entry is None or entry.instance is not None:
                heapq.heappop(self._queue)  # aborted, or requeued with a fresher heap entry
                continue
            a = entry.arrival
            decision = policy(
                DispatchContext(
                    views,
                    rid,
                    entry.ticket.scheduled,
                    a.prompt_tokens,
                    now,
                    self._counter,
                    true_tokens=a.true_tokens,
                    impact_weight=self.dispatch.impact_weight,
                    shared=lambda length: flying.shared(length)[order],
                )
            )
            if decision.instance is None:
                break
            heapq.heappop(self._queue)
            self._waiting -= 1
            self._counter += 1
            self.stats.decisions += 1
            self.stats.fallback_decisions += fallback
            name = decision.instance
            out.append(
                Assignment(
                    rid,
                    name,
                    entry.ticket.priority,
                    entry.ticket.scheduled,
                    decision.policy,
                    self.state.mode,
                    flying.count(name),
                )
            )
            entry.instance = name
            flying.add(rid, name, entry.ticket.scheduled, a.prompt_tokens)
            k = next(k for k, v in enumerate(views) if v.name == name)
            views[k] = self._view(instances[k])
        return out

    def _view(self, instance: InstanceState) -> InstanceView:
        c = instance.step
        return InstanceView(
            instance.name,
            in_flight=self._running.count(instance.name),
            cap=1 << 30 if self.admission == "none" else instance.cap,
            healthy=instance.healthy,
            kv_usage=instance.kv_usage,
            waiting=instance.waiting,
            step_base_s=c.base_s,
            step_per_seq_s=c.per_seq_s,
            prefill_s_per_token=c.prefill_s_per_token,
        )

    # -- progress and outcomes ------------------------------------------------------------------

    def progress(self, request_id: str, produced: int) -> None:
        """Tokens a running request has produced so far (its remaining length shrinks)."""
        entry = self._entries.get(request_id)
        if entry is not None and entry.instance is not None:
            self._running.progress(request_id, produced)

    def requeue(self, request_id: str) -> None:
        """Its instance failed before it started: it waits again with its key, to go elsewhere."""
        entry = self._entries.get(request_id)
        if entry is None or entry.instance is None:
            return
        self._running.remove(request_id)
        entry.instance = None
        self._waiting += 1
        heapq.heappush(self._queue, (entry.ticket.key, next(self._seq), request_id))

    def abort(self, request_id: str) -> None:
        """The request is gone (client left, timed out, refused): nothing is learned from it."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return
        if entry.instance is not None:
            self._running.remove(request_id)
        else:
            self._waiting -= 1  # its heap entry is dropped when it reaches the head

    def finish(self, request_id: str, outcome: Outcome, now: float) -> Report:
        """A request ended with ``outcome``: the corrector learns, the controller observes."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return Report()
        if entry.instance is not None:
            self._running.remove(request_id)
        else:
            self._waiting -= 1
        a, t = entry.arrival, entry.ticket
        if self.corrector is not None:
            self.corrector.learn_one(a.x, outcome.actual)
        if self.dispatch.policy == "oracle":
            return Report()  # the truth is never a miss, and never falls back
        censored = a.max_tokens if outcome.cut_off else None
        observed = ctl.Outcome(a.request_class, t.scheduled, t.corrected, outcome.actual, censored)
        return self._apply(ctl.observe(self.state, observed, now, self.controller))

    def tick(self, now: float) -> Report:
        """Time passing: FALLBACK ends after ``fallback_s`` even with no traffic."""
        step = ctl.tick(self.state, now, self.controller)
        self.state = step.state
        return Report(step.events)

    def _apply(self, step: ctl.Step) -> Report:
        self.state = step.state
        s = self.stats
        if step.miss is not None:
            s.scored += 1
            s.misses += step.miss
        s.compensation_changes += sum(1 for e in step.events if e.kind == "compensation")
        if step.hot_update:
            s.fallbacks += 1
            if self.corrector is not None:
                self.corrector.reset()
        return Report(step.events, step.miss, step.hot_update)

    # -- state ----------------------------------------------------------------------------------

    def in_flight(self, instance: str) -> int:
        return self._running.count(instance)

    def running(self, instance: str) -> dict[str, int]:
        """The requests steersman has at ``instance``, with the tokens each produced so far."""
        return self._running.produced_of(instance)

    def scheduled(self, request_id: str) -> Ticket | None:
        entry = self._entries.get(request_id)
        return None if entry is None else entry.ticket


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
