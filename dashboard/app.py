"""The Streamlit dashboard (the one module that imports streamlit): seven on-call pages over the
SQL history, on a read-only connection, refreshed live.

Started by `steersman dashboard`, which runs ``streamlit run app.py -- --db URL --refresh S``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from steersman.dashboard import charts, data
from steersman.storage.engine import make_read_only_engine, mask_url
from steersman.storage.query import percentile

INSTANCE_COLUMNS = [
    "instance",
    "healthy",
    "running",
    "waiting",
    "kv_cache_usage",
    "preemptions_total",
    "step_s",
    "profiled_step_s",
]
PAGES = ("Overview", "Predictions", "Controller", "GPUs", "Instances", "QoE", "Models")
WINDOWS = {
    "15 minutes": timedelta(minutes=15),
    "1 hour": timedelta(hours=1),
    "6 hours": timedelta(hours=6),
    "24 hours": timedelta(hours=24),
    "7 days": timedelta(days=7),
    "all": None,
}


@dataclass(frozen=True)
class Window:
    """The span a page shows: from ``since`` (None: the whole history) to ``until``."""

    since: datetime | None
    until: datetime


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="steersman dashboard")
    parser.add_argument("--db", required=True)
    parser.add_argument("--refresh", type=float, default=5.0)
    args, _ = parser.parse_known_args(sys.argv[1:])
    return args


@st.cache_resource
def _engine(url: str):  # one read-only pool per database for the whole server
    return make_read_only_engine(url)


def _chart(chart) -> None:
    st.altair_chart(chart)


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    return f"{value:.{digits}g}{unit}"


def overview(engine, window: Window) -> None:
    since = window.since
    st.title("Overview")
    reqs, evts = data.requests(engine, since), data.events(engine, since)
    o = data.overview(reqs, evts, data.models(engine))
    if not o["requests"]:
        st.info("No requests recorded in this window yet.")
    a, b, c, d = st.columns(4)
    since_text = "" if o["mode_since"] is None else f"since {o['mode_since']:%H:%M:%S}"
    a.metric("Mode", o["mode"], since_text, delta_color="off")
    b.metric("Miss streak", o["miss_streak"])
    c.metric("Within 30%", _fmt(o["within_30"] and 100 * o["within_30"], "%"))
    d.metric("MAE (tokens)", _fmt(o["mae_tokens"], digits=4))
    st.caption(f"Mode reason: {o['mode_reason']}")
    a, b, c, d = st.columns(4)
    a.metric("Requests", o["requests"])
    b.metric("Requests/s", _fmt(o["rps"]))
    c.metric("Failed", o["errors"])
    d.metric("Model", o["model_version"])
    table = pd.DataFrame(
        {
            "TTFT (s)": [o["ttft"][q] for q in ("p50", "p95", "p99")],
            "E2E (s)": [o["e2e"][q] for q in ("p50", "p95", "p99")],
        },
        index=["P50", "P95", "P99"],
    )
    st.dataframe(table)
    if o["ttft_healthy"] is True:
        st.success("TTFT P95 <= 2x P50: healthy")
    elif o["ttft_healthy"] is False:
        st.warning("TTFT P95 > 2x P50: tail latency is growing")


def predictions(engine, window: Window) -> None:
    since = window.since
    st.title("Predictions")
    reqs = data.requests(engine, since)
    done = reqs[reqs["actual_tokens"].notna()] if len(reqs) else reqs
    if not len(done):
        st.info("No finished requests in this window yet.")
        return
    _chart(charts.predicted_vs_actual(done))
    _chart(charts.error_histogram(done))
    st.subheader("Band coverage per request class")
    st.caption(
        "Each prediction comes with a band (by default the 10th to 90th percentile of recent "
        "errors, calibrated online per class): the share of actual lengths inside it should "
        "hold at the band's coverage. A miss is an actual length more than 30% outside the band "
        "the request was scheduled with."
    )
    coverage = data.band_coverage(done)
    if len(coverage):
        _chart(charts.lines(coverage, "ts", "coverage", "request_class", "band coverage"))
    else:
        st.caption("No banded predictions in this window.")
    left, right = st.columns(2)
    left.subheader("By request class")
    left.dataframe(data.accuracy_by(done, "request_class"), hide_index=True)
    right.subheader("By predictor path")
    right.dataframe(data.accuracy_by(done, "predictor_path"), hide_index=True)
    evts = data.events(engine, since)
    drifts = evts[evts["kind"].isin(["drift", "model", "retrain"])] if len(evts) else evts
    st.subheader("Drift, retraining and model events")
    if len(drifts):
        st.dataframe(drifts[["ts", "kind", "reason"]], hide_index=True)
    else:
        st.caption("None in this window.")


def controller(engine, window: Window) -> None:
    since = window.since
    st.title("Controller")
    evts = data.events(engine, since)
    periods = data.fallback_periods(evts, window.until)
    st.subheader(f"FALLBACK periods: {len(periods)}")
    timeline = data.mode_periods(evts, since, window.until)
    if len(timeline):
        start = since if since is not None else timeline["start"].min()
        _chart(charts.mode_timeline(timeline, start, window.until))
    if len(periods):
        st.dataframe(periods, hide_index=True)
    else:
        st.caption("No FALLBACK in this window.")
    reqs = data.requests(engine, since)
    done = reqs[reqs["actual_tokens"].notna()] if len(reqs) else reqs
    shares = data.loop_shares(done)
    st.subheader("Miss rate, FALLBACK share and fast-path share")
    if len(shares):
        _chart(charts.lines(shares, "ts", "value", "share", "share of requests"))
    else:
        st.caption("No finished requests in this window.")
    comp = data.compensation(evts)
    st.subheader("Compensation per request class (scheduled = a x predicted + b)")
    if len(comp):
        _chart(charts.lines(comp, "ts", "a", "request_class", "a"))
        st.dataframe(comp, hide_index=True)
    else:
        st.caption("Compensation has not changed in this window (a = 1.2, b = 10 by default).")


def gpus(engine, window: Window) -> None:
    since = window.since
    st.title("GPUs")
    tel = data.telemetry(engine, since)
    if not len(tel):
        st.info("No GPU telemetry: no NVML GPU on the serving host, or none in this window.")
        return
    tel = tel.assign(gpu=tel["gpu_index"].astype(str))
    for column, title in (
        ("sm_activity", "SM activity"),
        ("sm_occupancy", "SM occupancy"),
        ("temperature_c", "temperature (C)"),
        ("sm_clock_mhz", "SM clock (MHz)"),
        ("power_w", "power (W)"),
        ("fragmentation", "fragmentation"),
    ):
        series = tel[tel[column].notna()]
        if len(series):
            _chart(charts.lines(series, "ts", column, "gpu", title))
    throttled = tel[tel["throttle_reasons"].fillna(0) > 0]
    st.subheader("Throttling")
    if len(throttled):
        st.dataframe(throttled[["ts", "gpu", "throttle_reasons"]], hide_index=True)
    else:
        st.caption("No throttle reasons reported.")


def instances(engine, window: Window) -> None:
    since = window.since
    st.title("Instances")
    stats = data.instance_stats(engine, since)
    reqs = data.requests(engine, since)
    done = reqs[reqs["actual_tokens"].notna()] if len(reqs) else reqs
    if not len(stats) and not len(done):
        st.info("No instance data in this window yet.")
        return
    if len(stats):
        latest = stats.groupby("instance").tail(1)
        st.dataframe(
            latest[INSTANCE_COLUMNS],
            hide_index=True,
        )
        for column, title in (
            ("running", "running"),
            ("waiting", "waiting"),
            ("kv_cache_usage", "KV usage"),
        ):
            series = stats[stats[column].notna()]
            if len(series):
                _chart(charts.lines(series, "ts", column, "instance", title))
    steps = data.step_times(stats) if len(stats) else stats
    if len(steps):
        st.subheader("Decode step time: learned vs profiled")
        st.caption(
            "One decode step with one sequence, as each instance's latency model plans with it "
            "(its outcomes and its GPU's clock) and as its profile says."
        )
        _chart(charts.lines(steps, "ts", "seconds", "series", "step time (s)"))
    hits = data.prefix_hits(stats) if len(stats) else stats
    if len(hits):
        st.subheader("Prefix-cache hit rate (as the servers report it)")
        st.dataframe(hits, hide_index=True)
    if len(done):
        st.subheader("Latency per instance")
        st.dataframe(data.instance_latency(done), hide_index=True)
    evts = data.events(engine, since)
    health = evts[evts["kind"] == "instance"] if len(evts) else evts
    st.subheader("Health changes")
    if len(health):
        st.dataframe(health[["ts", "reason"]], hide_index=True)
    else:
        st.caption("No instance was marked down in this window.")


def qoe(engine, window: Window) -> None:
    st.title("QoE")
    reqs = data.requests(engine, window.since)
    done = reqs[reqs["qoe"].notna()] if len(reqs) else reqs
    if not len(done):
        st.info("No streamed requests with a QoE in this window yet.")
        return
    st.caption(
        "Quality of experience of each streamed answer (Andes): 1 when tokens kept ahead of "
        "a reader who expected the first token within the expected TTFT and then one every "
        "expected pace; less the further the stream fell behind."
    )
    q = list(done["qoe"])
    a, b, c, d = st.columns(4)
    a.metric("Streams", len(q))
    b.metric("QoE mean", _fmt(sum(q) / len(q)))
    c.metric("QoE p10", _fmt(percentile(q, 0.10)))
    d.metric("Fell behind (QoE < 0.9)", _fmt(100 * sum(v < 0.9 for v in q) / len(q), "%"))
    over_time = data.qoe_over_time(done)
    if len(over_time):
        _chart(charts.lines(over_time, "ts", "value", "series", "QoE"))
    _chart(charts.qoe_histogram(done))
    left, right = st.columns(2)
    left.subheader("By request class")
    left.dataframe(data.qoe_by(done, "request_class"), hide_index=True)
    right.subheader("By instance")
    right.dataframe(data.qoe_by(done, "instance"), hide_index=True)


def models(engine, _window: Window) -> None:
    st.title("Models")
    rows = data.models(engine)
    if not len(rows):
        st.info("No model versions registered: `steersman train --promote` registers one.")
        return
    promoted = rows[rows["status"] == "promoted"]
    if len(promoted):
        st.metric("Promoted", promoted.iloc[0]["version"])
    st.dataframe(rows, hide_index=True)


RENDER = {
    "Overview": overview,
    "Predictions": predictions,
    "Controller": controller,
    "GPUs": gpus,
    "Instances": instances,
    "QoE": qoe,
    "Models": models,
}


def main() -> None:
    args = _args()
    st.set_page_config(page_title="steersman", layout="wide")
    wanted = st.query_params.get("page", "Overview")
    page = st.sidebar.radio("Page", PAGES, index=PAGES.index(wanted) if wanted in PAGES else 0)
    window = st.sidebar.selectbox("Time window", list(WINDOWS), index=1)
    st.sidebar.caption(f"History: {mask_url(args.db)}; refresh every {args.refresh:g} s")
    engine = _engine(args.db)

    @st.fragment(run_every=args.refresh)
    def body() -> None:
        problem = data.problem(engine)
        if problem:
            st.title(page)
            st.error(problem)
            return
        now = data.now_utc()
        try:
            since, note = data.window_start(WINDOWS[window], now, data.last_activity(engine))
            until = now if note is None else since + WINDOWS[window]
            if note:
                st.info(note)
            RENDER[page](engine, Window(since, until))
        except SQLAlchemyError as exc:
            st.error(f"The database failed a query: {str(getattr(exc, 'orig', exc)).strip()}")

    body()


if __name__ == "__main__":  # streamlit runs this file as __main__
    main()
