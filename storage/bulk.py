"""Bulk idempotent inserts through the driver's executemany, for the writer's hot loop.

SQLAlchemy's per-row parameter machinery costs more than SQLite's insert itself at 20k rows/s,
so the writer compiles each INSERT once per (table, columns) and converts values with small
per-type functions. Stored values are the ones SQLAlchemy would store, except that timestamps
are normalized to UTC first (SQLAlchemy writes an aware datetime's wall clock, whatever its zone).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import JSON, DateTime, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite

Convert = Callable[[Any], Any] | None


def _sqlite_timestamp(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        # The exact text SQLAlchemy's SQLite DATETIME writes and parses back.
        return value.isoformat(" ", "microseconds")
    return value


def _json_text(value: Any) -> Any:
    return None if value is None else json.dumps(value)


class BulkInsert:
    """One INSERT .. ON CONFLICT DO NOTHING per (table, columns), run with executemany."""

    def __init__(self, engine: Engine) -> None:
        self.dialect = engine.dialect
        self._pg = engine.dialect.name == "postgresql"
        self._cache: dict[tuple[str, tuple[str, ...]], _Prepared] = {}

    def run(self, cursor: Any, table: Table, keys: tuple[str, ...], rows: Sequence[dict]) -> None:
        prepared = self._cache.get((table.name, keys))
        if prepared is None:
            prepared = self._cache[(table.name, keys)] = self._prepare(table, keys)
        cursor.executemany(prepared.sql, [prepared.params(r) for r in rows])

    def _prepare(self, table: Table, keys: tuple[str, ...]) -> _Prepared:
        insert = (postgresql.insert if self._pg else sqlite.insert)(table)
        compiled = insert.on_conflict_do_nothing().compile(
            dialect=self.dialect, column_keys=list(keys)
        )
        order = list(compiled.positiontup or keys)
        if missing := [k for k in order if k not in keys]:
            # Columns with a Python-side default would need SQLAlchemy's execution context.
            raise ValueError(f"{table.name}: rows must carry {', '.join(missing)}")
        converters = [(i, c) for i, k in enumerate(order) if (c := self._converter(table, k))]
        return _Prepared(compiled.string, order, converters, named=self._pg)

    def _converter(self, table: Table, key: str) -> Convert:
        col_type = table.c[key].type
        if isinstance(col_type, JSON):
            if self._pg:
                from psycopg.types.json import Jsonb

                return lambda v: None if v is None else Jsonb(v)
            return _json_text
        if isinstance(col_type, DateTime) and not self._pg:
            return _sqlite_timestamp
        return None


class _Prepared:
    """A compiled INSERT and the fastest way to turn a row dict into its parameters."""

    def __init__(
        self, sql: str, order: list[str], converters: list[tuple[int, Convert]], named: bool
    ) -> None:
        self.sql = sql
        self._order = order
        self._get = itemgetter(*order) if len(order) > 1 else (lambda r: (r[order[0]],))
        self._converters = converters
        self._named = named

    def params(self, row: dict[str, Any]) -> Any:
        values = list(self._get(row))
        for i, convert in self._converters:
            values[i] = convert(values[i])  # type: ignore[misc]
        return dict(zip(self._order, values, strict=True)) if self._named else values
