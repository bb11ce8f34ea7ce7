"""what each streamed request's reader expected (TTFT and pace), beside the QoE it got

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("expected_ttft_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("expected_pace_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("expected_pace_s")
        batch.drop_column("expected_ttft_s")
