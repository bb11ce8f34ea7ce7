"""The dashboard's data: plain functions from a read-only engine to DataFrames and figures.

No Streamlit here, so every number the pages show is testable on its own. Times are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.exc import SQLAlchemyError

from steersman.storage.models import (
    ControllerEventRow,
    InstanceStatsRow,
    ModelVersionRow,
    RequestRow,
    TelemetryRow,
)
from steersman.storage.query import percentile

REQUIRED_TABLES = ("requests", "controller_events", "telemetry", "instance_stats", "model_versions")


def problem(engine: Engine) -> str | None:
    """Why the dashboard cannot show this database, in words; None when it can."""
    try:
        tables = set(inspect(engine).get_table_names())
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        return f"Cannot reach the database: {reason}"
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        return (
            f"The database has no steersman history tables ({', '.join(missing)} missing). "
            "Run `steersman db upgrade` against it, or point --db at steersman's database."
        )
    return None


def _frame(engine: Engine, query: Any) -> pd.DataFrame:
    with engine.connect() as conn:
        result = conn.execute(query)
        frame = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
    for column in frame.columns:
        if column in ("ts", "received_at", "finished_at", "created_at", "promoted_at"):
            frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame


def requests(engine: Engine, since: datetime | None) -> pd.DataFrame:
    r = RequestRow
    query = select(
        r.request_id,
        r.received_at,
        r.finished_at,
        r.instance,
        r.policy,
        r.mode,
        r.request_class,
        r.predictor_path,
        r.base_prediction,
        r.corrected_prediction,
        r.scheduled_prediction,
        r.band_low,
        r.band_high,
        r.prompt_tokens,
        r.expected_cached_tokens,
        r.cached_tokens,
        r.actual_tokens,
        r.rel_error,
        r.miss,
        r.ttft_s,
        r.e2e_s,
        r.qoe,
        r.expected_ttft_s,
        r.expected_pace_s,
        r.model_version,
        r.error,
    ).order_by(r.id)
    if since is not None:
        query = query.where(r.received_at >= since)
    return _frame(engine, query)


def events(engine: Engine, since: datetime | None) -> pd.DataFrame:
    e = ControllerEventRow
    query = select(
        e.ts, e.kind, e.from_mode, e.to_mode, e.request_class, e.reason, e.details
    ).order_by(e.id)
    if since is not None:
        query = query.where(e.ts >= since)
    return _frame(engine, query)


def telemetry(engine: Engine, since: datetime | None) -> pd.DataFrame:
    t = TelemetryRow
    query = select(TelemetryRow.__table__).order_by(t.ts)
    if since is not None:
        query = query.where(t.ts >= since)
    return _frame(engine, query)


def instance_stats(engine: Engine, since: datetime | None) -> pd.DataFrame:
    s = InstanceStatsRow
    query = select(InstanceStatsRow.__table__).order_by(s.ts)
    if since is not None:
        query = query.where(s.ts >= since)
    return _frame(engine, query)


def step_times(stats: pd.DataFrame) -> pd.DataFrame:
    """Learned and profiled step times in long form: one ``series`` per instance and kind."""
    rows = []
    for column, kind in (("step_s", "learned"), ("profiled_step_s", "profiled")):
        if column not in stats:
            continue
        part = stats[stats[column].notna()][["ts", "instance", column]]
        rows.append(
            pd.DataFrame(
                {
                    "ts": part["ts"],
                    "series": part["instance"] + f" ({kind})",
                    "seconds": part[column],
                }
            )
        )
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def models(engine: Engine) -> pd.DataFrame:
    m = ModelVersionRow
    query = select(
        m.version, m.created_at, m.kind, m.base_model, m.status, m.promoted_at, m.train_rows,
        m.val_rows, m.metrics, m.path, m.notes,
    ).order_by(m.id.desc())  # fmt: skip
    return _frame(engine, query)


def overview(reqs: pd.DataFrame, evts: pd.DataFrame, model_rows: pd.DataFrame) -> dict[str, Any]:
    """The on-call summary: mode and why, misses, accuracy, throughput, latency percentiles."""
    done = reqs[reqs["actual_tokens"].notna()] if len(reqs) else reqs
    scored = done[done["miss"].notna()] if len(done) else done
    modes = evts[evts["kind"] == "mode"] if len(evts) else evts
    last_mode = modes.iloc[-1] if len(modes) else None
    misses = [bool(m) for m in scored["miss"]] if len(scored) else []
    # The controller counts its streak from its last mode change, as here.
    recent = scored
    if last_mode is not None and len(scored):
        recent = scored[scored["finished_at"] > last_mode["ts"]]
    streak = 0
    for miss in reversed([bool(m) for m in recent["miss"]] if len(recent) else []):
        if not miss:
            break
        streak += 1
    span_s = 0.0
    if len(reqs):  # the rate while requests arrived, not diluted by a quiet tail
        span_s = max((reqs["received_at"].max() - reqs["received_at"].min()).total_seconds(), 1.0)
    ttft = list(done["ttft_s"].dropna()) if len(done) else []
    e2e = list(done["e2e_s"].dropna()) if len(done) else []
    ttft_p50, ttft_p95 = percentile(ttft, 0.5), percentile(ttft, 0.95)
    promoted = model_rows[model_rows["status"] == "promoted"] if len(model_rows) else model_rows
    serving = done["model_version"].dropna() if len(done) else []
    errors = (reqs["actual_tokens"].isna() & reqs["error"].notna()).sum() if len(reqs) else 0
    return {
        "mode": last_mode["to_mode"] if last_mode is not None else "NORMAL",
        "mode_since": last_mode["ts"] if last_mode is not None else None,
        "mode_reason": last_mode["reason"] if last_mode is not None else "no mode change yet",
        "miss_streak": streak,
        "requests": len(reqs),
        "finished": len(done),
        "errors": int(errors),
        "within_30": (1 - sum(misses) / len(misses)) if misses else None,
        "mae_tokens": (
            float((done["scheduled_prediction"] - done["actual_tokens"]).abs().mean())
            if len(done)
            else None
        ),
        "rps": len(reqs) / span_s if span_s else None,
        "ttft": {q: percentile(ttft, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "e2e": {q: percentile(e2e, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "ttft_healthy": None if ttft_p50 is None else bool(ttft_p95 <= 2 * ttft_p50),
        "model_version": (
            serving.iloc[-1]
            if len(serving)
            else (promoted.iloc[0]["version"] if len(promoted) else "fast predictor")
        ),
    }


def accuracy_by(done: pd.DataFrame, column: str) -> pd.DataFrame:
    """Within-30% rate, MAE and count per value of ``column`` (class or predictor path)."""
    scored = done[done["miss"].notna() & done["actual_tokens"].notna()]
    if not len(scored):
        return pd.DataFrame(columns=[column, "requests", "within_30", "mae_tokens"])
    grouped = scored.assign(
        hit=~scored["miss"].astype(bool),
        err=(scored["scheduled_prediction"] - scored["actual_tokens"]).abs(),
    ).groupby(column)
    out = grouped.agg(
        requests=("hit", "size"), within_30=("hit", "mean"), mae_tokens=("err", "mean")
    )
    return out.reset_index()


def last_activity(engine: Engine) -> datetime | None:
    """When the history last recorded a request or a controller event (None: it holds none)."""
    with engine.connect() as conn:
        got = [
            conn.execute(select(func.max(RequestRow.received_at))).scalar(),
            conn.execute(select(func.max(ControllerEventRow.ts))).scalar(),
        ]
    stamps = [pd.Timestamp(t).tz_localize(UTC) if pd.Timestamp(t).tzinfo is None
              else pd.Timestamp(t) for t in got if t is not None]  # fmt: skip
    return max(stamps).to_pydatetime() if stamps else None


def window_start(
    span: timedelta | None, now: datetime, last: datetime | None
) -> tuple[datetime | None, str | None]:
    """Where the chosen window starts, and a note when it had to move: a window in which the
    history recorded nothing (a demo an hour ago) shows the same span ending at the last
    activity instead of an empty page.

    >>> now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    >>> window_start(timedelta(hours=1), now, now - timedelta(minutes=5))[0].hour
    11
    >>> start, note = window_start(timedelta(hours=1), now, now - timedelta(hours=3))
    >>> start.hour
    8
    >>> note.split(": ")[1]
    'showing the 1 hour up to the last activity (09:00:00 UTC, 2026-12-01).'
    >>> window_start(None, now, None)
    (None, None)
    """
    if span is None:
        return None, None
    if last is None or last >= now - span:
        return now - span, None
    words = _span_words(span)
    note = (
        f"Nothing was recorded in the last {words}: showing the {words} up to the last activity "
        f"({last:%H:%M:%S} UTC, {last:%Y-%m-%d})."
    )
    return last - span, note


def _span_words(span: timedelta) -> str:
    """A window's span as a person says it.

    >>> _span_words(timedelta(minutes=15)), _span_words(timedelta(days=7))
    ('15 minutes', '7 days')
    """
    seconds = int(span.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}{'s' * (n != 1)}"
    return f"{seconds} seconds"


def mode_periods(evts: pd.DataFrame, start: datetime | None, end: datetime) -> pd.DataFrame:
    """The controller's NORMAL and FALLBACK periods from ``start`` (the window's start, or the
    first event) to ``end``, back to back: what the timeline draws.

    >>> t = pd.Timestamp("2026-12-01 12:00", tz="UTC")
    >>> evts = pd.DataFrame({"ts": [t + pd.Timedelta(seconds=60), t + pd.Timedelta(seconds=102)],
    ...                      "kind": ["mode", "mode"], "to_mode": ["FALLBACK", "NORMAL"]})
    >>> p = mode_periods(evts, t.to_pydatetime(), (t + pd.Timedelta(minutes=10)).to_pydatetime())
    >>> list(p["mode"]), [int((b - a).total_seconds()) for a, b in zip(p["start"], p["end"])]
    (['NORMAL', 'FALLBACK', 'NORMAL'], [60, 42, 498])
    """
    modes = evts[evts["kind"] == "mode"] if len(evts) else evts
    changes = [(e["ts"], e["to_mode"]) for _, e in modes.iterrows() if e["to_mode"]]
    begin = pd.Timestamp(start) if start is not None else (changes[0][0] if changes else None)
    rows: list[dict[str, Any]] = []
    if begin is None:
        return pd.DataFrame(rows, columns=["start", "end", "mode"])
    # Before the window's first change the controller was in the other mode.
    mode = ("NORMAL" if changes[0][1] == "FALLBACK" else "FALLBACK") if changes else "NORMAL"
    at = begin
    for ts, to in changes:
        if ts > at:
            rows.append({"start": at, "end": ts, "mode": mode})
        at, mode = max(ts, at), to
    rows.append({"start": at, "end": pd.Timestamp(end), "mode": mode})
    return pd.DataFrame(rows, columns=["start", "end", "mode"])


def fallback_periods(evts: pd.DataFrame, now: datetime) -> pd.DataFrame:
    """One row per FALLBACK period: start, end (now if still on), why it began and ended."""
    rows = []
    current: dict[str, Any] | None = None
    modes = evts[evts["kind"] == "mode"] if len(evts) else evts
    for _, e in modes.iterrows():
        if e["to_mode"] == "FALLBACK":
            current = {"start": e["ts"], "reason": e["reason"]}
        elif e["to_mode"] == "NORMAL" and current is not None:
            rows.append({**current, "end": e["ts"], "ended": e["reason"]})
            current = None
    if current is not None:
        rows.append({**current, "end": pd.Timestamp(now), "ended": "still in FALLBACK"})
    return pd.DataFrame(rows, columns=["start", "end", "reason", "ended"])


def compensation(evts: pd.DataFrame) -> pd.DataFrame:
    """Compensation (a, b) per request class over time, with the reason of each change."""
    rows = []
    changes = evts[evts["kind"] == "compensation"] if len(evts) else evts
    for _, e in changes.iterrows():
        details = e["details"] or {}
        rows.append(
            {
                "ts": e["ts"],
                "request_class": e["request_class"],
                "a": details.get("a"),
                "b": details.get("b"),
                "reason": e["reason"],
            }
        )
    return pd.DataFrame(rows, columns=["ts", "request_class", "a", "b", "reason"])


def instance_latency(done: pd.DataFrame) -> pd.DataFrame:
    """TTFT and E2E percentiles per instance, from the requests it served."""
    rows = []
    for name, group in done.groupby("instance"):
        ttft, e2e = list(group["ttft_s"].dropna()), list(group["e2e_s"].dropna())
        rows.append(
            {
                "instance": name,
                "requests": len(group),
                "ttft_p50_s": percentile(ttft, 0.5),
                "ttft_p99_s": percentile(ttft, 0.99),
                "e2e_p50_s": percentile(e2e, 0.5),
                "e2e_p99_s": percentile(e2e, 0.99),
            }
        )
    return pd.DataFrame(
        rows,
        columns=["instance", "requests", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s"],
    )


QOE_COLUMNS = ["streams", "qoe_mean", "qoe_p10", "below_0_9", "expected_ttft_s", "expected_pace_s"]


def qoe_by(done: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per group (request class, instance): how many streams, their mean and 10th-percentile
    QoE, the share that fell behind their readers (QoE < 0.9), and what those readers expected
    (the most common expectation)."""
    rows = []
    for name, group in done[done["qoe"].notna()].groupby(column):
        q = list(group["qoe"])
        rows.append(
            {
                column: name,
                "streams": len(q),
                "qoe_mean": sum(q) / len(q),
                "qoe_p10": percentile(q, 0.10),
                "below_0_9": sum(v < 0.9 for v in q) / len(q),
                "expected_ttft_s": _mode(group.get("expected_ttft_s")),
                "expected_pace_s": _mode(group.get("expected_pace_s")),
            }
        )
    return pd.DataFrame(rows, columns=[column, *QOE_COLUMNS])


