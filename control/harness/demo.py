"""The newcomer's path: the whole loop on a laptop with no GPU, started, driven and stopped.

Builds (or reuses) the tiny served model and a small RoBERTa length model, starts two vLLM CPU
servers (or two simulated instances), runs the daemon in process on SQLite, replays real prompts
at real (time-scaled) arrival times through the OpenAI-compatible gateway, and summarises.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import text

from steersman.control.backends.envoy_proxy import EnvoyProxy
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.backends.vllm_server import VllmServer, free_port
from steersman.control.harness.replay import Replayed, replay
from steersman.control.harness.workloads import WorkItem, build_workload, load_trace, trace_arrivals
from steersman.control.serve.daemon import Daemon, serving
from steersman.control.serve.settings import Settings, derive
from steersman.control.training.bundled import bundled_records, held_out
from steersman.data import path
from steersman.learners.tokens import TokenCounter
from steersman.storage.engine import make_engine
from steersman.storage.query import percentile

MAX_MODEL_LEN = 1024


def demo_workload(
    counter: TokenCounter, rate: float, duration_s: float, seed: int
) -> list[WorkItem]:
    """Azure conversation arrivals scaled to ``rate`` for ``duration_s``, held-out prompts."""
    rng = random.Random(seed)
    n = max(1, round(rate * duration_s))
    times = trace_arrivals(load_trace(path("azure_conv")), n, rate, rng)
    _, prompts = held_out(bundled_records())
    return build_workload(prompts, times, counter, rng, max_model_len=MAX_MODEL_LEN)


@dataclass
class DemoConfig:
    backend: str  # "vllm" or "sim"
    run_dir: Path
    model_dir: Path
    length_model: Path
    vllm_python: str
    policy: str = "predictive"
    front: str = "gateway"  # or "envoy": a real Envoy carries the bytes, steersman picks
    max_in_flight: int = 32
    # CPU priority of the servers where they share cores with the daemon (``nice`` levels).
    server_nice: int = 0
    # steersman's vLLM scheduler class is loaded; it acts only on requests that carry predictions
    # (instances[].predictions, which the bench's class variant turns on).
    server_args: tuple[str, ...] = (
        "--scheduler-cls",
        "steersman.control.backends.vllm_scheduler.SteersmanScheduler",
    )


@contextlib.contextmanager
def instances(config: DemoConfig) -> Iterator[list[dict[str, Any]]]:
    """[[instances]] tables for the daemon: two vLLM CPU servers (stopped on exit) or two
    simulated instances calibrated on them."""
    if config.backend == "sim":
        yield [
            {"name": f"sim-{k}", "sim": "cpu-tiny", "max_in_flight": config.max_in_flight}
            for k in range(2)
        ]
        return
    servers = [
        VllmServer(
            config.vllm_python,
            config.model_dir,
            free_port(),
            core=core,
            max_model_len=MAX_MODEL_LEN,
            log_dir=config.run_dir,
            extra_args=config.server_args,
            nice=config.server_nice,
        )
        for core in (0, 1)
    ]
    try:
        for server in servers:
            server.check()
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy(timeout_s=600)
        yield [
            {
                "name": f"vllm-{k}",
                "url": s.url,
                "profile": "cpu-tiny",
                "max_in_flight": config.max_in_flight,
            }
            for k, s in enumerate(servers)
        ]
    finally:
        for server in servers:
            server.stop()


def daemon_settings(
    config: DemoConfig,
    specs: list[dict[str, Any]],
    base: Settings,
    extra: dict[str, dict[str, Any]] | None = None,
) -> Settings:
    """The daemon's settings for a run: the operator's settings, with this run's database,
    instances and models (and ``extra`` sections merged over them)."""
    overrides: dict[str, Any] = {
        "data_dir": str(config.run_dir),
        "storage": {"url": f"sqlite:///{config.run_dir / 'steersman.db'}"},
        "instances": specs,
        "predictor": {
            "model_dir": str(config.length_model),
            "tokenizer_dir": str(config.model_dir),
            "max_tokens_is_length": True,  # the replay's max_tokens is the true length
        },
        "dispatch": {"policy": config.policy},
        "jobs": {"retrain_on_fallback": False},  # two cores: keep them for serving
        "log_level": "WARNING",
    }
    for key, value in (extra or {}).items():
        overrides[key] = {**overrides.get(key, {}), **value}
    return derive(base, overrides)  # the run's instances replace the operator's list


def run_replay(
    url: str,
    items: list[WorkItem],
    on_outcome: Callable[[Replayed], None] | None = None,
    extra_body: dict[str, Any] | None = None,
) -> tuple[list[Replayed], float]:
    """Send the workload through the gateway as an OpenAI client would; (outcomes, wall s)."""

    async def go() -> list[Replayed]:
        # vllm=True: ask for per-chunk usage (exact token times); steersman passes it through.
        backend = VllmHttpBackend("steersman", url, read_timeout_s=300)
        try:
            models = await backend.models()
            model = models[0]["id"] if models else "tiny"
            return await replay(
                items, backend, model=model, on_outcome=on_outcome, extra_body=extra_body
            )
        finally:
            await backend.aclose()

    started = time.monotonic()
    outcomes = asyncio.run(go())
    return outcomes, time.monotonic() - started


def history_summary(database_url: str) -> dict[str, Any]:
    """Prediction accuracy and controller activity of the run, from its SQL history."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT predictor_path, miss, scheduled_prediction, actual_tokens "
                    "FROM requests WHERE actual_tokens IS NOT NULL"
                )
            ).all()
            fallbacks = conn.execute(
                text("SELECT COUNT(*) FROM controller_events WHERE to_mode = 'FALLBACK'")
            ).scalar_one()
            compensation = conn.execute(
                text("SELECT COUNT(*) FROM controller_events WHERE kind = 'compensation'")
            ).scalar_one()
    finally:
        engine.dispose()
    scored = [r for r in rows if r.miss is not None]
    paths: dict[str, int] = {}
    for r in rows:
        paths[r.predictor_path] = paths.get(r.predictor_path, 0) + 1
    errors = [abs(r.scheduled_prediction - r.actual_tokens) for r in rows]
    return {
        "scored": len(scored),
        "within_30": round(sum(1 for r in scored if not r.miss) / len(scored), 3)
        if scored
        else None,
        "mae_tokens": round(sum(errors) / len(errors), 1) if errors else None,
        "paths": paths,
        "fallbacks": fallbacks,
        "compensation_changes": compensation,
    }


