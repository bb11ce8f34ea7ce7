"""The scheduling core driven in virtual time: arrivals and completions of simulated engines go
into the one ``Scheduler`` the daemon serves with, and its assignments go out to the engines."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from steersman.control.core.scheduler import Arrival, InstanceState, Outcome, Scheduler
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.learners.latency import StepCoefficients


class CoreDriver:
    """The ``Router`` of ``run_cluster`` around a scheduler. ``features[request id]`` holds each
    request's predictor features (with ``request_class``, and the base model's prediction when
    there is one); ``cap`` is each engine's cap, ``step`` the latency model the core plans with.
    Engine ``k`` is the instance named ``str(k)``."""

    def __init__(
        self,
        scheduler: Scheduler,
        step: StepCoefficients,
        *,
        features: Mapping[str, Mapping[str, Any]] | None = None,
        cap: int = 1 << 30,
        progress_s: float = 0.05,
    ) -> None:
        self.scheduler = scheduler
        self.step = step
        self.features = features or {}
        self.cap = cap
        self._requests: dict[str, SimRequest] = {}
        self._pushed: dict[str, int] = {}  # the progress the scheduler was last told of
        self.progress_s = progress_s
        self._progress_at = -math.inf
        self.dispatched: dict[str, float] = {}  # when each request left steersman's queue
        # (time, waiting in steersman's queue, waiting in the engines, mean KV usage), sampled
        # at most every ``sample_s``: what a plot of a burst shows.
        self.samples: list[tuple[float, int, int, float]] = []
        self.sample_s = 1.0

    def arrive(
        self, req: SimRequest, engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]:
        x = self.features.get(req.id, {})
        arrival = Arrival(
            req.id,
            req.prompt_tokens,
            x,
            request_class=str(x.get("request_class", "other")),
            true_tokens=req.output_tokens,
            prefix=req.prefix,
            segment_tokens=req.segment_tokens,
        )
        self.scheduler.add(arrival, now)
        self._requests[req.id] = req
        return self._schedule(engines, now)

    def finished(
        self, done: list[SimRequest], engines: Sequence[SimEngine], now: float
    ) -> Iterable[tuple[int, SimRequest]]:
        for req in done:
            self._requests.pop(req.id, None)
            self._pushed.pop(req.id, None)
            self.scheduler.finish(req.id, Outcome(req.generated), now)
        return self._schedule(engines, now)

    def _schedule(self, engines: Sequence[SimEngine], now: float) -> list[tuple[int, SimRequest]]:
        scheduler = self.scheduler
        scheduler.tick(now)
        # What the running requests produced matters only to a decision; the daemon hears of it
        # chunk by chunk, the simulation tells the core at most every ``progress_s``.
        if scheduler.depth and now - self._progress_at >= self.progress_s:
            self._progress_at = now
            pushed = self._pushed
            for engine in engines:  # only running requests produce (preempted ones keep theirs)
                for req in engine.running:
                    produced = req.generated
                    if produced and pushed.get(req.id) != produced:
                        pushed[req.id] = produced
                        scheduler.progress(req.id, produced)
        states = [
            InstanceState(
                str(k),
                cap=self.cap,
                kv_usage=e.kv_usage(),
                waiting=e.waiting,
                step=self.step,
                kv_capacity=e.model.num_blocks * e.model.block_size,
                block=e.model.block_size,
            )
            for k, e in enumerate(engines)
        ]
        if not self.samples or now - self.samples[-1][0] >= self.sample_s:
            kv = [s.kv_usage or 0.0 for s in states]
            waiting = sum(s.waiting for s in states)
            self.samples.append((now, scheduler.depth, waiting, sum(kv) / max(len(kv), 1)))
        out = []
        for a in scheduler.schedule(states, now):
            req = self._requests[a.request_id]
            self.dispatched[a.request_id] = now
            req.priority = a.priority
            req.predicted = a.scheduled if a.ordered else None
            out.append((int(a.instance), req))
        return out
