"""The read-only query path and the named queries an operator asks most often."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine


class QueryError(Exception):
    """The database refused or failed a query; the message is the database's own."""


class QueryRefused(QueryError):
    """The query tried to write; the read-only path refused it and nothing changed."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


_WRITE_HINTS = (
    "readonly database",
    "not authorized",
    "authorization denied",
    "read-only transaction",
    "one statement at a time",
    "multiple commands",
)


def run_query(engine: Engine, sql: str, limit: int | None = None) -> QueryResult:
    """Run one statement on a read-only engine (see ``make_read_only_engine``).

    The database enforces read-only; a write, an ATTACH, a writing PRAGMA or a second statement
    raises QueryRefused, any other failure QueryError with the database's message.
    """
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        try:
            if isinstance(driver, sqlite3.Connection):
                cur = driver.execute(sql)
            else:
                # prepare=True forces the extended protocol, which takes exactly one statement.
                cur = driver.execute(sql, prepare=True)  # type: ignore[union-attr]
            columns = [d[0] for d in cur.description or []]
            rows = cur.fetchall() if limit is None else cur.fetchmany(limit)
        except (sqlite3.Error, sqlite3.Warning) as exc:
            raise _classify(str(exc)) from None
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg"):
                raise _classify(str(exc).strip()) from None
            raise
        finally:
            raw.rollback()
    finally:
        raw.close()
    return QueryResult(columns, [tuple(r) for r in rows])


def _classify(message: str) -> QueryError:
    first = message.splitlines()[0] if message else "query failed"
    if any(hint in first.lower() for hint in _WRITE_HINTS):
        return QueryRefused(
            f"refused: the query path is read-only and runs one statement ({first})"
        )
    return QueryError(first)


# -- named queries ------------------------------------------------------------------------------


def _bucket(dialect: str, column: str, unit: str) -> str:
    if dialect == "postgresql":
        fmt = {"hour": "YYYY-MM-DD HH24:00", "minute": "YYYY-MM-DD HH24:MI"}[unit]
        return f"to_char(date_trunc('{unit}', {column}), '{fmt}')"
    fmt = {"hour": "%Y-%m-%d %H:00", "minute": "%Y-%m-%d %H:%M"}[unit]
    return f"strftime('{fmt}', {column})"


def _seconds_between(dialect: str, start: str, end: str) -> str:
    if dialect == "postgresql":
        return f"EXTRACT(EPOCH FROM ({end} - {start}))"
    return f"(julianday({end}) - julianday({start})) * 86400.0"


def _r(expr: str, digits: int) -> str:
    return f"ROUND(CAST({expr} AS NUMERIC), {digits})"


def _accuracy(d: str) -> str:
    return f"""
SELECT {_bucket(d, "finished_at", "hour")} AS hour,
       COALESCE(request_class, 'unknown') AS request_class,
       COUNT(*) AS requests,
       {_r("AVG(abs_error)", 1)} AS mae_tokens,
       {_r("AVG(CASE WHEN rel_error <= 0.3 THEN 1.0 ELSE 0.0 END)", 3)} AS within_30,
       SUM(CASE WHEN miss THEN 1 ELSE 0 END) AS misses
FROM requests
WHERE actual_tokens IS NOT NULL AND abs_error IS NOT NULL
GROUP BY 1, 2
ORDER BY 1 DESC, 2"""


def _misses(d: str) -> str:
    return f"""
WITH scored AS (
  SELECT id, request_id, finished_at, request_class, instance, scheduled_prediction,
         actual_tokens, rel_error, miss,
         SUM(CASE WHEN miss THEN 0 ELSE 1 END)
           OVER (ORDER BY finished_at, id ROWS UNBOUNDED PRECEDING) AS run
  FROM requests WHERE miss IS NOT NULL
), runs AS (
  SELECT *,
         SUM(CASE WHEN miss THEN 1 ELSE 0 END)
           OVER (PARTITION BY run ORDER BY finished_at, id ROWS UNBOUNDED PRECEDING) AS streak,
         SUM(CASE WHEN miss THEN 1 ELSE 0 END) OVER (PARTITION BY run) AS streak_length
  FROM scored
)
SELECT finished_at, request_id, request_class, instance,
       {_r("scheduled_prediction", 1)} AS predicted, actual_tokens AS actual,
       {_r("rel_error", 3)} AS rel_error, streak, streak_length
