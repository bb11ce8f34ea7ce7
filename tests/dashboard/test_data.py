"""The dashboard's data functions on a history filled by a simulated replay, without Streamlit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from steersman.dashboard import data
from steersman.storage.engine import make_read_only_engine
from tests.dashboard.conftest import REPLAYED, UNREACHABLE_URL


def test_overview_numbers_match_the_history(populated_url):
    engine = make_read_only_engine(populated_url)
    reqs, evts = data.requests(engine, None), data.events(engine, None)
    o = data.overview(reqs, evts, data.models(engine))
    assert o["requests"] == o["finished"] == REPLAYED and o["errors"] == 0
    misses = reqs["miss"].astype(bool)
    assert o["within_30"] == 1 - misses.sum() / REPLAYED
    assert o["ttft"]["p50"] <= o["ttft"]["p95"] <= o["ttft"]["p99"]
    assert o["e2e"]["p99"] == max(reqs["e2e_s"])
    assert o["mode"] in ("NORMAL", "FALLBACK") and o["mode_reason"]
    trailing = 0
    modes = evts[evts["kind"] == "mode"]
    since = reqs["finished_at"] > modes["ts"].iloc[-1] if len(modes) else reqs["miss"].notna()
    for miss in reversed(list(reqs[since]["miss"].astype(bool))):
        if not miss:
            break
        trailing += 1
    assert o["miss_streak"] == trailing
    assert o["model_version"] == "roberta-test-1"  # nothing served by RoBERTa: the promoted one


def test_accuracy_fallbacks_compensation_and_instances(populated_url):
    engine = make_read_only_engine(populated_url)
    reqs, evts = data.requests(engine, None), data.events(engine, None)
    by_class = data.accuracy_by(reqs, "request_class")
    assert by_class["requests"].sum() == REPLAYED
    assert ((by_class["within_30"] >= 0) & (by_class["within_30"] <= 1)).all()
    periods = data.fallback_periods(evts, datetime.now(UTC))
    entered = (evts["to_mode"] == "FALLBACK").sum()
    assert len(periods) == entered >= 1  # the twitchy controller fell back
    assert (periods["end"] >= periods["start"]).all()
    comp = data.compensation(evts)
    assert len(comp) == (evts["kind"] == "compensation").sum() >= 1
    assert comp["a"].between(0.5, 3.0).all()
    latency = data.instance_latency(reqs)
    assert set(latency["instance"]) == {"sim-a", "sim-b"}
    assert latency["requests"].sum() == REPLAYED
    stats = data.instance_stats(engine, None)
    assert set(stats["instance"]) == {"sim-a", "sim-b"}
    steps = data.step_times(stats)
    assert set(steps["series"]) == {
        f"sim-{k} ({kind})" for k in "ab" for kind in ("learned", "profiled")
    }
    assert (steps["seconds"] > 0).all()


def test_time_window_filters(populated_url):
    engine = make_read_only_engine(populated_url)
    future = datetime.now(UTC) + timedelta(hours=1)
    assert len(data.requests(engine, future)) == 0
    assert len(data.telemetry(engine, future)) == 0
    assert len(data.telemetry(engine, None)) == 120


def test_problems_are_described(empty_url, unmigrated_url):
    assert data.problem(make_read_only_engine(empty_url)) is None
    assert "steersman db upgrade" in data.problem(make_read_only_engine(unmigrated_url))
    assert data.problem(make_read_only_engine(UNREACHABLE_URL)).startswith(
        "Cannot reach the database"
    )


def test_empty_history_gives_empty_answers(empty_url):
    engine = make_read_only_engine(empty_url)
    reqs, evts = data.requests(engine, None), data.events(engine, None)
    o = data.overview(reqs, evts, data.models(engine))
    assert o["requests"] == 0 and o["within_30"] is None and o["ttft"]["p50"] is None
    assert o["mode"] == "NORMAL" and o["model_version"] == "fast predictor"
    assert len(data.fallback_periods(evts, datetime.now(UTC))) == 0
    assert len(data.accuracy_by(reqs, "request_class")) == 0


def test_qoe_per_group_and_over_time():
    t0 = pd.Timestamp("2026-12-02 10:00:00", tz="UTC")
    done = pd.DataFrame(
        {
            "request_class": ["chat", "chat", "code", "code", "chat"],
            "instance": ["a", "b", "a", "b", "a"],
            "qoe": [1.0, 0.5, 0.95, None, 0.8],
            "expected_ttft_s": [1.0, 1.0, 2.0, 2.0, 0.5],
            "expected_pace_s": [0.2, 0.2, 0.05, 0.05, 0.2],
            "finished_at": [t0, t0, t0 + pd.Timedelta(minutes=1), t0, t0 + pd.Timedelta(minutes=1)],
        }
    )
    by_class = data.qoe_by(done, "request_class").set_index("request_class")
    assert by_class.loc["chat", "streams"] == 3 and by_class.loc["code", "streams"] == 1
    assert by_class.loc["chat", "below_0_9"] == pytest.approx(2 / 3)
    assert by_class.loc["chat", "qoe_mean"] == pytest.approx(2.3 / 3)
    assert by_class.loc["code", "expected_ttft_s"] == 2.0
    assert by_class.loc["chat", "expected_pace_s"] == 0.2
    over = data.qoe_over_time(done)
    first = over[over["ts"] == t0].set_index("series")["value"]
    assert first["mean"] == pytest.approx(0.75) and first["share < 0.9"] == pytest.approx(0.5)
    assert set(over["series"]) == {"mean", "p10", "share < 0.9"} and len(over) == 6
