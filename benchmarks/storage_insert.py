"""Batched insert throughput of the history writer into SQLite and PostgreSQL.

Run from the repository root:  python -m benchmarks.storage_insert [--rows N] [--pg URL]
Prints one JSON object per line: backend, path (writer = the real HistoryWriter end to end, from
the first submit to the last commit; sqlalchemy-core = a plain Core executemany INSERT per batch,
the obvious way to write it, for comparison),
rows, seconds and rows_per_s.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path

import psycopg
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from steersman.storage import migrate
from steersman.storage.engine import make_engine
from steersman.storage.models import RequestRow
from steersman.storage.writer import HistoryWriter
from tests.rows import request_row


def bench_writer(url: str, rows: list[dict], spill: Path, batch_size: int) -> float:
    engine = make_engine(url)
    writer = HistoryWriter(engine, spill, batch_size=batch_size, queue_size=len(rows) + 1)
    start = time.perf_counter()
    writer.start()
    for row in rows:
        writer.submit("requests", row)
    ok = writer.flush(timeout=600)
    elapsed = time.perf_counter() - start
    writer.close()
    assert ok and writer.stats.written == len(rows), writer.stats
    engine.dispose()
    return elapsed


def bench_core(url: str, rows: list[dict], batch_size: int) -> float:
    engine = make_engine(url)
    start = time.perf_counter()
    for i in range(0, len(rows), batch_size):
        with engine.begin() as conn:
            conn.execute(insert(RequestRow), rows[i : i + batch_size])
    elapsed = time.perf_counter() - start
    engine.dispose()
    return elapsed


def _pg_database(admin_url: str) -> tuple[str, str]:
    u = make_url(admin_url)
    name = f"steersman_bench_{secrets.token_hex(4)}"
    with psycopg.connect(
        host=u.host, port=u.port or 5432, user=u.username, dbname=u.database, autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, u.set(drivername="postgresql+psycopg", database=name).render_as_string(False)


def _drop(admin_url: str, name: str) -> None:
    u = make_url(admin_url)
    with psycopg.connect(
        host=u.host, port=u.port or 5432, user=u.username, dbname=u.database, autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--pg",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="admin URL of a PostgreSQL server; '' skips PostgreSQL",
    )
    args = parser.parse_args()
    rows = [request_row(i) for i in range(args.rows)]
    backends = ["sqlite", "postgresql"] if args.pg else ["sqlite"]

    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            for path in ("writer", "sqlalchemy-core"):
                pg_name = None
                if backend == "sqlite":
                    url = f"sqlite:///{tmp}/{path}.db"
                else:
                    pg_name, url = _pg_database(args.pg)
                engine = make_engine(url)
                migrate.upgrade(engine)
                engine.dispose()
                if path == "writer":
                    seconds = bench_writer(
                        url, rows, Path(tmp) / f"spill-{backend}", args.batch_size
                    )
                else:
                    seconds = bench_core(url, rows, args.batch_size)
                if pg_name:
                    _drop(args.pg, pg_name)
                result = {
                    "benchmark": "storage_insert",
                    "backend": backend,
                    "path": path,
                    "rows": len(rows),
                    "batch_size": args.batch_size,
                    "seconds": round(seconds, 3),
                    "rows_per_s": round(len(rows) / seconds),
                }
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
