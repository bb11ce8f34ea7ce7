"""The scheduling core driven in virtual time: arrivals and completions of simulated engines go
into the one ``Scheduler`` the daemon serves with, and its assignments go out to the engines."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from steersman.control.core.scheduler import Arrival, InstanceState, Outcome, Report, Scheduler
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.learners.latency import LatencyModel, StepCoefficients
from steersman.telemetry.sampler import Sampler


class CoreDriver:
    """The ``Router`` of ``run_cluster`` around a scheduler. ``features[request id]`` holds each
    request's predictor features (with ``request_class``, and the base model's prediction when
    there is one); ``cap`` is each engine's cap, ``step`` the step times the core plans with (one
    for all engines, or one each). With ``latency`` (a model per engine) the core plans with what
    each model says instead, and each learns from its engine's finished requests and, with a
    ``sampler`` over the engines' GPUs (ticked here every ``sampler.period_s`` of virtual time),
    from their telemetry, as the daemon's do. Engine ``k`` is the instance named ``str(k)``."""

    def __init__(
        self,
        scheduler: Scheduler,
        step: StepCoefficients | Sequence[StepCoefficients],
        *,
        features: Mapping[str, Mapping[str, Any]] | None = None,
        cap: int = 1 << 30,
        progress_s: float = 0.05,
        latency: Sequence[LatencyModel] | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.step = step
        self.latency = latency
        self.sampler = sampler
        self._steps: list[StepCoefficients] | None = None  # per engine, while they hold
        self._steps_at = -math.inf  # read again every second: what was learned fades
        self.served: dict[str, int] = {}  # request id -> the engine it was sent to
        self._prefilling: set[str] = set()  # sent, no first token told to the core yet
        self._tick_at = 0.0
        # (time, engine, the model's speed, the engine's true slowdown) at each learned
        # outcome: how fast the model tracks a change.
        self.learned: list[tuple[float, int, float, float]] = []
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
        # (time, outcomes scored so far, the mode entered, why): what the daemon writes to SQL.
        self.modes: list[tuple[float, int, str, str]] = []

    def _modes(self, report: Report, now: float) -> None:
        for e in report.events:
            if e.kind == "mode" and e.to_mode is not None:
                self.modes.append((now, self.scheduler.stats.scored, e.to_mode, e.reason))

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
        self._telemetry(now)
        for req in done:
            self._requests.pop(req.id, None)
            self._pushed.pop(req.id, None)
            self._prefilling.discard(req.id)
            self._modes(self.scheduler.finish(req.id, Outcome(req.generated), now), now)
            k = self.served.get(req.id)
            if self.latency is not None and k is not None and req.generated > 1:
                self._learn(k, req, engines[k], now)
        return self._schedule(engines, now)

    def _learn(self, k: int, req: SimRequest, engine: SimEngine, now: float) -> None:
        assert self.latency is not None and req.first_token_at is not None
        tpot = (now - req.first_token_at) / (req.generated - 1)
        x = {
            "running": len(engine.running) + 1,
            "prefill_tokens": engine.stats.prefill_tokens - req.prefill_mark,
            "decode_steps": req.generated - 1,
            **self._gpu(k, now, req.first_token_at),
        }
        model = self.latency[k]
        model.learn_one(x, tpot, now=now)
        truth = engine.gpu.slowdown if engine.gpu is not None else 1.0
        self.learned.append((now, k, model.speed(x, now), truth))
        if self._steps is not None:
            self._steps[k] = model.coefficients(x, now)

    def _gpu(self, k: int, now: float, since: float | None = None) -> dict[str, Any]:
        return self.sampler.features(k, now, since) if self.sampler is not None else {}

    def _telemetry(self, now: float) -> None:
        """Tick the sampler up to ``now`` on its period (at most a window's worth behind)."""
        sampler = self.sampler
        if sampler is None or now < self._tick_at:
            return
        period = sampler.period_s
        self._tick_at = max(self._tick_at, now - sampler.window_s)
        while self._tick_at <= now:
            sampler.tick(self._tick_at, self._tick_at)
            self._tick_at += period
        self._steps = None

    def _step_times(self, n: int, now: float) -> list[StepCoefficients]:
        stale = self.latency is not None and now >= self._steps_at + 1.0
        if self._steps is None or len(self._steps) != n or stale:
            if self.latency is not None:
                self._steps_at = now
                self._steps = [
                    m.coefficients(self._gpu(k, now), now) for k, m in enumerate(self.latency)
                ]
            elif isinstance(self.step, StepCoefficients):
                self._steps = [self.step] * n
            else:
                self._steps = list(self.step)
        return self._steps

    def _schedule(self, engines: Sequence[SimEngine], now: float) -> list[tuple[int, SimRequest]]:
        scheduler = self.scheduler
        self._modes(scheduler.tick(now), now)
        self._telemetry(now)
        steps = self._step_times(len(engines), now)
        # A first token is told at once (it ends the request's prefill, which the next arrival
        # would wait behind), as the daemon hears of it with the first chunk.
        for rid in [r for r in self._prefilling if self._requests[r].generated]:
            self._prefilling.discard(rid)
            self._pushed[rid] = self._requests[rid].generated
            scheduler.progress(rid, self._pushed[rid])
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
                step=steps[k],
                kv_capacity=e.model.num_blocks * e.model.block_size,
                block=e.model.block_size,
                ranks=e.policy == "steersman",
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
            self.served[a.request_id] = int(a.instance)
            self._prefilling.add(a.request_id)
            req.priority = a.priority
            req.predicted = a.scheduled if a.ordered else None
            out.append((int(a.instance), req))
        return out
