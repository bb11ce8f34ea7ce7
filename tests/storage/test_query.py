"""The read-only query path and the named queries, on real SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from steersman.storage.engine import make_read_only_engine
from steersman.storage.query import NAMED, QueryError, QueryRefused, named_sql, run_query
from steersman.storage.writer import HistoryWriter
from tests.conftest import count
from tests.rows import T0, request_row


def _fill(engine, tmp_path: Path) -> None:
    rows = []
    # Accuracy: four chat requests, relative errors 0.1, 0.2, 0.5, 0.6 (two misses).
    for i, (err, miss) in enumerate([(10, False), (20, False), (50, True), (60, True)]):
        rows.append(
            request_row(
                i,
                request_class="chat",
                abs_error=float(err),
                rel_error=err / 100,
                actual_tokens=100,
                miss=miss,
                finished_at=T0 + timedelta(minutes=5, seconds=i),
            )
        )
    # Latency: 100 requests on vllm-a with E2E 1..100 s and TTFT 0.01..1.00 s.
    for k in range(1, 101):
        rows.append(
            request_row(
                100 + k,
                instance="vllm-a",
                policy="round-robin",
                e2e_s=float(k),
                ttft_s=k / 100,
                miss=None,
                abs_error=None,
                finished_at=T0 + timedelta(hours=2, seconds=k),
            )
        )
    # Misses in order: hit, miss, miss, hit, miss -> streaks 1, 2 (of 2) and 1 (of 1).
    for j, miss in enumerate([False, True, True, False, True]):
        rows.append(
            request_row(
                300 + j,
                request_class="code",
                miss=miss,
                abs_error=1.0,
                rel_error=0.5 if miss else 0.1,
                finished_at=T0 + timedelta(hours=3, seconds=j),
            )
        )
    events = [
        {
            "ts": T0,
            "kind": "mode",
            "from_mode": "NORMAL",
            "to_mode": "FALLBACK",
            "reason": "5 consecutive misses over 30%",
            "details": {"streak": 5},
        },
        {
            "ts": T0 + timedelta(seconds=42.5),
            "kind": "mode",
            "from_mode": "FALLBACK",
            "to_mode": "NORMAL",
            "reason": "shadow predictions recovered",
            "details": None,
        },
        {
            "ts": T0 + timedelta(seconds=50),
            "kind": "compensation",
            "request_class": "chat",
            "reason": "a 1.2 -> 1.15",
            "details": {"a": 1.15, "b": 10},
        },
    ]
    telemetry = [
        {
            "ts": T0 + timedelta(seconds=s),
            "gpu_index": 0,
            "method": "gpm",
            "sm_activity": 0.5 + s / 100,
            "temperature_c": 60.0 + s,
            "fragmentation": 0.1,
        }
        for s in range(4)
    ]
    with HistoryWriter(engine, tmp_path / "spill", flush_interval_s=0.01) as writer:
        for r in rows:
            writer.submit("requests", r)
        for e in events:
            writer.submit("controller_events", e)
        for t in telemetry:
            writer.submit("telemetry", t)
        assert writer.flush(timeout=30)


@pytest.fixture
def ro(engine, db_url, tmp_path):
    _fill(engine, tmp_path)
    ro_engine = make_read_only_engine(db_url)
    yield ro_engine
    ro_engine.dispose()


def _named(ro, name):
    return run_query(ro, named_sql(name, ro.dialect.name)).records()


def test_accuracy_per_class_and_hour(ro):
    chat = [r for r in _named(ro, "accuracy") if r["request_class"] == "chat"]
    assert len(chat) == 1
    assert chat[0]["hour"] == "2026-11-29 12:00"
    assert chat[0]["requests"] == 4
    assert float(chat[0]["mae_tokens"]) == pytest.approx(35.0)
    assert float(chat[0]["within_30"]) == pytest.approx(0.5)
    assert chat[0]["misses"] == 2


def test_latency_percentiles_per_instance_and_policy(ro):
    (row,) = [r for r in _named(ro, "latency") if r["instance"] == "vllm-a"]
    assert row["policy"] == "round-robin" and row["requests"] == 100
    assert [float(row[k]) for k in ("e2e_p50_s", "e2e_p95_s", "e2e_p99_s")] == [50, 95, 99]
    assert [float(row[k]) for k in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s")] == pytest.approx(
        [0.50, 0.95, 0.99]
    )


def test_misses_carry_their_streak(ro):
    code = [r for r in _named(ro, "misses") if r["request_class"] == "code"]
    assert [(r["request_id"], r["streak"], r["streak_length"]) for r in code] == [
        ("req-00000304", 1, 1),
        ("req-00000302", 2, 2),
        ("req-00000301", 1, 2),
    ]


def test_fallbacks_with_reason_and_duration(ro):
    (period,) = _named(ro, "fallbacks")
    assert period["reason"] == "5 consecutive misses over 30%"
    assert period["ended_because"] == "shadow predictions recovered"
    assert float(period["duration_s"]) == pytest.approx(42.5, abs=0.1)


def test_telemetry_per_gpu_per_minute(ro):
    (minute,) = _named(ro, "telemetry")
    assert minute["gpu_index"] == 0 and minute["samples"] == 4
    assert float(minute["sm_activity_mean"]) == pytest.approx(0.515)
    assert float(minute["temperature_c_max"]) == pytest.approx(63.0)


def test_every_named_query_runs_on_an_empty_database(db_url):
    ro = make_read_only_engine(db_url)
    for name in NAMED:
        assert run_query(ro, named_sql(name, ro.dialect.name)).rows == []


WRITES = [
    "INSERT INTO requests (request_id, received_at) VALUES ('x', '2026-01-01')",
    "UPDATE requests SET actual_tokens = 0",
    "DELETE FROM requests",
    "DROP TABLE requests",
    "CREATE TABLE evil (x int)",
    "SELECT 1; DELETE FROM requests",
    "SELECT 1 /* harmless? */; DROP TABLE requests",
    "-- a comment first\nDELETE FROM requests",
    "/* SELECT */ DELETE FROM requests",
    "WITH gone AS (DELETE FROM requests RETURNING 1) SELECT count(*) FROM gone",
]
SQLITE_ONLY = [
    "ATTACH DATABASE 'evil.db' AS evil",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA user_version = 7",
    "VACUUM",
]
PG_ONLY = [
    "SELECT 1; COMMIT; SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE; DELETE FROM requests",
    "TRUNCATE requests",
    "SELECT setval('requests_id_seq', 1)",
]


def test_the_query_path_cannot_write(ro, db_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = count(ro)
    dialect_only = SQLITE_ONLY if ro.dialect.name == "sqlite" else PG_ONLY
    if ro.dialect.name == "sqlite":
        db_file = Path(make_url(db_url).database)
        digest = hashlib.sha256(db_file.read_bytes()).hexdigest()
    for sql in WRITES + dialect_only:
        with pytest.raises(QueryError) as info:
            run_query(ro, sql)
        if "WITH gone" not in sql:  # SQLite cannot parse DELETE in a CTE: a plain error
            assert isinstance(info.value, QueryRefused) or "syntax" in str(info.value), sql
    assert count(ro) == before
    if ro.dialect.name == "sqlite":
        assert hashlib.sha256(db_file.read_bytes()).hexdigest() == digest
        assert not (tmp_path / "evil.db").exists()


def test_a_bad_query_reports_the_database_message(ro):
    with pytest.raises(QueryError, match=r"no such column|does not exist"):
        run_query(ro, "SELECT no_such_column FROM requests")


def test_unknown_named_query_lists_the_valid_names():
    with pytest.raises(KeyError, match="accuracy, fallbacks, latency, misses, telemetry"):
        named_sql("nope", "sqlite")


def test_the_storage_page_shows_each_named_query_as_it_runs():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "storage.md").read_text()
    for name in NAMED:
        assert f"```sql\n{named_sql(name, 'sqlite')}\n```" in readme, name
