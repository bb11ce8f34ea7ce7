"""replicas' learned state in the shared history: the latest is where a replica starts

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False,
                  autoincrement=True),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
    )  # fmt: skip
    op.create_index("ix_checkpoints_saved_at", "checkpoints", ["saved_at"])


def downgrade() -> None:
    op.drop_index("ix_checkpoints_saved_at", table_name="checkpoints")
    op.drop_table("checkpoints")
