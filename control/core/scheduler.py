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
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from steersman.control.core import controller as ctl
from steersman.control.core.admission import KvRoom
from steersman.control.core.messages import (
    Arrival,
    Assignment,
    InstanceState,
    Learner,
    Outcome,
    QueueFull,
    Report,
    SchedulerStats,
    Ticket,
)
from steersman.control.core.policies import POLICIES, DispatchContext, InstanceView
from steersman.control.core.prefix import PrefixIndex, block_hashes
from steersman.control.core.priority import TypicalLength, priority_key, vllm_priority
from steersman.control.core.running import InFlight
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.learners.corrector import BASE_KEY, PREFIX_KEY, VECTOR_KEY, Band
from steersman.learners.metrics import InOrder, RankWindow
from steersman.learners.remaining import RemainingLength, remaining

Admission = Literal["kv", "count", "none"]
PREDICTIVE = frozenset({"predictive", "oracle"})  # the policies that read predicted lengths
__all__ = [  # the core's data, importable from here with the core itself
    "Arrival",
    "Assignment",
    "InstanceState",
    "Learner",
    "Outcome",
    "QueueFull",
    "Report",
    "Scheduler",
    "SchedulerStats",
    "Ticket",
]


@dataclass(slots=True)
class _Entry:
    arrival: Arrival
    ticket: Ticket
    added_at: float
    x: Mapping[str, Any]  # what the corrector predicted from (and learns from at the end)
    instance: str | None = None
    seq: int = 0  # arrival order