def summarize_run(outcomes: list[Replayed], wall_s: float, history: dict[str, Any]) -> dict:
    ok = [o for o in outcomes if o.ok]

    def pct(name: str, q: float) -> float | None:
        values = [getattr(o, name) for o in ok if getattr(o, name) is not None]
        value = percentile(values, q)
        return None if value is None else round(value, 4)

    return {
        "requests": len(outcomes),
        "succeeded": len(ok),
        "failed": len(outcomes) - len(ok),
        "wall_s": round(wall_s, 1),
        "ttft_p50_s": pct("ttft_s", 0.5),
        "ttft_p99_s": pct("ttft_s", 0.99),
        "e2e_p50_s": pct("e2e_s", 0.5),
        "e2e_p99_s": pct("e2e_s", 0.99),
        "qoe_mean": round(sum(o.qoe for o in ok) / len(ok), 4) if ok else None,
        "errors": sorted({o.error for o in outcomes if o.error})[:3],
        "prediction": history,
    }


@contextlib.contextmanager
def front_door(
    config: DemoConfig, daemon: Daemon, specs: list[dict[str, Any]]
) -> Iterator[str | None]:
    """Envoy in front of the servers with steersman as its endpoint picker, or nothing (the
    gateway is the front)."""
    if config.front != "envoy":
        yield None
        return
    servers = [urlsplit(spec["url"]).netloc for spec in specs]
    picker = f"127.0.0.1:{daemon.epp_port}"
    with EnvoyProxy(picker, servers, config.run_dir / "envoy", observe=True) as envoy:
        yield envoy.url
        # Envoy hands each answer to the picker's observing filter without waiting for it, so a
        # client can have its last token before steersman has read it: stopping Envoy then would
        # cut those answers short, and steersman would learn nothing from them.
        deadline = time.monotonic() + daemon.settings.gateway.drain_timeout_s
        while daemon.legs and time.monotonic() < deadline:
            time.sleep(0.02)


def run_demo(
    config: DemoConfig,
    base: Settings,
    items: list[WorkItem],
    on_outcome: Callable[[Replayed], None] | None = None,
    on_serving: Callable[[Daemon], None] | None = None,
) -> dict[str, Any]:
    """Start everything, replay, stop everything (also on Ctrl-C); the run's summary."""
    config.run_dir.mkdir(parents=True, exist_ok=True)
    envoy = config.front == "envoy"
    with instances(config) as specs:
        extra = {"epp": {"enabled": True, "port": 0}} if envoy else None
        settings = daemon_settings(config, specs, base, extra)
        daemon = Daemon(settings)
        with serving(daemon) as url, front_door(config, daemon, specs) as front_url:
            if on_serving is not None:
                on_serving(daemon)
            outcomes, wall = run_replay(front_url or url, items, on_outcome)
    summary = summarize_run(outcomes, wall, history_summary(settings.database_url))
    summary["backend"] = config.backend
    summary["front"] = config.front
    summary["policy"] = config.policy
    summary["database"] = settings.database_url
    summary["dashboard"] = f"steersman dashboard --db {settings.database_url}"
    return summary
