"""each instance's step time as its latency model learned it, beside its profile's

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instance_stats") as batch:
        batch.add_column(sa.Column("step_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("profiled_step_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instance_stats") as batch:
        batch.drop_column("profiled_step_s")
        batch.drop_column("step_s")
