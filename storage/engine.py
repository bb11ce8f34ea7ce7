"""Engines for the history database: SQLite (WAL, busy timeout) or PostgreSQL (psycopg 3)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import NullPool


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached; the message names the URL with its password masked."""


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL and pick psycopg 3 for PostgreSQL.

    >>> str(normalize_url("postgresql://u:pw@db/x"))
    'postgresql+psycopg://u:***@db/x'
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"not a database URL: {mask_url(str(url))!r}") from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite:/// or postgresql://"
        )
    return parsed


def mask_url(url: str | URL) -> str:
    """The URL with any password replaced by ***, safe to print or log.

    >>> mask_url("postgresql://admin:hunter2@db:5432/prod")
    'postgresql://admin:***@db:5432/prod'
    """
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


def make_engine(url: str | URL, *, busy_timeout_ms: int = 5000) -> Engine:
    """A read-write engine. SQLite gets WAL, NORMAL sync and a busy timeout on every connection."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed, connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False}
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: sqlite3.Connection, _record: object) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return create_engine(
        parsed,
        pool_pre_ping=True,
        pool_size=2,
        max_overflow=2,
        connect_args={"connect_timeout": 5},
    )


def check_connection(engine: Engine) -> None:
    """Raise DatabaseUnavailable, naming the masked URL, when the database does not answer."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailable(
            f"cannot reach database {mask_url(engine.url)}: {reason}"
        ) from exc


_SQLITE_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
    sqlite3.SQLITE_TRANSACTION,
}


def _sqlite_read_only_authorizer(
    action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None
) -> int:
    if action in _SQLITE_ALLOWED:
        return sqlite3.SQLITE_OK
    # A pragma without a value only reads; table_info(x) and friends carry a table name instead.
    if action == sqlite3.SQLITE_PRAGMA and (arg2 is None or arg1 in _READ_PRAGMAS):
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


_READ_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"}


def make_read_only_engine(url: str | URL) -> Engine:
    """An engine that cannot write, enforced by the database, not by parsing SQL.

    SQLite: opened with mode=ro, query_only on, and an authorizer that allows only reads
    (no ATTACH, no writing PRAGMA). PostgreSQL: every transaction READ ONLY. One connection
    per use, so no session state outlives a query.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if not path or path == ":memory:":
            raise ValueError(
                "a read-only connection needs a SQLite file, not an in-memory database"
            )
        resolved = Path(path).expanduser().resolve()
        if not resolved.exists():
            raise DatabaseUnavailable(f"cannot reach database {mask_url(parsed)}: no such file")

        def _connect() -> sqlite3.Connection:
            conn = sqlite3.connect(
                f"{resolved.as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=5
            )
            conn.execute("PRAGMA query_only=ON")
            conn.set_authorizer(_sqlite_read_only_authorizer)
            return conn

        return create_engine("sqlite://", creator=_connect, poolclass=NullPool)
    return create_engine(
        parsed,
        poolclass=NullPool,
        connect_args={"connect_timeout": 5, "options": "-c default_transaction_read_only=on"},
        execution_options={"postgresql_readonly": True},
    )