FROM runs WHERE miss
ORDER BY finished_at DESC, id DESC"""


def _fallbacks(d: str) -> str:
    return f"""
WITH modes AS (
  SELECT id, ts, to_mode, reason,
         LEAD(ts) OVER (ORDER BY ts, id) AS next_ts,
         LEAD(reason) OVER (ORDER BY ts, id) AS next_reason
  FROM controller_events WHERE kind = 'mode'
)
SELECT ts AS started_at, next_ts AS ended_at,
       {_r(_seconds_between(d, "ts", "next_ts"), 1)} AS duration_s,
       reason, next_reason AS ended_because
FROM modes WHERE to_mode = 'FALLBACK'
ORDER BY ts DESC, id DESC"""


def _percentiles(column: str, alias: str) -> str:
    return f"""{alias} AS (
  SELECT instance, policy, MAX(n) AS n,
         {_r("MIN(CASE WHEN rn >= 0.50 * n THEN v END)", 4)} AS p50,
         {_r("MIN(CASE WHEN rn >= 0.95 * n THEN v END)", 4)} AS p95,
         {_r("MIN(CASE WHEN rn >= 0.99 * n THEN v END)", 4)} AS p99
  FROM (SELECT COALESCE(instance, '-') AS instance, COALESCE(policy, '-') AS policy,
               {column} AS v,
               ROW_NUMBER() OVER (PARTITION BY instance, policy ORDER BY {column}) AS rn,
               COUNT(*) OVER (PARTITION BY instance, policy) AS n
        FROM requests WHERE {column} IS NOT NULL) ranked
  GROUP BY instance, policy
)"""


def _latency(d: str) -> str:
    return f"""
WITH {_percentiles("e2e_s", "e2e")},
{_percentiles("ttft_s", "ttft")}
SELECT e2e.instance, e2e.policy, e2e.n AS requests,
       ttft.p50 AS ttft_p50_s, ttft.p95 AS ttft_p95_s, ttft.p99 AS ttft_p99_s,
       e2e.p50 AS e2e_p50_s, e2e.p95 AS e2e_p95_s, e2e.p99 AS e2e_p99_s
FROM e2e LEFT JOIN ttft ON ttft.instance = e2e.instance AND ttft.policy = e2e.policy
ORDER BY e2e.instance, e2e.policy"""


def _telemetry(d: str) -> str:
    return f"""
SELECT {_bucket(d, "ts", "minute")} AS minute, gpu_index,
       {_r("AVG(sm_activity)", 3)} AS sm_activity_mean,
       {_r("MAX(COALESCE(sm_activity_max, sm_activity))", 3)} AS sm_activity_max,
       {_r("AVG(temperature_c)", 1)} AS temperature_c_mean,
       MAX(temperature_c) AS temperature_c_max,
       {_r("AVG(fragmentation)", 3)} AS fragmentation_mean,
       SUM(samples) AS samples
FROM telemetry
GROUP BY 1, 2
ORDER BY 1 DESC, 2"""


@dataclass(frozen=True)
class NamedQuery:
    name: str
    question: str
    build: Callable[[str], str]

    def sql(self, dialect: str) -> str:
        return self.build(dialect).strip()


NAMED: dict[str, NamedQuery] = {
    q.name: q
    for q in (
        NamedQuery("accuracy", "MAE and within-30% rate per request class and hour", _accuracy),
        NamedQuery("misses", "recent misses, each with its place in its streak", _misses),
        NamedQuery("fallbacks", "FALLBACK periods with reason and duration", _fallbacks),
        NamedQuery("latency", "TTFT and E2E P50/P95/P99 per instance and policy", _latency),
        NamedQuery(
            "telemetry", "SM activity, temperature, fragmentation per GPU per minute", _telemetry
        ),
    )
}


def named_sql(name: str, dialect: str) -> str:
    """The SQL of a named query for a dialect ('sqlite' or 'postgresql')."""
    if name not in NAMED:
        raise KeyError(f"unknown named query {name!r}; valid names: {', '.join(sorted(NAMED))}")
    return NAMED[name].sql(dialect)


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """Nearest rank, the rule the named SQL queries use; None and NaN are left out.

    >>> percentile([1, 2, 3, 4], 0.5), percentile([1, 2, 3, 4], 0.99), percentile([], 0.5)
    (2, 4, None)
    """
    ordered = sorted(v for v in values if v is not None and not math.isnan(v))
    if not ordered:
        return None
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]