def qoe_over_time(done: pd.DataFrame, bucket: str = "1min") -> pd.DataFrame:
    """Per time bucket, in long form: mean QoE, its 10th percentile and the share below 0.9."""
    streams = done[done["qoe"].notna()]
    rows = []
    for ts, group in streams.groupby(streams["finished_at"].dt.floor(bucket)):
        q = list(group["qoe"])
        for series, value in (
            ("mean", sum(q) / len(q)),
            ("p10", percentile(q, 0.10)),
            ("share < 0.9", sum(v < 0.9 for v in q) / len(q)),
        ):
            rows.append({"ts": ts, "series": series, "value": value})
    return pd.DataFrame(rows, columns=["ts", "series", "value"])


def _mode(values: pd.Series | None) -> float | None:
    if values is None:
        return None
    values = values.dropna()
    return None if not len(values) else float(values.mode().iloc[0])


def band_coverage(done: pd.DataFrame, bucket: str = "1min") -> pd.DataFrame:
    """Per request class and time bucket: the share of requests whose actual length fell
    inside the band they were scheduled with (its target is the band's coverage)."""
    banded = done[done["band_low"].notna() & done["band_high"].notna()]
    if not len(banded):
        return pd.DataFrame(columns=["ts", "request_class", "coverage", "requests"])
    inside = (banded["actual_tokens"] >= banded["band_low"]) & (
        banded["actual_tokens"] <= banded["band_high"]
    )
    frame = banded.assign(ts=banded["finished_at"].dt.floor(bucket), inside=inside)
    out = frame.groupby(["ts", "request_class"]).agg(
        coverage=("inside", "mean"), requests=("inside", "size")
    )
    return out.reset_index()


