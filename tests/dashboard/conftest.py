"""A history database filled by a simulated replay through the real daemon, and an empty one."""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert

from steersman.control.harness.demo import run_replay
from steersman.control.harness.workloads import build_workload, poisson_arrivals
from steersman.data import path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.tokens import TokenCounter
from steersman.storage import migrate
from steersman.storage.engine import make_engine
from steersman.storage.models import ModelVersionRow, TelemetryRow
from tests.control.serve.serving import running, settings_for

REPLAYED = 40


@pytest.fixture(scope="session")
def populated_url(tmp_path_factory, tiny_model) -> str:
    tmp = tmp_path_factory.mktemp("dash")
    url = f"sqlite:///{tmp / 'history.db'}"
    settings = settings_for(
        tmp,
        [{"name": "sim-a", "sim": "cpu-tiny"}, {"name": "sim-b", "sim": "cpu-tiny"}],
        storage={"url": url},
        # A twitchy controller on the point rule (which heavy-tailed lengths mostly miss), so
        # the replay leaves fallbacks and compensation changes.
        controller={"miss_rule": "point", "miss_streak": 2, "adjust_every": 5, "fallback_s": 5},
        predictor={"max_tokens_is_length": True, "tokenizer_dir": str(tiny_model)},
    )
    rng = random.Random(3)
    records = load_prompt_set(path("alpaca"))[0][:200]
    items = build_workload(
        records, poisson_arrivals(REPLAYED, 8.0, rng), TokenCounter(tiny_model), rng,
        max_tokens_cap=60,
    )  # fmt: skip
    with running(settings) as (daemon, gateway):
        outcomes, _ = run_replay(gateway, items)
        assert all(o.ok for o in outcomes)
        assert daemon.writer.flush(20)
    engine = make_engine(url)
    now = datetime.now(UTC)
    with engine.begin() as conn:  # what the NVML sampler writes on a GPU host
        conn.execute(
            insert(TelemetryRow),
            [
                {
                    "ts": now - timedelta(seconds=60 - s),
                    "gpu_index": gpu,
                    "method": "gpm",
                    "samples": 20,
                    "sm_activity": 0.5 + 0.01 * s,
                    "sm_occupancy": 0.3,
                    "temperature_c": 60.0 + gpu,
                    "sm_clock_mhz": 1980.0,
                    "power_w": 350.0,
                    "throttle_reasons": 0 if s < 50 else 0x20,
                    "fragmentation": 0.1,
                }
                for gpu in (0, 1)
                for s in range(60)
            ],
        )
        conn.execute(
            insert(ModelVersionRow),
            [
                {
                    "version": "roberta-test-1",
                    "created_at": now,
                    "kind": "roberta",
                    "status": "promoted",
                    "train_rows": 800,
                    "val_rows": 200,
                    "metrics": {"val_within_30": 0.31},
                }
            ],
        )
    engine.dispose()
    return url


@pytest.fixture
def empty_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def unmigrated_url(tmp_path) -> str:
    """A database file with none of steersman's tables."""
    sqlite3.connect(tmp_path / "nothing.db").execute(
        "CREATE TABLE other (x INTEGER)"
    ).connection.commit()
    return f"sqlite:///{tmp_path / 'nothing.db'}"


UNREACHABLE_URL = "postgresql://nobody@127.0.0.1:1/none"


def app_path() -> Path:
    from steersman.control.cli.dashboard_cmd import APP

    return APP
