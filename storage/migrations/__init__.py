"""Alembic migrations of the history schema; the same revisions run on SQLite and PostgreSQL."""
