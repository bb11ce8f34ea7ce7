"""prediction bands and prefix-cache columns

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

REQUESTS = (
    ("band_low", sa.Float()),
    ("band_high", sa.Float()),
    ("expected_cached_tokens", sa.Integer()),
    ("cached_tokens", sa.Integer()),
)
INSTANCE_STATS = (("prefix_cache_queries", sa.Float()), ("prefix_cache_hits", sa.Float()))


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        for name, kind in REQUESTS:
            batch.add_column(sa.Column(name, kind, nullable=True))
    with op.batch_alter_table("instance_stats") as batch:
        for name, kind in INSTANCE_STATS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instance_stats") as batch:
        for name, _ in reversed(INSTANCE_STATS):
            batch.drop_column(name)
    with op.batch_alter_table("requests") as batch:
        for name, _ in reversed(REQUESTS):
            batch.drop_column(name)
