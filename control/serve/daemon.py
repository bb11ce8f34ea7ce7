"""`steersman serve`: wires the whole loop from the settings tree and runs it under uvicorn.

SIGTERM (or Ctrl-C) stops intake, lets in-flight requests finish for ``drain_timeout_s``, writes
a last checkpoint, flushes the history writer and exits 0. On start the learned state comes back
from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from steersman.control.backends.routed import Leg, Routed
from steersman.control.backends.vllm_server import check_port
from steersman.control.core.records import EventRecord
from steersman.control.core.scheduler import Scheduler
from steersman.control.serve import checkpoint as ckpt
from steersman.control.serve import epp
from steersman.control.serve.gateway import create_app, discover_models
from steersman.control.serve.instances import make_instance
from steersman.control.serve.jobs import PeriodicJobs
from steersman.control.serve.load import LoadWatcher
from steersman.control.serve.metrics import Metrics
from steersman.control.serve.predictor import Predictor
from steersman.control.serve.served_model import ServedModel, load_length_model, validation_errors
from steersman.control.serve.service import Steersman
from steersman.control.serve.settings import Settings
from steersman.control.training.retrain import Retrainer, retrain_base
from steersman.learners.corrector import LengthCorrector
from steersman.learners.tokens import TokenCounter
from steersman.storage import checkpoints as shared
from steersman.storage import migrate
from steersman.storage.engine import DatabaseUnavailable, make_engine
from steersman.storage.retention import apply_retention
from steersman.storage.writer import HistoryWriter
from steersman.telemetry.gpus import make_sampler

log = logging.getLogger(__name__)


class Daemon:
    """Everything ``serve`` runs, built from settings; ``app`` is the ASGI application."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        s = settings
        self.engine = make_engine(s.database_url, busy_timeout_ms=s.storage.sqlite_busy_timeout_ms)
        with contextlib.suppress(DatabaseUnavailable):
            migrate.upgrade(self.engine)
        st = s.storage
        self.writer = HistoryWriter(
            self.engine,
            s.spill_dir,
            batch_size=st.batch_size,
            flush_interval_s=st.flush_interval_s,
            queue_size=st.queue_size,
            retry_initial_s=st.retry_initial_s,
            retry_max_s=st.retry_max_s,
        )
        self.sampler = (
            make_sampler(s.telemetry, sink=lambda row: self.writer.submit("telemetry", row))
            if s.telemetry.enabled
            else None
        )
        count = tokenize = None
        if s.predictor.tokenizer_dir is not None:
            counter = TokenCounter(s.predictor.tokenizer_dir)
            count, tokenize = counter.count, counter.ids
        model, version, directory = load_length_model(s.predictor, self.engine)
        corrector = LengthCorrector(
            lr=s.predictor.corrector_lr,
            max_tokens=s.predictor.max_tokens,
            coverage=s.predictor.band_coverage,
            band_window=s.predictor.band_window,
            prior_entries=s.predictor.prefix_prior_entries,
            similar_window=s.predictor.similar_prompts,
        )
        corrector.adopt_errors(validation_errors(directory))
        predictor = Predictor(
            deadline_s=s.predictor.deadline_ms / 1000, count_tokens=count, model_version=version
        )
        scheduler = Scheduler(
            s.dispatch, s.controller, corrector=corrector, origin=time.monotonic()
        )
        self.metrics = Metrics(
            self.sampler.latest if self.sampler else None, admission=lambda: scheduler.stats
        )
        sampler = self.sampler
        gpu_features = (lambda i, since: sampler.features(i, since=since)) if sampler else None
        instances = [
            make_instance(spec, s.gateway, count, gpu_features, s.qoe) for spec in s.instances
        ]
        self.legs: dict[str, Leg] = {}  # requests whose bytes Envoy carries (epp)
        if s.epp.enabled:
            for instance in instances:
                instance.backend = Routed(instance.backend, self.legs)
        self.epp_port: int | None = None
        self.service = Steersman(
            instances,
            predictor,
            scheduler,
            s,
            record=self.writer.submit,
            metrics=self.metrics,
            telemetry=self.sampler.features if self.sampler else dict,
            tokenize=tokenize,
            on_hot_update=self._hot_update,
        )
        self.model = ServedModel(
            predictor,
            s.predictor,
            s.data_dir / "models",
            event=self.event,
            forget=lambda errors: self.service.scheduler.forget(errors),
            model=model,
            directory=directory,
        )
        if s.predictor.model_dir is not None and model is None:
            self.event(
                "model",
                f"refused {s.predictor.model_dir}: cannot be loaded; the fast predictor serves",
                {"path": str(s.predictor.model_dir)},
            )
        self.checkpoint_path = s.data_dir / "checkpoints" / "state.pkl"
        self.replica = s.replica or f"{socket.gethostname()}:{s.data_dir}"
        self._checkpointing = threading.Lock()
        self.restore()
        self.retrainer = Retrainer(
            self.engine,
            s.data_dir / "models",
            swap=self.model.swap,
            event=self.event,
            current=lambda: (self.model.directory, self.service.predictor.model_version),
            budget_s=s.jobs.retrain_budget_s,
            max_rows=s.jobs.retrain_rows,
            min_gain=s.jobs.retrain_min_gain,
            device=s.predictor.device,
            base=retrain_base(s.predictor.base_model),
        )
        scheduled = s.jobs.retrain_interval_s or s.jobs.retrain_cron
        j = s.jobs
        self.jobs = PeriodicJobs(
            checkpoint=self.save_checkpoint,
            checkpoint_interval_s=j.checkpoint_interval_s,
            retention=self.retention,
            retention_interval_s=j.retention_interval_s,
            retrain=self.retrainer.run if scheduled or j.retrain_on_fallback else None,
            retrain_interval_s=j.retrain_interval_s,
            retrain_cron=j.retrain_cron,
        )
        self.app = create_app(self.service, s.gateway, lifespan=self.lifespan)
        self._stop = asyncio.Event()

    def event(self, kind: str, reason: str, details: dict[str, Any]) -> None:
        log.info("%s: %s", kind, reason)
        self.service.accounts.write(
            EventRecord(self.service.clock(), kind, reason, details=details)
        )

    def _hot_update(self, reason: str) -> None:
        if self.settings.jobs.retrain_on_fallback:
            self.jobs.retrain_now(reason)

    # -- state ---------------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        with self._checkpointing:  # the periodic job and the final one at shutdown
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        svc = self.service
        checkpoint = ckpt.Checkpoint(
            saved_at=time.time(),
            corrector=svc.scheduler.corrector,
            latency={name: i.latency for name, i in svc.instances.items()},
            controller=svc.scheduler.state,
            model_version=svc.predictor.model_version,
            clock_offset=time.time() - svc.clock(),
        )
        try:
            ckpt.save(self.checkpoint_path, checkpoint)
        except OSError as exc:
            log.error("checkpoint not written: %s", exc)
        try:  # for the other replicas, and for this one if its disk is gone
            saved = datetime.fromtimestamp(checkpoint.saved_at, UTC)
            shared.save_checkpoint(self.engine, self.replica, saved, ckpt.dumps(checkpoint))
        except (DatabaseUnavailable, SQLAlchemyError) as exc:
            log.warning("checkpoint not in the shared history (the file has it): %s", exc)

    def _newest_checkpoint(self) -> ckpt.Checkpoint | None:
        """This replica's file or the newest any replica put in the shared history."""
        mine = ckpt.load(self.checkpoint_path)
        try:
            row = shared.latest_checkpoint(self.engine)
        except (DatabaseUnavailable, SQLAlchemyError) as exc:
            log.warning("shared checkpoints not read: %s", exc)
            row = None
        if row is not None and (mine is None or row[0].timestamp() > mine.saved_at):
            theirs = ckpt.loads(row[2], f"of {row[1]} in the history")
            if theirs is not None:
                log.info("starting from the checkpoint %s saved at %s", row[1], row[0])
                return theirs
        return mine

    def restore(self) -> None:
        checkpoint = self._newest_checkpoint()
        if checkpoint is None:
            return
        svc = self.service
        svc.scheduler.corrector = checkpoint.corrector
        for name, model in checkpoint.latency.items():
            instance = svc.instances.get(name)
            if instance is None:
                continue
            if instance.latency.adopt(model, svc.clock()):
                instance.refresh(svc.clock())
            else:
                log.info("latency model of %s: the checkpoint's is of another kind, not used", name)
        # Monotonic times of the old process, moved onto this one's clock.
        shift = checkpoint.clock_offset - (time.time() - svc.clock())
        state = checkpoint.controller
        until = None if state.fallback_until is None else state.fallback_until + shift
        svc.scheduler.state = replace(state, since=state.since + shift, fallback_until=until)
        if checkpoint.model_version != svc.predictor.model_version:
            # Learned against another length model (one promoted or configured since): its
            # corrections and prompt vectors do not hold for this one; the controller's mode does.
            log.info("checkpoint of model %s, serving %s: predictions learned over",
                     checkpoint.model_version, svc.predictor.model_version)  # fmt: skip
            svc.scheduler.forget(validation_errors(self.model.directory))
        svc.metrics.set_mode(svc.scheduler.state.mode)

    def retention(self) -> None:
        j = self.settings.jobs
        try:
            done = apply_retention(
                self.engine, datetime.now(UTC), j.telemetry_retention_days, j.downsample_after_days
            )
            log.info("telemetry retention: %s", done)
        except Exception as exc:
            log.warning("telemetry retention skipped: %s", exc)

    # -- lifecycle -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # The length model's thread takes the GIL back after every torch op; at Python's 5 ms
        # switch interval a busy event loop holds it long enough to push RoBERTa past its
        # deadline (batch-1 P50 34 ms instead of 20 beside a busy thread).
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self.writer.start()
        if self.sampler is not None:
            self.sampler.start()
        await discover_models(app, self.service)
        picker = None
        if self.settings.epp.enabled:
            endpoints = epp.EndpointPicker(
                self.service,
                self.legs,
                models=lambda: app.state.models,
                max_body_bytes=self.settings.gateway.max_body_bytes,
            )
            picker, self.epp_port = await epp.start(endpoints, self.settings.epp)
        self.jobs.start()
        tasks = [
            asyncio.create_task(self._every(self.settings.service.health_interval_s, self._health)),
            asyncio.create_task(self._every(1.0, self._tick)),
            asyncio.create_task(self._load_loop()),
        ]
        log.info("steersman serving %d instance(s)", len(self.service.instances))
        if self.settings.qoe.enabled and not any(
            i.priority and i.predictions for i in self.settings.instances
        ):
            log.warning(
                "qoe.enabled: no instance runs steersman's vLLM scheduler class (instances[]."
                "predictions = true), so the engines keep their own order; steersman's queue "
                "still takes first tokens by when they are due"
            )
        try:
            yield
        finally:
            self._stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if picker is not None:
                await picker.stop(self.settings.gateway.drain_timeout_s)
            self.jobs.shutdown()
            self.save_checkpoint()
            for instance in self.service.instances.values():
                await instance.backend.aclose()
            self.close()

    def close(self) -> None:
        self.model.close()
        if self.sampler is not None:
            self.sampler.stop()
        self.writer.close(timeout=self.settings.gateway.drain_timeout_s)
        self.engine.dispose()

    async def _every(self, period_s: float, step: Callable[[], Any]) -> None:
        while not self._stop.is_set():
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("periodic task failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), period_s)

    async def _health(self) -> None:
        await self.service.check_health()
        if not self.app.state.models:
            await discover_models(self.app, self.service)

    def _tick(self) -> None:
        self.service.tick()

    async def _load_loop(self) -> None:
        async with httpx.AsyncClient() as client:
            watcher = LoadWatcher(
                list(self.service.instances.values()),
                client,
                self.settings.telemetry,
                sink=lambda row: self.writer.submit("instance_stats", row),
                in_flight=self.service.scheduler.in_flight,
                clock=self.service.clock,
            )
            self.service.no_kv_capacity = watcher.no_capacity

            async def step() -> None:
                await watcher.step()
                self.service.pump()  # the load moved: waiting requests may fit now

            await self._every(self.settings.telemetry.scrape_interval_s, step)


class GatewayFailed(RuntimeError):
    """The gateway could not start."""


@contextlib.contextmanager
def serving(daemon: Daemon, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The daemon served from a background thread (the demo, tests); yields its base URL.
    On exit it drains, checkpoints and flushes like a SIGTERM would."""
    if port:
        check_port(port, host)
    config = uvicorn.Config(daemon.app, host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="steersman-gateway", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)  # uvicorn has no start event; its flag is set on the server's loop
    if not server.started:
        raise GatewayFailed(f"the gateway did not start on {host}:{port}")
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join()


def serve(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    """Run the daemon until SIGTERM/SIGINT; returns after a clean drain."""
    g = settings.gateway
    bind_port = g.port if port is None else port
    if bind_port:
        check_port(bind_port, host or g.host)
    daemon = Daemon(settings)
    config = uvicorn.Config(
        daemon.app,
        host=host or g.host,
        port=bind_port,
        log_level=settings.log_libraries.lower(),
        timeout_graceful_shutdown=g.drain_timeout_s,
        access_log=False,
    )
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler it found:
    # with this one in place the drained process exits 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.Server(config).run()
