"""steersman's loop in virtual time, for benchmarks: the same pure decisions as the daemon
(policies, priority, compensation, controller) and the same learners, on simulated engines.

With ``cap=None`` and ``priorities=False`` it is a plain load balancer: every request goes out
on arrival (round-robin or least-load, as the routers operators already use).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from steersman.control.core import controller as ctl
from steersman.control.core.policies import (
    POLICIES,
    DispatchContext,
    InstanceView,
    priority_key,
    round_robin,
    vllm_priority,
)
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.learners.corrector import BASE_KEY, LengthCorrector
from steersman.learners.latency import StepCoefficients


@dataclass
class RouterStats:
    decisions: int = 0
    fallbacks: int = 0
    fallback_decisions: int = 0
    misses: int = 0
    scored: int = 0
    compensation_changes: int = 0


@dataclass
class _Meta:
    scheduled: float
    corrected: float
    request_class: str
    x: dict[str, Any]
    engine: int = -1


@dataclass
class SimRouter:
    """``features[req.id]`` holds each request's features (and ``base_tokens``, RoBERTa's
    prediction, when there is one); ``corrector`` None means the base prediction is used as is.
    ``policy`` names one of the dispatch policies; in FALLBACK the controller makes it
    round-robin with arrival-order priorities, as in the daemon."""

    policy: str
    coefficients: StepCoefficients
    features: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    corrector: LengthCorrector | None = None
    cap: int | None = None
    priorities: bool = True
    controller: ctl.ControllerConfig | None = None
    aging_s: float = 1.0
    impact_weight: float = 1.0
    stats: RouterStats = field(default_factory=RouterStats)

    def __post_init__(self) -> None:
        self._policy = POLICIES[self.policy]
        self.state = ctl.ControllerState()
        self._queue: list[tuple[float, int, SimRequest]] = []
        self._seq = itertools.count()
        self._meta: dict[str, _Meta] = {}
        self._in_flight: list[dict[str, SimRequest]] = []
        self._counter = 0

    # -- the Router protocol of run_cluster ---------------------------------------------------

    def arrive(
        self, req: SimRequest, engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]:
        if not self._in_flight:
            self._in_flight = [{} for _ in engines]
        meta = self._predict(req)
        self._meta[req.id] = meta
        fallback = self.state.mode == "FALLBACK"
        key = priority_key(
            0.0 if fallback or not self.priorities else meta.scheduled, now, self.aging_s
        )
        req.priority = vllm_priority(key, 0.0, self.aging_s) if self.priorities else 0
        heapq.heappush(self._queue, (key, next(self._seq), req))
        return self._pump(engines, now)

    def finished(
        self, done: list[SimRequest], engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]:
        for req in done:
            meta = self._meta.pop(req.id)
            self._in_flight[meta.engine].pop(req.id, None)
            self._learn(req, meta, now)
        return self._pump(engines, now)

    # -- prediction and learning --------------------------------------------------------------

    def _predict(self, req: SimRequest) -> _Meta:
        x = dict(self.features.get(req.id, {}))
        cls = str(x.get("request_class", "other"))
        if self.policy == "oracle":
            corrected = float(req.output_tokens)
        elif self.corrector is not None:
            corrected = self.corrector.predict_one(x)
        else:
            corrected = float(x.get(BASE_KEY, 128.0))
        config = self.controller or ctl.ControllerConfig()
        scheduled = self.state.compensation_for(cls, config).apply(corrected)
        if self.policy == "oracle" or not math.isfinite(scheduled):
            scheduled = corrected
        return _Meta(max(scheduled, 1.0), corrected, cls, x)

    def _learn(self, req: SimRequest, meta: _Meta, now: float) -> None:
        actual = req.output_tokens
        if self.corrector is not None:
            self.corrector.learn_one(meta.x, actual)
        if self.controller is None or self.policy == "oracle":
            return
        outcome = ctl.Outcome(meta.request_class, meta.scheduled, meta.corrected, actual)
        step = ctl.observe(self.state, outcome, now, self.controller)
        self.state = step.state
        self.stats.scored += 1
        self.stats.misses += bool(step.miss)
        for event in step.events:
            if event.kind == "compensation":
                self.stats.compensation_changes += 1
        if step.hot_update:
            self.stats.fallbacks += 1
            if self.corrector is not None:
                self.corrector.reset()

    # -- dispatch -----------------------------------------------------------------------------

    def _pump(self, engines: Sequence[SimEngine], now: float) -> list[tuple[int, SimRequest]]:
        if self.controller is not None:
            self.state = ctl.tick(self.state, now, self.controller).state
        out = []
        while self._queue:
            _, _, req = self._queue[0]
            meta = self._meta[req.id]
            k = self._decide(req, meta, engines, now)
            if k is None:
                break
            heapq.heappop(self._queue)
            meta.engine = k
            self._in_flight[k][req.id] = req
            out.append((k, req))
        return out

    def _decide(
        self, req: SimRequest, meta: _Meta, engines: Sequence[SimEngine], now: float
    ) -> int | None:
        c = self.coefficients
        views = []
        for k, engine in enumerate(engines):
            flying = self._in_flight[k]
            remaining = tuple(
                max(self._meta[r.id].scheduled - r.generated, 0.1 * self._meta[r.id].scheduled, 1.0)
                for r in flying.values()
            )
            views.append(
                InstanceView(
                    str(k),
                    in_flight=len(flying),
                    cap=self.cap if self.cap is not None else 1 << 30,
                    kv_usage=engine.kv_usage(),
                    waiting=engine.waiting,
                    remaining=remaining,
                    step_base_s=c.base_s,
                    step_per_seq_s=c.per_seq_s,
                    prefill_s_per_token=c.prefill_s_per_token,
                )
            )
        fallback = self.state.mode == "FALLBACK"
        policy = round_robin if fallback else self._policy
        ctx = DispatchContext(
            views,
            req.id,
            meta.scheduled,
            req.prompt_tokens,
            now,
            self._counter,
            true_tokens=req.output_tokens,
            impact_weight=self.impact_weight,
        )
        decision = policy(ctx)
        if decision.instance is None:
            return None
        self._counter += 1
        self.stats.decisions += 1
        self.stats.fallback_decisions += fallback
        return int(decision.instance)