class Scheduler:
    """One scheduling core over the instances the shell describes at each call.

    ``dispatch.admission`` decides when a waiting request may go to an instance: ``kv`` (while
    the KV cache its requests there will need stays under ``target_fill``, and within its cap),
    ``count`` (within its cap) or ``none`` (at once, as a plain load balancer sends it; caps are
    ignored). ``priorities`` False sends vLLM priority 0 (its FCFS order). ``corrector`` None
    plans with the base prediction in ``x`` as it is. ``remaining`` learns how actual lengths
    compare with scheduled ones, to refine what is left of a request while it decodes.

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
        remaining: RemainingLength | None = None,
        priorities: bool = True,
        origin: float = 0.0,
        state: ctl.ControllerState | None = None,
        default_tokens: float = 128.0,
    ) -> None:
        self.dispatch = dispatch
        self.controller = controller
        self.corrector = corrector
        self.remaining = remaining if remaining is not None else RemainingLength()
        self.priorities = priorities
        self.origin = origin
        self.state = state or ctl.ControllerState(since=origin)
        self.default_tokens = default_tokens
        self.stats = SchedulerStats()
        # How the length model orders requests (a corrector calibrates bands around anything):
        # over the outcomes since FALLBACK began, when it did, so that requests predicted before
        # (long ones finish late, and weigh most) cannot vouch for the model as it is now.
        self.rank = RankWindow(controller.rank_window)
        self._ranked = InOrder(self._rank, patience=50 * controller.rank_window)
        self._arrivals = itertools.count()
        self._policy = POLICIES[dispatch.policy]
        self._queue: list[tuple[float, int, str]] = []
        self._ages: list[tuple[float, int, str]] = []  # the waiting requests, oldest first
        self._seq = itertools.count()
        self._entries: dict[str, _Entry] = {}
        self._running = InFlight()
        self._prefixes: dict[str, PrefixIndex] = {}  # what each instance likely holds cached
        self._counter = 0
        self._waiting = 0
        self._typical = TypicalLength(default_tokens)

    # -- intake ---------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Requests waiting in steersman's queue."""
        return self._waiting

    def add(self, arrival: Arrival, now: float) -> Ticket:
        """Predict, compensate and queue a request; raises QueueFull beyond ``max_queue``."""
        if arrival.request_id in self._entries:
            raise ValueError(f"request {arrival.request_id!r} is already scheduled")
        if self.dispatch.admission != "none" and self.depth >= self.dispatch.max_queue:
            raise QueueFull(f"{self.depth} requests already waiting")
        x = self._features(arrival)
        ticket = self._ticket(arrival, x, now)
        entry = _Entry(arrival, ticket, now, x, seq=next(self._arrivals))
        self._entries[arrival.request_id] = entry
        self._waiting += 1
        heapq.heappush(self._queue, (ticket.key, next(self._seq), arrival.request_id))
        heapq.heappush(self._ages, (now, next(self._seq), arrival.request_id))
        return ticket

    def _features(self, arrival: Arrival) -> Mapping[str, Any]:
        """The request's features with its prompt's segments, and what the corrector's priors
        (shared prefixes, similar prompts) know of them, as of its arrival."""
        if self.corrector is None or not (arrival.prefix or VECTOR_KEY in arrival.x):
            return arrival.x
        x = {**arrival.x, PREFIX_KEY: arrival.prefix} if arrival.prefix else arrival.x
        return self.corrector.with_prior(x, arrival.segment_tokens)

    def _ticket(self, arrival: Arrival, x: Mapping[str, Any], now: float) -> Ticket:
        """The band is the corrector's (calibrated: misses are judged against it); the scheduled
        length is the point of it that compensation picks."""
        band = self._predict(arrival, x)
        corrected = band.mid if math.isfinite(band.mid) else self.default_tokens
        cap = float(arrival.max_tokens) if arrival.max_tokens else math.inf
        low, high = (min(max(v, 1.0), cap) if math.isfinite(v) else corrected
                     for v in (band.lo, band.hi))  # fmt: skip
        if self.dispatch.policy == "oracle" and arrival.true_tokens is not None:
            scheduled = corrected  # the truth is not compensated
        else:
            comp = self.state.compensation_for(arrival.request_class, self.controller)
            scheduled = comp.apply(corrected)
        if not math.isfinite(scheduled):
            scheduled = corrected
        if high > low:  # a band to clip into (without a corrector there is only the point)
            scheduled = min(max(scheduled, low), high)
        scheduled = min(max(scheduled, 1.0), cap)
        ordered = self.priorities and self.state.mode == "NORMAL"
        aging = self.dispatch.aging_s
        ttft = arrival.expected_ttft_s
        due = now + ttft if _finite(ttft) and ttft > 0 else now
        typical = self._typical.get() if self.dispatch.unordered_size == "typical" else 0.0
        key = priority_key(scheduled if ordered else typical, due, aging)
        priority = vllm_priority(key, self.origin, aging) if self.priorities else 0
        fcfs = vllm_priority(priority_key(typical, now, aging), self.origin, aging)
        self._typical.update(scheduled)
        return Ticket(
            corrected,
            scheduled,
            key,
            priority,
            min(low, scheduled),
            max(high, scheduled),
            fcfs if self.priorities else 0,
        )

    def _predict(self, arrival: Arrival, x: Mapping[str, Any]) -> Band:
        if self.dispatch.policy == "oracle" and arrival.true_tokens is not None:
            truth = float(arrival.true_tokens)
            return Band(truth, truth, truth)
        if self.corrector is not None:
            return self.corrector.predict_band(x)
        value = arrival.x.get(BASE_KEY, self.default_tokens)
        value = float(value) if _finite(value) else self.default_tokens
        return Band(value, value, value)

    # -- decisions ------------------------------------------------------------------------------

    def schedule(self, instances: Sequence[InstanceState], now: float) -> list[Assignment]:
        """Hand waiting requests to instances, best key first, while one takes the head; past a
        head the projection holds, the requests that have waited ``max_hold_s``, oldest first.
        The mode is the controller's as of the last ``tick`` or ``finish``: a shell ticks
        first."""
        if not self._queue:
            return []
        oldest = self._oldest()
        backlogged = oldest is not None and now - oldest.added_at > self.dispatch.backlog_s
        # Inside vLLM, order by length only where it pays: in a compute-bound queue below
        # saturation it buys ~1% of the mean and costs the TTFT tail (FCFS bounds the wait).
        rule = self.dispatch.engine_order
        ordered = self.priorities and self.state.mode == "NORMAL"
        ordered = ordered and (rule != "backlog" or backlogged)
        # Or only to an instance whose memory binds: there the order decides who holds the KV
        # cache and who is preempted; elsewhere it only passes long requests over for prefill.
        # steersman's class ranks every request itself, so it gets every prediction.
        by_usage = ordered and rule == "pressure" and not backlogged
        fallback = self.state.mode == "FALLBACK" and self.dispatch.policy in PREDICTIVE
        policy = POLICIES[self.dispatch.fallback_policy] if fallback else self._policy
        flying = self._running
        # In FALLBACK the predictions are not trusted: no projection of them holds anything back.
        projected = self.dispatch.admission == "kv" and not fallback
        kv = (
            KvRoom(instances, self._running, self.dispatch, measured=not backlogged)
            if projected
            else None
        )
        # Where vLLM gets a request's length-ordered priority rather than its arrival order.
        ranked = [
            ordered
            and not (by_usage and not i.ranks and (i.kv_usage or 0.0) < self.dispatch.pressure_kv)
            for i in instances
        ]
        order = np.array([flying.instance(i.name) for i in instances], dtype=np.intp)
        backlog = flying.prefilling()
        views = [self._view(i, backlog) for i in instances]
        out: list[Assignment] = []
        held = False  # the best key is held back: only overdue requests may go now
        while (entry := self._next(now, held)) is not None:
            rid, a, t = entry.arrival.request_id, entry.arrival, entry.ticket
            left = flying.remaining(self.remaining)
            blocks = [self._blocks(a, i) for i in instances]
            cached = [self._cached(i, b) for i, b in zip(instances, blocks, strict=True)]
            offered, forced = views, set()
            held_long = now - entry.added_at > self.dispatch.max_hold_s
            room = None
            if kv is not None and not held_long:
                expected = self._expected(a, t)
                room, forced = kv.decide(
                    a.prompt_tokens, expected, left, cached, t.priority, ranked
                )
            elif held and not self._overdue(entry, now):
                # past a held best key, only where the engine measures room for it
                room = kv.measured_room(a.prompt_tokens, cached)
            if room is not None:
                offered = [
                    v if ok else replace(v, room=False) for v, ok in zip(views, room, strict=True)
                ]
            if a.candidates is not None:  # a gateway's subset: the others are not offered
                offered = [v if v.name in a.candidates else replace(v, room=False) for v in offered]
            if any(cached):
                offered = [
                    replace(v, cached_tokens=c) if c else v
                    for v, c in zip(offered, cached, strict=True)
                ]
            decision = policy(
                DispatchContext(
                    offered,
                    rid,
                    t.scheduled,
                    a.prompt_tokens,
                    now,
                    self._counter,
                    true_tokens=a.true_tokens,
                    impact_weight=self.dispatch.impact_weight,
                    ttft_weight=self.dispatch.ttft_weight,
                    load_margin=self.dispatch.load_margin,
                    shared=lambda length, left=left: flying.shared(length, left)[order],
                )
            )
            if decision.instance is None:
                if kv is None or held:
                    break
                self.stats.kv_held += any(v.free for v in views)
                held = True
                continue
            self._waiting -= 1  # its heap entries are dropped when they reach the top
            self._counter += 1
            self.stats.decisions += 1
            self.stats.fallback_decisions += fallback
            name = decision.instance
            self.stats.kv_overrides += name in forced
            k = next(k for k, v in enumerate(views) if v.name == name)
            here = ranked[k]
            sent = t.priority if here else t.arrival_priority
            out.append(
                Assignment(
                    rid, name, sent, t.scheduled,
                    decision.policy, self.state.mode, flying.count(name), cached[k], here,
                )
            )  # fmt: skip
            entry.instance = name
            flying.add(rid, name, t.scheduled, a.prompt_tokens, a.request_class, sent)
            if blocks[k]:
                self._prefixes[name].touch(blocks[k])
            views[k] = self._view(instances[k])
        return out

    def _oldest(self) -> _Entry | None:
        """The request that has waited longest in steersman's queue (None if none)."""
        ages = self._ages
        if not self._waiting:
            ages.clear()
            return None
        while ages:
            entry = self._entries.get(ages[0][2])
            if entry is not None and entry.instance is None:
                return entry
            heapq.heappop(ages)
        return None

    def _overdue(self, entry: _Entry, now: float) -> bool:
        """Whether ``entry`` has waited past ``max_wait_s``: then it goes out without room."""
        wait = self.dispatch.max_wait_s
        return wait is not None and now - entry.added_at > wait

    def _next(self, now: float, held: bool) -> _Entry | None:
        """The waiting request to place next: the best key; once the projection holds that back
        (``held``), the oldest request if it has waited ``max_hold_s`` (``schedule`` offers it
        the instances that measure room for it; past ``max_wait_s``, every one). The best key is
        often a newcomer: behind it, a request predicted long would otherwise wait for aging to
        lift it to the head, for seconds."""
        if held:
            oldest = self._oldest()
            overdue = oldest is not None and now - oldest.added_at > self.dispatch.max_hold_s
            return oldest if overdue else None
        while self._queue:
            entry = self._entries.get(self._queue[0][2])
            if entry is not None and entry.instance is None:
                return entry
            heapq.heappop(self._queue)  # placed, aborted, or requeued with a fresher entry
        return None

    def _expected(self, a: Arrival, t: Ticket) -> float:
        """The length a waiting request is expected to run to: its scheduled length corrected by
        how actual lengths of its class have compared with scheduled ones (compensation aims
        high on purpose; the KV footprint wants the expectation)."""
        table = self.remaining.table(a.request_class)
        return float(remaining(np.array([t.scheduled]), np.zeros(1), table)[0])

    def _blocks(self, a: Arrival, instance: InstanceState) -> tuple[int, ...]:
        if not a.prefix:
            return ()
        return block_hashes(a.prefix, a.segment_tokens, a.prompt_tokens, instance.block)

    def _cached(self, instance: InstanceState, blocks: tuple[int, ...]) -> int:
        """Prompt tokens the instance likely holds cached: the leading blocks of the prompt among
        those of the prompts sent there, as many as its KV cache holds remembered."""
        if not blocks:
            return 0
        capacity = (instance.kv_capacity or 1 << 22) // max(instance.block, 1)
        index = self._prefixes.get(instance.name)
        if index is None:
            index = self._prefixes[instance.name] = PrefixIndex(capacity)
        elif index.capacity != capacity:
            index.resize(capacity)
        return index.cached(blocks) * instance.block

    def _view(self, instance: InstanceState, backlog: np.ndarray | None = None) -> InstanceView:
        c = instance.step
        flying = self._running
        k = flying.instance(instance.name)
        backlog = flying.prefilling() if backlog is None else backlog
        return InstanceView(
            instance.name,
            in_flight=flying.count(instance.name) + instance.others,
            cap=1 << 30 if self.dispatch.admission == "none" else instance.cap,
            healthy=instance.healthy,
            kv_usage=instance.kv_usage,
            waiting=instance.waiting,
            step_base_s=c.base_s,
            step_per_seq_s=c.per_seq_s,
            prefill_s_per_token=c.prefill_s_per_token,
            prefill_backlog=float(backlog[k]) if k < len(backlog) else 0.0,
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
        heapq.heappush(self._ages, (entry.added_at, next(self._seq), request_id))

    def abort(self, request_id: str) -> None:
        """The request is gone (client left, timed out, refused): nothing is learned from it."""
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return
        self._ranked.put(entry.seq, None)
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
            self.corrector.learn_one(entry.x, outcome.actual)
        base = a.x.get(BASE_KEY)
        scored = _finite(base) and not outcome.cut_off
        self._ranked.put(entry.seq, (entry.added_at, base, outcome.actual) if scored else None)
        if not outcome.cut_off:  # a cut-off length says only "at least"
            self.remaining.learn_one(
                {"request_class": a.request_class, "scheduled": t.scheduled}, outcome.actual
            )
        if self.dispatch.policy == "oracle":
            return Report()  # the truth is never a miss, and never falls back
        censored = a.max_tokens if outcome.cut_off else None
        observed = ctl.Finished(
            a.request_class,
            t.scheduled,
            t.corrected,
            outcome.actual,
            censored,
            (t.low, t.high),
            rank=self.rank.get(),
            modelled=_finite(base),
        )
        return self._apply(ctl.observe(self.state, observed, now, self.controller))

    def _rank(self, item: tuple[float, float, int]) -> None:
        """One outcome for the ranking check, in arrival order; in FALLBACK only the requests
        predicted since it began (so those from before cannot vouch for the model as it is)."""
        added_at, base, actual = item
        if not (self.state.mode == "FALLBACK" and added_at < self.state.since):
            self.rank.update(base, actual)

    def forget(self, errors: Sequence[float] | None = None) -> None:
        """A new length model serves: what was learned against the old one (the corrector's
        residuals, the compensation of its bias) starts over, its bands from what the new one's
        validation said of its errors (``errors``: ``LengthCorrector.adopt_errors``)."""
        if self.corrector is not None:
            self.corrector.reset(new_model=True)
            self.corrector.adopt_errors(errors)
        self.rank = RankWindow(self.controller.rank_window)
        self.state = replace(self.state, compensation={}, ratios={}, seen={})

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
            self.rank = RankWindow(self.controller.rank_window)
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
