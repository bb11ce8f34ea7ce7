"""The history writer against real SQLite and PostgreSQL, including real outages."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC

import pytest
from sqlalchemy.engine import make_url

from steersman.storage.engine import make_engine
from steersman.storage.spill import SpillDir, dumps
from steersman.storage.writer import HistoryWriter
from tests.conftest import count, wait_until
from tests.rows import request_row


def _writer(engine, tmp_path, **kw) -> HistoryWriter:
    kw.setdefault("flush_interval_s", 0.02)
    kw.setdefault("retry_initial_s", 0.02)
    kw.setdefault("retry_max_s", 0.2)
    return HistoryWriter(engine, tmp_path / "spill", **kw)


def test_rows_arrive_in_batches_with_every_column(engine, tmp_path):
    with _writer(engine, tmp_path, batch_size=64) as writer:
        for i in range(1000):
            writer.submit("requests", request_row(i))
        assert writer.flush(timeout=30)
        assert count(engine) == 1000
        # Batching happened: far fewer transactions than rows.
        assert writer.stats.batches < 1000 / 8
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT request_id, instance, features, miss, rel_error FROM requests "
            "WHERE request_id = 'req-00000007'"
        ).one()
    assert row[0] == "req-00000007" and row[1] == "vllm-1"
    features = row[2] if isinstance(row[2], dict) else json.loads(row[2])
    assert features == {"question_words": 1, "length_hint": None}
    assert not row[3] and row[4] == pytest.approx(22 / 120)


def test_mixed_tables_and_column_sets_in_one_batch(engine, tmp_path):
    with _writer(engine, tmp_path) as writer:
        writer.submit("requests", request_row(1))
        writer.submit(
            "requests", {"request_id": "bare", "received_at": request_row(2)["received_at"]}
        )
        writer.submit(
            "controller_events",
            {
                "ts": request_row(3)["received_at"],
                "kind": "mode",
                "from_mode": "NORMAL",
                "to_mode": "FALLBACK",
                "reason": "5 consecutive misses",
                "details": {"streak": 5},
            },
        )
        writer.submit(
            "telemetry",
            {
                "ts": request_row(4)["received_at"],
                "gpu_index": 0,
                "method": "gpm",
                "sm_activity": 0.7,
            },
        )
        assert writer.flush(timeout=30)
    assert count(engine) == 2
    assert count(engine, "controller_events") == 1
    assert count(engine, "telemetry") == 1


def test_replaying_a_row_twice_keeps_one_copy(engine, tmp_path):
    with _writer(engine, tmp_path) as writer:
        writer.submit("requests", request_row(5))
        writer.submit("requests", request_row(5))
        assert writer.flush(timeout=30)
    assert count(engine) == 1
    assert writer.stats.rejected == 0


def test_a_bad_row_is_set_aside_and_the_rest_of_its_batch_lands(engine, tmp_path):
    with _writer(engine, tmp_path, batch_size=100, flush_interval_s=0.5) as writer:
        for i in range(40):
            writer.submit("requests", request_row(i))
        writer.submit("requests", {**request_row(99), "no_such_column": 1})
        writer.submit("requests", {**request_row(98), "received_at": None})  # NOT NULL
        for i in range(40, 80):
            writer.submit("requests", request_row(i))
        assert writer.flush(timeout=30)
    assert count(engine) == 80
    assert writer.stats.rejected == 2
    kept = [json.loads(line) for line in writer.dead_letter.read_text().splitlines()]
    assert sorted(r["row"]["request_id"] for r in kept) == ["req-00000098", "req-00000099"]
    assert all(r["reason"] for r in kept)


def test_sqlite_exclusive_lock_loses_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    from steersman.storage import migrate

    engine = make_engine(url, busy_timeout_ms=20)
    migrate.upgrade(engine)
    writer = _writer(engine, tmp_path, queue_size=50, batch_size=20).start()
    locker = sqlite3.connect(make_url(url).database, isolation_level=None)
    for i in range(100):
        writer.submit("requests", request_row(i))
    assert writer.flush(timeout=30)

    locker.execute("BEGIN EXCLUSIVE")
    for i in range(100, 600):
        writer.submit("requests", request_row(i))  # the hot path goes on while the DB is locked
    wait_until(lambda: writer.stats.retries >= 2, what="the writer to hit the lock")
    assert writer.stats.spilled > 0, "a full queue must spill to disk"
    locker.execute("ROLLBACK")
    locker.close()

    assert writer.flush(timeout=60)
    writer.close()
    assert count(engine) == 600
    assert writer.stats.submitted == 600 and writer.stats.rejected == 0 and writer.stats.lost == 0
    assert not SpillDir(tmp_path / "spill").has_rows()


@pytest.mark.postgres
def test_postgres_outage_loses_nothing(pg_admin, pg_fresh_url, tmp_path):
    from steersman.storage import migrate

    engine = make_engine(pg_fresh_url)
    migrate.upgrade(engine)
    writer = _writer(engine, tmp_path, queue_size=50, batch_size=20).start()
    for i in range(100):
        writer.submit("requests", request_row(i))
    assert writer.flush(timeout=30)

    pg_admin.cut_off(pg_fresh_url)
    for i in range(100, 600):
        writer.submit("requests", request_row(i))
    wait_until(lambda: writer.stats.retries >= 2, what="the writer to notice the outage")
    assert writer.stats.spilled > 0
    pg_admin.restore(pg_fresh_url)

    assert writer.flush(timeout=60)
    writer.close()
    assert count(engine) == 600
    assert writer.stats.rejected == 0 and writer.stats.lost == 0
    engine.dispose()


def test_rows_spilled_at_shutdown_are_replayed_on_the_next_start(tmp_path):
    from steersman.storage import migrate

    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = make_engine(url, busy_timeout_ms=20)
    migrate.upgrade(engine)
    locker = sqlite3.connect(make_url(url).database, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    first = _writer(engine, tmp_path).start()
    for i in range(250):
        first.submit("requests", request_row(i))
    wait_until(lambda: first.stats.retries >= 1, what="the writer to hit the lock")
    first.close(timeout=0.2)  # the database is still locked: everything goes to the spill file
    assert first.stats.spilled == 250
    locker.execute("ROLLBACK")
    locker.close()
    assert count(engine) == 0

    second = _writer(engine, tmp_path).start()
    assert second.flush(timeout=30)
    second.close()
    assert count(engine) == 250
    assert second.stats.replayed == 250
    assert not SpillDir(tmp_path / "spill").has_rows()


def test_replay_resumes_after_its_offset_and_sets_aside_a_torn_line(engine, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    frozen = spill / "spill-1.replay.jsonl"
    lines = [dumps("requests", request_row(i)) for i in range(30)]
    frozen.write_text("\n".join(lines) + "\n" + lines[0][: len(lines[0]) // 2])
    # A previous replay committed the first 10 rows, then the process died.
    SpillDir.mark(frozen, sum(len(line) + 1 for line in lines[:10]))

    with _writer(engine, tmp_path) as writer:
        assert writer.flush(timeout=30)
    assert count(engine) == 20
    assert writer.stats.replayed == 20 and writer.stats.rejected == 1
    assert not frozen.exists()


def test_submit_from_many_threads_at_once(engine, tmp_path):
    with _writer(engine, tmp_path, queue_size=100_000) as writer:

        def produce(base: int) -> None:
            for i in range(500):
                writer.submit("requests", request_row(base + i))

        threads = [threading.Thread(target=produce, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert writer.flush(timeout=60)
    assert count(engine) == 2000
    assert writer.stats.submitted == 2000


def test_timestamps_come_back_as_the_same_instant(engine, tmp_path):
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from steersman.storage.models import RequestRow

    paris = timezone(timedelta(hours=1))
    sent = datetime(2026, 11, 29, 13, 30, 0, 250_000, tzinfo=paris)
    with _writer(engine, tmp_path) as writer:
        writer.submit("requests", request_row(1, received_at=sent))
        assert writer.flush(timeout=30)
    with Session(engine) as session:
        got = session.scalars(select(RequestRow.received_at)).one()
    if got.tzinfo is None:  # SQLite keeps UTC wall-clock text
        got = got.replace(tzinfo=UTC)
    assert got == sent
