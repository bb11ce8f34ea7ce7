"""The daemon's periodic jobs on APScheduler 3 (the one module that imports it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger(__name__)

Job = Callable[[], Any]


class PeriodicJobs:
    """Checkpoints, telemetry retention and retraining on schedules from settings; ``retrain_now``
    queues an early retraining (the controller's hot model update). Each job runs alone: a run
    still going when its next time comes is skipped, not stacked."""

    def __init__(
        self,
        *,
        checkpoint: Job,
        checkpoint_interval_s: float,
        retention: Job,
        retention_interval_s: float,
        retrain: Job | None = None,
        retrain_interval_s: float | None = None,
        retrain_cron: str | None = None,
    ) -> None:
        self.scheduler = AsyncIOScheduler(
            # Threads, so that a job still running at shutdown finishes instead of being
            # cancelled half way (the asyncio executor cancels it and logs an error).
            executors={"default": ThreadPoolExecutor(max_workers=2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
        )
        self._retrain = retrain
        add = self.scheduler.add_job
        add(checkpoint, IntervalTrigger(seconds=checkpoint_interval_s), id="checkpoint")
        add(retention, IntervalTrigger(seconds=retention_interval_s), id="retention")
        if retrain is not None:
            if retrain_cron:
                add(retrain, CronTrigger.from_crontab(retrain_cron), id="retrain")
            elif retrain_interval_s:
                add(retrain, IntervalTrigger(seconds=retrain_interval_s), id="retrain")

    def start(self) -> None:
        self.scheduler.start()

    def retrain_now(self, reason: str) -> None:
        if self._retrain is None:
            return
        log.info("early retraining queued: %s", reason)
        self.scheduler.add_job(self._retrain, id="retrain-early", replace_existing=True)

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)


def check_cron(expression: str) -> None:
    """Raise ValueError for a crontab expression APScheduler cannot read."""
    CronTrigger.from_crontab(expression)
