"""The daemon's shell around the scheduling core: intake, waiting, streaming; outcomes go to
its ``Accounts`` (``control/serve/accounting.py``).

``Steersman`` does the loop's I/O (backends, the history, metrics); every decision is the core's:
``scheduler.add`` at intake, ``scheduler.schedule`` whenever something changed (an arrival, an
outcome, an instance's health or load), ``scheduler.finish`` with each outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final

from steersman.control.backends.base import (
    BackendError,
    GenerationRequest,
    GenerationResult,
    InstanceUnavailable,
)
from steersman.control.core.qoe_rule import EXPECTED_PACE, EXPECTED_TTFT, knobs_as_extra
from steersman.control.core.records import EventRecord
from steersman.control.core.scheduler import Assignment, Scheduler
from steersman.control.serve.accounting import Accounts, Record
from steersman.control.serve.instances import Instance
from steersman.control.serve.intake import (
    Job,
    make_job,
    max_tokens_of,
    streamed,
    text_of,
    token_ids,
)
from steersman.control.serve.metrics import Metrics
from steersman.control.serve.openai_api import streamable
from steersman.control.serve.predictor import Predictor, request_context
from steersman.control.serve.settings import Settings

log = logging.getLogger(__name__)

COMPLETE: Final = object()  # ends a complete answer's chunks (``Steersman.run``)
Chunk = dict[str, Any] | object


class NoInstance(BackendError):
    """No healthy instance is left to serve the request."""


class QueueTimeout(BackendError):
    """No instance took the request within the queue timeout."""


class Steersman:
    def __init__(
        self,
        instances: list[Instance],
        predictor: Predictor,
        scheduler: Scheduler,
        settings: Settings,
        *,
        record: Record,
        metrics: Metrics,
        telemetry: Callable[[], Mapping[str, Any]] = dict,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        on_hot_update: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``settings``: the tree; the shell reads its ``service`` and ``qoe`` sections, and
        whether the history keeps prompts (``storage``) and how ``max_tokens`` reads
        (``predictor``). The rest are its collaborators and its clocks."""
        if not instances:
            raise ValueError("steersman needs at least one instance")
        self.instances = {i.name: i for i in instances}
        self.predictor = predictor
        self.scheduler = scheduler
        self.settings = settings
        self.metrics = metrics
        self.accounts = Accounts(
            scheduler, settings, record=record, metrics=metrics,
            on_hot_update=on_hot_update, clock=clock, wall=wall,
        )  # fmt: skip
        self.store_prompts = settings.storage.store_prompts
        self.max_tokens_is_length = settings.predictor.max_tokens_is_length
        self.telemetry = telemetry
        self.tokenize = tokenize  # the served model's tokenizer: prompts' prefixes for the core
        self.qoe = settings.qoe
        self.clock = clock
        self._waiters: dict[str, asyncio.Future[Assignment]] = {}
        self._closing: set[asyncio.Future[None]] = set()
        self.no_kv_capacity: set[str] = set()  # instances admitted by max_in_flight alone
        metrics.set_mode(scheduler.state.mode)
        for name in self.instances:
            metrics.instance_up.labels(name).set(1)

    # -- intake --------------------------------------------------------------------------------

    async def prepare(
        self,
        request_id: str,
        kind: str,
        body: dict[str, Any],
        expectation: tuple[float, float] | None = None,
        candidates: frozenset[str] | None = None,
    ) -> Job:
        """``expectation``: the client's (TTFT, pace) for its reader; its class's otherwise.
        ``candidates``: the instances it may go to (None: any)."""
        received = self.clock()
        text, turns = text_of(kind, body)
        ids = token_ids(kind, body, self.tokenize)  # the prompt tokenized once
        # A completion's whole input is the text the predictor reads: its count is the ids'.
        counted = len(ids) if ids and kind != "chat" else None
        cap = None if self.max_tokens_is_length else max_tokens_of(body)
        context = request_context(self.telemetry, self.instances.values(), self.scheduler.in_flight)
        p = await self.predictor.predict(
            text, turns=turns, max_tokens=cap, context=context, prompt_tokens=counted
        )
        self.metrics.predictions.labels(p.path).inc()
        return make_job(
            request_id,
            kind,
            body,
            text,
            p,
            received,
            ids=ids,
            store_prompts=self.store_prompts,
            max_tokens_is_length=self.max_tokens_is_length,
            model_version=self.predictor.model_version,
            expectation=expectation or self.qoe.expectation(p.request_class),
            queue_by_ttft=self.qoe.enabled and streamed(body),
            candidates=candidates,
        )

    def refuse(
        self,
        request_id: str,
        kind: str,
        body: dict[str, Any],
        reason: str,
        job: Job | None = None,
    ) -> None:
        """Record a request refused before it was scheduled (the client's mistake): with its
        ``job`` once prepared, or before any prediction ran (an unknown model)."""
        if job is not None:
            self._close(job, error=reason)
            return
        self.accounts.refuse(request_id, kind, body, reason)

    # -- scheduling ------------------------------------------------------------------------------

    def pump(self) -> None:
        """Let the core hand waiting requests to instances; wake their callers."""
        now = self.clock()
        self.accounts.apply(self.scheduler.tick(now))  # FALLBACK may have run out
        started = time.perf_counter()
        states = [i.state() for i in self.instances.values()]
        assignments = self.scheduler.schedule(states, now)
        if assignments:
            self.metrics.decision.observe((time.perf_counter() - started) / len(assignments))
        for a in assignments:
            waiter = self._waiters.pop(a.request_id, None)
            if waiter is None or waiter.done():  # its caller left as it was granted
                self.scheduler.abort(a.request_id)
                continue
            waiter.set_result(a)
            self.metrics.in_flight.labels(a.instance).set(self.scheduler.in_flight(a.instance))
        self.metrics.queue_depth.set(self.scheduler.depth)

    async def _granted(self, job: Job) -> Assignment:
        future: asyncio.Future[Assignment] = asyncio.get_running_loop().create_future()
        self._waiters[job.request_id] = future
        self.pump()
        try:
            return await asyncio.wait_for(
                asyncio.shield(future), self.settings.service.queue_timeout_s
            )
        except (TimeoutError, asyncio.CancelledError) as exc:
            self._waiters.pop(job.request_id, None)
            granted = future.done() and not future.cancelled()
            if granted and isinstance(exc, TimeoutError):
                return future.result()  # granted as the timer fired: use it
            future.cancel()
            self.scheduler.abort(job.request_id)
            self.pump()
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(
                    f"no instance had room within {self.settings.service.queue_timeout_s:g} s"
                ) from None
            raise

    async def run(self, job: Job, *, respond_first: bool = False) -> AsyncIterator[Chunk]:
        """The OpenAI chunks of the request's stream. Raises a BackendError (or QueueFull /
        QueueTimeout) when it fails; the outcome is recorded either way.

        With ``respond_first``, a complete answer ends with ``COMPLETE``, and its outcome is
        learnt and recorded when the generator is closed (``close_later``): the client's answer
        does not wait on the accounting."""
        try:
            ticket = self.scheduler.add(job.arrival, self.clock())
        except Exception as exc:
            self._close(job, error=str(exc))
            raise
        job.record.corrected_prediction = ticket.corrected
        job.record.scheduled_prediction = ticket.scheduled
        job.record.band_low, job.record.band_high = ticket.low, ticket.high
        while True:
            if not any(i.healthy for i in self.instances.values()):
                self.scheduler.abort(job.request_id)
                error = NoInstance("no healthy instance")
                self._close(job, error=str(error))
                raise error
            try:
                a = await self._granted(job)
            except asyncio.CancelledError:
                self._close(job, error="client disconnected while queued")
                raise
            except Exception as exc:
                self._close(job, error=str(exc))
                raise
            job.assignment = a
            job.record.priority = a.priority
            job.record.expected_cached_tokens = a.cached_tokens
            instance = self.instances[a.instance]
            result = GenerationResult(job.request_id, instance.name, self.clock())
            streamed = False
            upstream = instance.backend.stream(self._request(job, a, instance), result)
            try:
                # aclosing: a client that leaves closes the upstream stream now, not at GC time.
                async with contextlib.aclosing(upstream) as events:
                    async for event in events:
                        streamed = instance.streaming = True
                        if job.prefill_mark is None and result.first_token_at is not None:
                            job.prefill_mark = instance.prefill_done(job, result)
                        if result.completion_tokens is not None:
                            self.scheduler.progress(job.request_id, result.completion_tokens)
                        yield event.data
            except InstanceUnavailable as exc:
                self.mark(instance, False, str(exc))
                if not streamed and job.retries < self.settings.service.retries:
                    job.retries += 1
                    self.metrics.retries.inc()
                    log.info("request %s: retrying after %s", job.request_id, exc)
                    self.scheduler.requeue(job.request_id)
                    continue
                self._close(job, instance, result, str(exc))
                raise
            except BackendError as exc:
                self._close(job, instance, result, result.error or str(exc))
                raise
            except (asyncio.CancelledError, GeneratorExit):
                self._close(job, instance, result, "client disconnected")
                raise
            else:
                try:
                    if respond_first:
                        yield COMPLETE
                finally:
                    self._close(job, instance, result, None)
                return

    def close_later(self, chunks: AsyncIterator[Chunk]) -> None:
        """Close a stream that reached ``COMPLETE`` in the loop's next turn: after the response
        has gone out, before any new arrival is read."""
        task = asyncio.ensure_future(chunks.aclose())  # type: ignore[attr-defined]
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _request(self, job: Job, a: Assignment, instance: Instance) -> GenerationRequest:
        """The request as the instance gets it: with steersman's priority and predicted length
        (for its vLLM scheduler class), unless the instance is configured as stock vLLM."""
        xargs = job.body.get("vllm_xargs")
        extra = dict(xargs) if isinstance(xargs, dict) else {}
        if instance.send_predictions and a.ordered:
            extra["steersman_predicted_tokens"] = round(a.scheduled)
            extra["steersman_aging_s"] = self.scheduler.dispatch.aging_s
        if instance.send_predictions and self.qoe.enabled and streamed(job.body):
            rec = job.record
            extra[EXPECTED_TTFT] = rec.expected_ttft_s
            extra[EXPECTED_PACE] = rec.expected_pace_s
            extra.update(knobs_as_extra(self.qoe))
        return GenerationRequest(
            job.request_id,
            "chat" if job.kind == "chat" else "completion",
            job.body,
            priority=a.priority if instance.send_priority else None,
            xargs=extra or None,
            stream=streamed(job.body) or streamable(job.body),
        )

    # -- outcome ---------------------------------------------------------------------------------

    def _close(
        self,
        job: Job,
        instance: Instance | None = None,
        result: GenerationResult | None = None,
        error: str | None = None,
    ) -> None:
        """Hand the outcome to the core, learn, record the row. Never raises."""
        try:
            self.accounts.close(job, instance, result, error)
        finally:
            self.pump()

    def tick(self) -> None:
        """Time passing for the controller (FALLBACK expiry with no traffic), and a chance for
        waiting requests to go where the load changed."""
        self.pump()

    # -- instance health -----------------------------------------------------------------------

    def mark(self, instance: Instance, healthy: bool, reason: str) -> None:
        if instance.healthy == healthy:
            return
        instance.healthy = healthy
        self.metrics.instance_up.labels(instance.name).set(1 if healthy else 0)
        word = "readmitted" if healthy else "marked down"
        log.warning("instance %s %s: %s", instance.name, word, reason)
        details = {"instance": instance.name, "healthy": healthy}
        why = f"{instance.name} {word}: {reason}"
        self.accounts.write(EventRecord(self.clock(), "instance", why, details=details))
        if healthy:
            self.pump()

    async def check_health(self) -> None:
        async def one(instance: Instance) -> None:
            ok = await instance.backend.health()
            # A server that streamed since the last probe is alive: under load its /health can
            # time out while it serves (passive health, as load balancers check it).
            ok = ok or (instance.healthy and instance.streaming)
            instance.streaming = False
            instance.failed_probes = 0 if ok else instance.failed_probes + 1
            if ok:
                self.mark(instance, True, "/health answered")
            elif instance.failed_probes >= self.settings.service.health_failures:
                self.mark(
                    instance, False, f"/health failed {instance.failed_probes} times in a row"
                )

        await asyncio.gather(*(one(i) for i in self.instances.values()))
