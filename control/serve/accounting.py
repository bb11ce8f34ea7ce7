"""What a request leaves behind when it ends (served, failed, refused or abandoned): the core's
``finish``, the learners, the metrics and its history row; and what the controller did with it,
adopted (events to the history, metrics, the hot model update)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from steersman.control.backends.base import GenerationResult
from steersman.control.core.qoe import qoe
from steersman.control.core.records import EventRecord, RequestRecord
from steersman.control.core.scheduler import Outcome, Report, Scheduler
from steersman.control.serve.instances import Instance
from steersman.control.serve.intake import Job, sha256, text_of
from steersman.control.serve.metrics import Metrics
from steersman.control.serve.settings import Settings

log = logging.getLogger(__name__)

Record = Callable[[str, dict[str, Any]], None]


class Accounts:
    """The loop's books: ``close`` a request, ``refuse`` one before it was prepared, ``apply``
    a controller report, ``write`` a row. Never raises into the request's path."""

    def __init__(
        self,
        scheduler: Scheduler,
        settings: Settings,
        *,
        record: Record,
        metrics: Metrics,
        on_hot_update: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.record = record
        self.metrics = metrics
        self.store_prompts = settings.storage.store_prompts
        # Replays set max_tokens to the true length: then it is neither a hint nor a cut-off.
        self.max_tokens_is_length = settings.predictor.max_tokens_is_length
        self.qoe = settings.qoe
        self.on_hot_update = on_hot_update
        self.clock = clock
        self._wall_offset = wall() - clock()

    def close(
        self,
        job: Job,
        instance: Instance | None = None,
        result: GenerationResult | None = None,
        error: str | None = None,
    ) -> None:
        """Hand the outcome to the core, learn, record the row."""
        try:
            self._close(job, instance, result, error)
        except Exception:
            log.exception("request %s: accounting failed", job.request_id)

    def refuse(self, request_id: str, kind: str, body: dict[str, Any], reason: str) -> None:
        """A request refused before any prediction ran (an unknown model): its row."""
        text, _ = text_of(kind, body)
        now = self.clock()
        self.metrics.requests.labels("none", "none", "error").inc()
        self.write(
            RequestRecord(
                request_id,
                now,
                finished_at=now,
                mode=self.scheduler.state.mode,
                prompt_sha256=sha256(text),
                prompt_text=text if self.store_prompts else None,
                error=reason,
            )
        )

    def _close(
        self,
        job: Job,
        instance: Instance | None,
        result: GenerationResult | None,
        error: str | None,
    ) -> None:
        now = self.clock()
        rec, a = job.record, job.assignment
        rec.finished_at, rec.error = now, error
        if a is not None:
            rec.instance, rec.policy, rec.mode = a.instance, a.policy, a.mode
        else:
            rec.mode = self.scheduler.state.mode
        if result is not None:
            rec.dispatched_at = result.started_at
            rec.first_token_at, rec.finish_reason = result.first_token_at, result.finish_reason
            rec.prompt_tokens = result.prompt_tokens or rec.prompt_tokens
            rec.cached_tokens = result.cached_tokens
        actual = result.completion_tokens if result is not None and error is None else None
        if actual is None or result is None:
            self.scheduler.abort(job.request_id)
        else:
            self._learn(job, instance, result, actual)
        if a is not None:
            self.metrics.in_flight.labels(a.instance).set(self.scheduler.in_flight(a.instance))
        outcome = "ok" if actual is not None else "error"
        self.metrics.requests.labels(rec.policy or "none", rec.instance or "none", outcome).inc()
        self.write(rec)

    def _learn(
        self, job: Job, instance: Instance | None, result: GenerationResult, actual: int
    ) -> None:
        rec = job.record
        cut_off = result.finish_reason == "length" and not self.max_tokens_is_length
        report = self.scheduler.finish(job.request_id, Outcome(actual, cut_off), self.clock())
        rec.scored(actual)
        rec.miss = report.miss
        rec.ttft_s = (
            None if result.first_token_at is None else result.first_token_at - rec.received_at
        )
        rec.e2e_s = None if result.finished_at is None else result.finished_at - rec.received_at
        rec.tpot_s = result.tpot
        relative = [(t - rec.received_at, n) for t, n in result.token_times]
        ttft_goal = rec.expected_ttft_s or self.qoe.expected_ttft_s
        pace_goal = rec.expected_pace_s or self.qoe.expected_pace_s
        rec.qoe = qoe(relative, actual, expected_ttft=ttft_goal, expected_pace=pace_goal)
        if rec.rel_error is not None:
            self.metrics.error_ratio.labels(job.prediction.path).observe(rec.rel_error)
        if rec.ttft_s is not None:
            self.metrics.ttft.observe(rec.ttft_s)
        if rec.e2e_s is not None:
            self.metrics.e2e.observe(rec.e2e_s)
        if instance is not None and job.assignment is not None:
            # The clock it decoded at: its GPU's readings since its first token.
            x = {"running": job.assignment.running + 1, **instance.gpu(result.first_token_at)}
            if job.prefill_mark is not None:  # the prefill it decoded beside
                x["prefill_tokens"] = instance.prefilled - job.prefill_mark
                x["decode_steps"] = actual - 1
            now = self.clock()
            instance.latency.learn_one(x, result.tpot, now=now)
            instance.refresh(now)
        self.apply(report)

    def apply(self, report: Report) -> None:
        """Adopt what the controller did: events to SQL, metrics, the hot model update."""
        if not report.events and report.miss is None:
            return
        state = self.scheduler.state
        for event in report.events:
            self.write(EventRecord.of(event, self.clock()))
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
        self.metrics.set_mode(state.mode)
        self.metrics.miss_streak.set(state.streak)
        if report.hot_update and self.on_hot_update is not None:
            self.on_hot_update("fallback")

    def write(self, record: EventRecord | RequestRecord) -> None:
        self.record(record.table, record.row(self._dt))

    def _dt(self, mono: float | None) -> datetime | None:
        return None if mono is None else datetime.fromtimestamp(mono + self._wall_offset, UTC)
