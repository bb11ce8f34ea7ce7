"""The scheduling loop: predict, compensate, queue, dispatch, stream, then learn and record.

``Steersman`` holds the runtime state (instances, learners, controller state) and does the I/O;
every decision in it is delegated to a pure function (policies, controller, priority).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from steersman.control.backends.base import (
    Backend,
    BackendError,
    GenerationRequest,
    GenerationResult,
    InstanceUnavailable,
)
from steersman.control.core import controller as ctl
from steersman.control.core.policies import (
    POLICIES,
    DispatchContext,
    InstanceView,
    priority_key,
    round_robin,
    vllm_priority,
)
from steersman.control.core.qoe import qoe
from steersman.control.serve.admission import Admission
from steersman.control.serve.metrics import Metrics
from steersman.control.serve.predictor import Prediction, Predictor
from steersman.learners.features import prompt_text
from steersman.learners.latency import LatencyModel, StepCoefficients

log = logging.getLogger(__name__)

Record = Callable[[str, dict[str, Any]], None]


class NoInstance(BackendError):
    """No healthy instance is left to serve the request."""


@dataclass
class Instance:
    """One serving instance at run time."""

    name: str
    backend: Backend
    latency: LatencyModel
    cap: int = 32
    send_priority: bool = True
    healthy: bool = True
    kv_usage: float | None = None
    waiting: int = 0
    in_flight: dict[str, list[float]] = field(default_factory=dict)  # id -> [predicted, produced]
    coefficients: StepCoefficients | None = None

    def refresh(self) -> None:
        """Re-read the latency model (after it learned, or the KV usage moved): decisions then
        use the cached coefficients and cost no model evaluation."""
        self.coefficients = self.latency.coefficients({"kv_usage": self.kv_usage})

    def view(self) -> InstanceView:
        if self.coefficients is None:
            self.refresh()
        c = self.coefficients
        assert c is not None
        remaining = tuple(
            max(predicted - produced, 0.1 * predicted, 1.0)
            for predicted, produced in self.in_flight.values()
        )
        return InstanceView(
            self.name,
            in_flight=len(self.in_flight),
            cap=self.cap,
            healthy=self.healthy,
            kv_usage=self.kv_usage,
            waiting=self.waiting,
            remaining=remaining,
            step_base_s=c.base_s,
            step_per_seq_s=c.per_seq_s,
            prefill_s_per_token=c.prefill_s_per_token,
        )


@dataclass
class Job:
    """One request on its way through the loop."""

    request_id: str
    kind: str  # "completion" or "chat"
    body: dict[str, Any]
    text: str
    received_at: float
    prediction: Prediction
    scheduled: float
    max_tokens: int | None
    key: float
    priority: int
    policy: str | None = None
    mode: str | None = None
    dispatched_at: float | None = None
    running_at_dispatch: int = 0
    retries: int = 0


class Steersman:
    def __init__(
        self,
        instances: list[Instance],
        predictor: Predictor,
        *,
        record: Record,
        metrics: Metrics,
        policy: str = "predictive",
        controller: ctl.ControllerConfig | None = None,
        aging_s: float = 1.0,
        impact_weight: float = 1.0,
        max_queue: int = 10_000,
        queue_timeout_s: float = 120.0,
        retries: int = 1,
        store_prompts: bool = True,
        max_tokens_is_length: bool = False,
        telemetry: Callable[[], Mapping[str, Any]] = dict,
        on_hot_update: Callable[[str], None] | None = None,
        expected_ttft_s: float = 1.0,
        expected_pace_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not instances:
            raise ValueError("steersman needs at least one instance")
        self.instances = {i.name: i for i in instances}
        self.order = [i.name for i in instances]
        self.predictor = predictor
        self.record = record
        self.metrics = metrics
        self.policy_name = policy
        self.policy = POLICIES[policy]
        self.config = controller or ctl.ControllerConfig()
        self.aging_s = aging_s
        self.impact_weight = impact_weight
        self.queue_timeout_s = queue_timeout_s
        self.retries = retries
        self.store_prompts = store_prompts
        # Replays set max_tokens to the true length: then it is neither a hint nor a cut-off.
        self.max_tokens_is_length = max_tokens_is_length
        self.telemetry = telemetry
        self.on_hot_update = on_hot_update
        self.expected = (expected_ttft_s, expected_pace_s)
        self.clock = clock
        self.origin = clock()
        self._wall_offset = wall() - self.origin
        self.state = ctl.ControllerState(since=self.origin)
        self.counter = 0
        self.admission = Admission(self._claim, self._release, max_queue)
        metrics.set_mode(self.state.mode)
        for name in self.order:
            metrics.instance_up.labels(name).set(1)

    # -- intake and prediction -----------------------------------------------------------------

    async def prepare(self, request_id: str, kind: str, body: dict[str, Any]) -> Job:
        received = self.clock()
        if kind == "chat":
            text, turns = prompt_text(messages=body.get("messages"))
        else:
            text, turns = prompt_text(prompt=body.get("prompt"))
        raw_max = body.get("max_tokens") or body.get("max_completion_tokens")
        max_tokens = raw_max if isinstance(raw_max, int) and raw_max > 0 else None
        cap = None if self.max_tokens_is_length else max_tokens
        prediction = await self.predictor.predict(
            text, turns=turns, max_tokens=cap, context=self._context()
        )
        comp = self.state.compensation_for(prediction.request_class, self.config)
        scheduled = comp.apply(prediction.corrected)
        if not math.isfinite(scheduled):
            scheduled = float(cap or self.predictor.corrector.max_tokens)
        scheduled = max(1.0, min(scheduled, float(cap)) if cap else scheduled)
        self.metrics.predictions.labels(prediction.path).inc()
        fallback = self.state.mode == "FALLBACK"
        key = priority_key(0.0 if fallback else scheduled, received, self.aging_s)
        return Job(
            request_id=request_id,
            kind=kind,
            body=body,
            text=text,
            received_at=received,
            prediction=prediction,
            scheduled=scheduled,
            max_tokens=max_tokens,
            key=key,
            priority=vllm_priority(key, self.origin, self.aging_s),
        )

    def _context(self) -> dict[str, Any]:
        x: dict[str, Any] = {}
        try:
            for key, value in self.telemetry().items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    x[f"gpu_{key}"] = value
        except Exception:  # telemetry is advisory: a failing source costs features, not requests
            log.debug("telemetry features failed", exc_info=True)
        healthy = [i for i in self.instances.values() if i.healthy]
        in_flight = sum(len(i.in_flight) for i in healthy)
        x["load"] = in_flight / max(sum(i.cap for i in healthy), 1)
        kv = [i.kv_usage for i in healthy if i.kv_usage is not None]
        if kv:
            x["kv_usage"] = sum(kv) / len(kv)
        return x

    # -- dispatch ------------------------------------------------------------------------------

    def _claim(self, job: Job) -> str | None:
        started = time.perf_counter()
        fallback = self.state.mode == "FALLBACK"
        policy = round_robin if fallback else self.policy
        ctx = DispatchContext(
            instances=[self.instances[n].view() for n in self.order],
            request_id=job.request_id,
            predicted_tokens=job.scheduled,
            prompt_tokens=job.prediction.prompt_tokens or 0,
            now=self.clock(),
            counter=self.counter,
            true_tokens=job.max_tokens,
            impact_weight=self.impact_weight,
        )
        decision = policy(ctx)
        self.metrics.decision.observe(time.perf_counter() - started)
        if decision.instance is None:
            return None
        self.counter += 1
        instance = self.instances[decision.instance]
        job.running_at_dispatch = len(instance.in_flight)
        instance.in_flight[job.request_id] = [job.scheduled, 0.0]
        job.policy, job.mode = decision.policy, self.state.mode
        self.metrics.in_flight.labels(instance.name).set(len(instance.in_flight))
        return decision.instance

    def _release(self, job: Job, name: str) -> None:
        instance = self.instances[name]
        instance.in_flight.pop(job.request_id, None)
        self.metrics.in_flight.labels(name).set(len(instance.in_flight))

    async def run(self, job: Job) -> AsyncIterator[dict[str, Any]]:
        """The OpenAI chunks of the request's stream. Raises a BackendError (or the queue's
        QueueFull / QueueTimeout) when it fails; the outcome is recorded either way."""
        while True:
            if not any(i.healthy for i in self.instances.values()):
                error = NoInstance("no healthy instance")
                self._finish(job, None, None, str(error))
                raise error
            try:
                name = await self.admission.acquire(job, job.key, self.queue_timeout_s)
            except asyncio.CancelledError:
                self._finish(job, None, None, "client disconnected while queued")
                raise
            except Exception as exc:
                self._finish(job, None, None, str(exc))
                raise
            instance = self.instances[name]
            result = GenerationResult(job.request_id, name, self.clock())
            job.dispatched_at = result.started_at
            streamed = False
            upstream = instance.backend.stream(self._request(job, instance), result)
            try:
                # aclosing: a client that leaves closes the upstream stream now, not at GC time.
                async with contextlib.aclosing(upstream) as events:
                    async for event in events:
                        streamed = True
                        slot = instance.in_flight.get(job.request_id)
                        if slot is not None and result.completion_tokens is not None:
                            slot[1] = float(result.completion_tokens)
                        yield event.data
            except InstanceUnavailable as exc:
                self._release(job, name)
                self.admission.pump()
                self.mark(instance, False, str(exc))
                if not streamed and job.retries < self.retries:
                    job.retries += 1
                    self.metrics.retries.inc()
                    log.info("request %s: retrying after %s", job.request_id, exc)
                    continue
                self._finish(job, instance, result, str(exc))
                raise
            except BackendError as exc:
                self._finish(job, instance, result, result.error or str(exc))
                raise
            except (asyncio.CancelledError, GeneratorExit):
                self._finish(job, instance, result, "client disconnected")
                raise
            else:
                self._finish(job, instance, result, None)
                return
            finally:
                if job.request_id in instance.in_flight:
                    self._release(job, name)
                    self.admission.pump()

    def reject(self, job: Job, reason: str) -> None:
        """Record a request refused before dispatch (the client's mistake)."""
        self._finish(job, None, None, reason)

    def _request(self, job: Job, instance: Instance) -> GenerationRequest:
        xargs = job.body.get("vllm_xargs")
        extra = dict(xargs) if isinstance(xargs, dict) else {}
        extra["steersman_predicted_tokens"] = round(job.scheduled)
        return GenerationRequest(
            job.request_id,
            "chat" if job.kind == "chat" else "completion",
            job.body,
            priority=job.priority if instance.send_priority else None,
            xargs=extra,
        )

    # -- outcome -------------------------------------------------------------------------------

    def _finish(
        self,
        job: Job,
        instance: Instance | None,
        result: GenerationResult | None,
        error: str | None,
    ) -> None:
        """Learn from the outcome, let the controller observe, record the row. Never raises."""
        try:
            self._record_outcome(job, instance, result, error)
        except Exception:
            log.exception("request %s: accounting failed", job.request_id)

    def _record_outcome(
        self,
        job: Job,
        instance: Instance | None,
        result: GenerationResult | None,
        error: str | None,
    ) -> None:
        now = self.clock()
        p = job.prediction
        actual = result.completion_tokens if result is not None and error is None else None
        row: dict[str, Any] = {
            "request_id": job.request_id,
            "received_at": self._dt(job.received_at),
            "dispatched_at": self._dt(job.dispatched_at),
            "instance": instance.name if instance else None,
            "policy": job.policy,
            "mode": job.mode or self.state.mode,
            "request_class": p.request_class,
            "priority": job.priority,
            "prompt_tokens": p.prompt_tokens,
            "prompt_sha256": hashlib.sha256(job.text.encode("utf-8", "replace")).hexdigest(),
            "prompt_text": job.text if self.store_prompts else None,
            "features": {k: v for k, v in p.x.items() if _jsonable(v)},
            "max_tokens": job.max_tokens,
            "predictor_path": p.path,
            "base_prediction": p.base if p.base is not None and math.isfinite(p.base) else None,
            "corrected_prediction": p.corrected,
            "scheduled_prediction": job.scheduled,
            "model_version": self.predictor.model_version,
            "error": error,
            "finished_at": self._dt(now),
        }
        if result is not None:
            row["first_token_at"] = self._dt(result.first_token_at)
            row["finish_reason"] = result.finish_reason
            if result.prompt_tokens is not None:
                row["prompt_tokens"] = result.prompt_tokens
        outcome = "error"
        if actual is not None and result is not None:
            outcome = "ok"
            self._learn(job, instance, result, actual, row)
        policy = job.policy or "none"
        self.metrics.requests.labels(policy, row["instance"] or "none", outcome).inc()
        self.record("requests", row)

    def _learn(
        self,
        job: Job,
        instance: Instance | None,
        result: GenerationResult,
        actual: int,
        row: dict[str, Any],
    ) -> None:
        p = job.prediction
        cut_off = result.finish_reason == "length" and not self.max_tokens_is_length
        censored = job.max_tokens if cut_off else None
        miss = ctl.is_miss(job.scheduled, actual, censored, self.config.miss_threshold)
        error_ratio = abs(job.scheduled - actual) / max(actual, 1)
        ttft = None if result.first_token_at is None else result.first_token_at - job.received_at
        e2e = None if result.finished_at is None else result.finished_at - job.received_at
        relative = [(t - job.received_at, n) for t, n in result.token_times]
        ttft_goal, pace_goal = self.expected
        row.update(
            actual_tokens=actual,
            abs_error=abs(job.scheduled - actual),
            rel_error=error_ratio,
            miss=miss,
            ttft_s=ttft,
            e2e_s=e2e,
            tpot_s=result.tpot,
            qoe=qoe(relative, actual, expected_ttft=ttft_goal, expected_pace=pace_goal),
        )
        self.metrics.error_ratio.labels(p.path).observe(error_ratio)
        if ttft is not None:
            self.metrics.ttft.observe(ttft)
        if e2e is not None:
            self.metrics.e2e.observe(e2e)
        self.predictor.learn(p, actual)
        if instance is not None:
            x = {
                "running": job.running_at_dispatch + 1,
                "kv_usage": instance.kv_usage,
                "prompt_tokens": result.prompt_tokens or p.prompt_tokens,
            }
            x.update({k[4:]: v for k, v in p.x.items() if k.startswith("gpu_")})
            prefill = None if result.ttft is None else result.ttft
            instance.latency.learn_one(x, result.tpot, prefill)
            instance.refresh()
        outcome = ctl.Outcome(p.request_class, job.scheduled, p.corrected, actual, censored)
        self.apply(ctl.observe(self.state, outcome, self.clock(), self.config))

    def apply(self, step: ctl.Step) -> None:
        """Adopt a controller step: new state, events to SQL, metrics, the hot model update."""
        self.state = step.state
        for event in step.events:
            self.record("controller_events", self._event_row(event))
            if event.kind == "mode":
                log.warning(
                    "controller: %s -> %s: %s", event.from_mode, event.to_mode, event.reason
                )
                if event.to_mode == "FALLBACK":
                    self.metrics.fallbacks.inc()
            elif event.request_class and event.details:
                for param in ("a", "b"):
                    self.metrics.compensation.labels(event.request_class, param).set(
                        event.details[param]
                    )
        self.metrics.set_mode(self.state.mode)
        self.metrics.miss_streak.set(self.state.streak)
        if step.hot_update:
            self.predictor.corrector.reset()
            if self.on_hot_update is not None:
                self.on_hot_update("fallback")

    def tick(self) -> None:
        """Time passing for the controller (FALLBACK expiry with no traffic)."""
        self.apply(ctl.tick(self.state, self.clock(), self.config))
        self.metrics.queue_depth.set(self.admission.depth)

    def _event_row(self, event: ctl.Event) -> dict[str, Any]:
        return {
            "ts": self._dt(self.clock()),
            "kind": event.kind,
            "from_mode": event.from_mode,
            "to_mode": event.to_mode,
            "request_class": event.request_class,
            "reason": event.reason,
            "details": dict(event.details) if event.details else None,
        }

    # -- instance health -----------------------------------------------------------------------

    def mark(self, instance: Instance, healthy: bool, reason: str) -> None:
        if instance.healthy == healthy:
            return
        instance.healthy = healthy
        self.metrics.instance_up.labels(instance.name).set(1 if healthy else 0)
        word = "readmitted" if healthy else "marked down"
        log.warning("instance %s %s: %s", instance.name, word, reason)
        self.record(
            "controller_events",
            {
                "ts": self._dt(self.clock()),
                "kind": "instance",
                "reason": f"{instance.name} {word}: {reason}",
                "details": {"instance": instance.name, "healthy": healthy},
            },
        )
        if healthy:
            self.admission.pump()

    async def check_health(self) -> None:
        async def one(instance: Instance) -> None:
            ok = await instance.backend.health()
            self.mark(instance, ok, "/health answered" if ok else "/health failed")

        await asyncio.gather(*(one(i) for i in self.instances.values()))

    # -- state ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What /admin/state shows."""
        s = self.state
        return {
            "mode": s.mode,
            "mode_since_s": round(self.clock() - s.since, 3),
            "miss_streak": s.streak,
            "fallbacks": s.fallbacks,
            "fallback_left_s": (
                None if s.fallback_until is None else round(s.fallback_until - self.clock(), 3)
            ),
            "policy": self.policy_name,
            "fallback_enabled": self.config.fallback_enabled,
            "compensation": {
                cls: {"a": c.a, "b": c.b} for cls, c in sorted(s.compensation.items())
            },
            "default_compensation": {"a": self.config.initial_a, "b": self.config.initial_b},
            "queue_depth": self.admission.depth,
            "model_version": self.predictor.model_version,
            "predictor": self.predictor.corrector.score.snapshot(),
            "instances": [
                {
                    "name": i.name,
                    "healthy": i.healthy,
                    "in_flight": len(i.in_flight),
                    "cap": i.cap,
                    "kv_usage": i.kv_usage,
                    "waiting": i.waiting,
                }
                for i in (self.instances[n] for n in self.order)
            ],
        }

    def _dt(self, mono: float | None) -> datetime | None:
        return None if mono is None else datetime.fromtimestamp(mono + self._wall_offset, UTC)


def _jsonable(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int | str | bool) or value is None
