"""Every dashboard page through Streamlit's AppTest: populated, empty, unmigrated, unreachable."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta

import pandas as pd
import pyarrow as pa
import pytest
from sqlalchemy import insert
from streamlit.testing.v1 import AppTest

from steersman.dashboard.app import PAGES
from steersman.storage import migrate
from steersman.storage.engine import make_engine
from steersman.storage.models import ControllerEventRow, RequestRow
from tests.dashboard.conftest import REPLAYED, UNREACHABLE_URL, app_path
from tests.rows import request_row


def page(monkeypatch, url: str, name: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", "--db", url, "--refresh", "60"])
    at = AppTest.from_file(str(app_path()), default_timeout=60)
    at.run()
    at.sidebar.radio[0].set_value(name)
    at.sidebar.selectbox[0].set_value("all")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == name
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_the_populated_history(monkeypatch, populated_url, name):
    at = page(monkeypatch, populated_url, name)
    assert not at.error, [e.value for e in at.error]
    if name == "Overview":
        assert metric(at, "Requests") == str(REPLAYED)
        assert metric(at, "Failed") == "0"
        assert metric(at, "Mode") in ("NORMAL", "FALLBACK")
        assert metric(at, "Model") == "roberta-test-1"
        assert at.dataframe[0].value.index.tolist() == ["P50", "P95", "P99"]
    elif name == "Predictions":
        assert len(at.get("vega_lite_chart")) == 3  # predicted vs actual, errors, coverage
        assert "Band coverage per request class" in [h.value for h in at.subheader]
        classes = at.dataframe[0].value
        assert classes["requests"].sum() == REPLAYED
    elif name == "Controller":
        assert at.subheader[0].value.startswith("FALLBACK periods: ")
        assert int(at.subheader[0].value.split(": ")[1]) >= 1
    elif name == "GPUs":
        assert len(at.get("vega_lite_chart")) == 6
        assert len(at.dataframe[0].value) == 2 * 10  # throttled readings
    elif name == "Instances":
        latest = at.dataframe[0].value
        assert set(latest["instance"]) == {"sim-a", "sim-b"}
        assert (latest["step_s"] > 0).all() and (latest["profiled_step_s"] > 0).all()
        assert "Decode step time: learned vs profiled" in [h.value for h in at.subheader]
    elif name == "QoE":
        assert int(metric(at, "Streams")) == REPLAYED  # every replayed request streamed
        assert 0 < float(metric(at, "QoE mean")) <= 1
        assert len(at.get("vega_lite_chart")) == 2  # over time, histogram
        by_class, by_instance = at.dataframe[0].value, at.dataframe[1].value
        assert by_class["streams"].sum() == by_instance["streams"].sum() == REPLAYED
        assert set(by_instance["instance"]) == {"sim-a", "sim-b"}
        assert (by_class["expected_ttft_s"] == 1.0).all()
    elif name == "Models":
        assert metric(at, "Promoted") == "roberta-test-1"


@pytest.mark.parametrize("name", PAGES)
def test_every_page_says_plainly_when_there_is_nothing(monkeypatch, empty_url, name):
    at = page(monkeypatch, empty_url, name)
    assert not at.error
    if name == "Overview":
        assert metric(at, "Requests") == "0"
        assert "No requests recorded" in at.info[0].value
    elif name == "GPUs":
        assert "No GPU telemetry" in at.info[0].value
    elif name in ("Predictions", "Instances", "Models"):
        assert at.info, name


@pytest.mark.parametrize(
    ("fixture", "message"),
    [("unmigrated_url", "steersman db upgrade"), (None, "Cannot reach the database")],
)
def test_database_problems_are_messages_not_tracebacks(monkeypatch, request, fixture, message):
    url = request.getfixturevalue(fixture) if fixture else UNREACHABLE_URL
    for name in ("Overview", "GPUs"):
        at = page(monkeypatch, url, name)
        assert message in at.error[0].value


@pytest.fixture
def old_history_url(tmp_path) -> str:
    """A history whose requests and FALLBACK period ended three hours ago (a demo, earlier)."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    start = datetime.now(UTC) - timedelta(hours=3)
    rows = [request_row(i, received_at=start + timedelta(seconds=i)) for i in range(30)]
    fallback = start + timedelta(seconds=10)
    events = [
        {"ts": fallback, "kind": "mode", "from_mode": "NORMAL", "to_mode": "FALLBACK",
         "reason": "5 misses in a row"},
        {"ts": fallback + timedelta(seconds=42), "kind": "mode", "from_mode": "FALLBACK",
         "to_mode": "NORMAL", "reason": "shadow predictions recovered"},
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(RequestRow), rows)
        conn.execute(insert(ControllerEventRow), events)
    engine.dispose()
    return url


def test_a_quiet_window_shows_the_span_the_history_holds(monkeypatch, old_history_url):
    monkeypatch.setattr(sys, "argv", ["app.py", "--db", old_history_url, "--refresh", "60"])
    at = AppTest.from_file(str(app_path()), default_timeout=60)
    at.run()  # the default window: the last hour, in which nothing happened
    assert not at.exception and not at.error
    assert "showing the 1 hour up to the last activity" in at.info[0].value
    assert metric(at, "Requests") == "30"
    at.sidebar.radio[0].set_value("Controller")
    at.run()
    assert at.subheader[0].value == "FALLBACK periods: 1"
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    start, end = (_vega_time(t) for t in spec["encoding"]["x"]["scale"]["domain"])
    assert end - start == pd.Timedelta(hours=1)  # the axis is the window, not 42 s of FALLBACK
    drawn = at.get("vega_lite_chart")[0].proto.datasets[0].data.data
    assert set(pa.ipc.open_stream(drawn).read_pandas()["mode"]) == {"NORMAL", "FALLBACK"}


def _vega_time(t: dict) -> pd.Timestamp:
    """A Vega-Lite datetime object (as Altair writes a datetime) as a timestamp."""
    return pd.Timestamp(
        year=t["year"], month=t["month"], day=t["date"], hour=t["hours"], minute=t["minutes"],
        second=t["seconds"], microsecond=1000 * t["milliseconds"], tz="UTC",
    )  # fmt: skip