def loop_shares(done: pd.DataFrame, bucket: str = "1min") -> pd.DataFrame:
    """Per time bucket: the miss rate, the share of requests dispatched in FALLBACK and the
    share predicted on the fast path (RoBERTa late or absent), long form for one chart."""
    if not len(done):
        return pd.DataFrame(columns=["ts", "share", "value"])
    frame = done.assign(
        ts=done["finished_at"].dt.floor(bucket),
        miss_rate=done["miss"].astype(float),
        fallback=(done["mode"] == "FALLBACK").astype(float),
        fast_path=(done["predictor_path"] == "fast").astype(float),
    )
    wide = frame.groupby("ts")[["miss_rate", "fallback", "fast_path"]].mean().reset_index()
    return wide.melt(id_vars="ts", var_name="share", value_name="value")


def prefix_hits(stats: pd.DataFrame) -> pd.DataFrame:
    """Per instance, the prefix-cache hit rate the server reported (tokens found cached over
    tokens looked up), from its counters' first and last scrape in the window."""
    rows = []
    counted = stats[stats["prefix_cache_queries"].notna()] if len(stats) else stats
    for name, group in counted.groupby("instance"):
        queries = group["prefix_cache_queries"].iloc[-1] - group["prefix_cache_queries"].iloc[0]
        hits = group["prefix_cache_hits"].iloc[-1] - group["prefix_cache_hits"].iloc[0]
        rows.append(
            {
                "instance": name,
                "queried_tokens": queries,
                "hit_rate": hits / queries if queries else None,
            }
        )
    return pd.DataFrame(rows, columns=["instance", "queried_tokens", "hit_rate"])


def now_utc() -> datetime:
    return datetime.now(UTC)
