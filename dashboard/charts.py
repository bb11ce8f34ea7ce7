"""Altair charts of the dashboard's DataFrames (no Streamlit here either)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd


def predicted_vs_actual(done: pd.DataFrame) -> alt.Chart:
    data = done[(done["actual_tokens"] > 0) & (done["scheduled_prediction"] > 0)]
    top = float(max(data["actual_tokens"].max(), data["scheduled_prediction"].max(), 2))
    diagonal = pd.DataFrame({"x": [1.0, top], "y": [1.0, top]})
    points = (
        alt.Chart(data)
        .mark_circle(size=30, opacity=0.6)
        .encode(
            x=alt.X("actual_tokens:Q", scale=alt.Scale(type="log"), title="actual tokens"),
            y=alt.Y("scheduled_prediction:Q", scale=alt.Scale(type="log"), title="predicted"),
            color=alt.Color("predictor_path:N", title="path"),
            tooltip=["request_id", "request_class", "actual_tokens", "scheduled_prediction"],
        )
    )
    line = alt.Chart(diagonal).mark_line(color="grey", strokeDash=[4, 4]).encode(x="x", y="y")
    return (points + line).properties(height=360)


def error_histogram(done: pd.DataFrame) -> alt.Chart:
    data = done.assign(
        error_pct=100
        * (done["scheduled_prediction"] - done["actual_tokens"])
        / done["actual_tokens"]
    )
    data = data[data["error_pct"].abs() <= 500]
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("error_pct:Q", bin=alt.Bin(maxbins=40), title="error, % of actual"),
            y=alt.Y("count():Q", title="requests"),
        )
        .properties(height=260)
    )


def qoe_histogram(done: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(done)
        .mark_bar()
        .encode(
            x=alt.X("qoe:Q", bin=alt.Bin(maxbins=20, extent=[0, 1]), title="QoE"),
            y=alt.Y("count():Q", title="streams"),
            color=alt.Color("request_class:N", title="class"),
        )
        .properties(height=220)
    )


def mode_timeline(periods: pd.DataFrame, start: Any, end: Any) -> alt.Chart:
    """NORMAL and FALLBACK periods as one bar across the whole window."""
    return (
        alt.Chart(periods)
        .mark_bar(height=24)
        .encode(
            x=alt.X("start:T", title="time", scale=alt.Scale(domain=[start, end])),
            x2="end:T",
            color=alt.Color(
                "mode:N",
                scale=alt.Scale(domain=["NORMAL", "FALLBACK"], range=["#2ca02c", "#d62728"]),
            ),
            tooltip=["mode", "start:T", "end:T"],
        )
        .properties(height=80)
    )


def lines(data: pd.DataFrame, x: str, y: str, color: str, title: str) -> alt.Chart:
    return (
        alt.Chart(data)
        .mark_line(point=len(data) < 60)
        .encode(
            x=alt.X(f"{x}:T", title="time"),
            y=alt.Y(f"{y}:Q", title=title),
            color=alt.Color(f"{color}:N"),
            tooltip=[f"{x}:T", color, y],
        )
        .properties(height=220)
    )
