"""Alembic environment: runs on the connection handed over by steersman.storage.migrate."""

from alembic import context

from steersman.storage.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
