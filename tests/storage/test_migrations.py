"""Migrations: the same revisions build the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from steersman.storage import migrate
from steersman.storage.models import TABLES, Base


def test_migrated_schema_matches_the_models(engine):
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_tables_and_time_indexes_exist(engine):
    insp = inspect(engine)
    assert set(TABLES) <= set(insp.get_table_names())
    request_indexes = {tuple(ix["column_names"]) for ix in insp.get_indexes("requests")}
    assert ("received_at",) in request_indexes and ("finished_at",) in request_indexes
    assert ("gpu_index", "ts") in {
        tuple(ix["column_names"]) for ix in insp.get_indexes("telemetry")
    }


def test_upgrade_is_idempotent_and_at_head(engine):
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision() is not None


def test_sqlite_runs_in_wal_mode(tmp_path):
    from steersman.storage.engine import make_engine

    eng = make_engine(f"sqlite:///{tmp_path / 'new' / 'h.db'}")
    migrate.upgrade(eng)
    with eng.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
