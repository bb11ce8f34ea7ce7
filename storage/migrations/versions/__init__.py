"""Alembic revision scripts, oldest first."""
