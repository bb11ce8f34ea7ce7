"""initial history schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "controller_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("from_mode", sa.String(length=16), nullable=True),
        sa.Column("to_mode", sa.String(length=16), nullable=True),
        sa.Column("request_class", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_controller_events")),
    )
    with op.batch_alter_table("controller_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_controller_events_kind_ts"), ["kind", "ts"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_controller_events_ts"), ["ts"], unique=False)

    op.create_table(
        "instance_stats",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("instance", sa.String(length=128), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=True),
        sa.Column("waiting", sa.Integer(), nullable=True),
        sa.Column("kv_cache_usage", sa.Float(), nullable=True),
        sa.Column("preemptions_total", sa.Float(), nullable=True),
        sa.Column("fragmentation", sa.Float(), nullable=True),
        sa.Column("ttft_mean_s", sa.Float(), nullable=True),
        sa.Column("itl_mean_s", sa.Float(), nullable=True),
        sa.Column("in_flight", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_stats")),
    )
    with op.batch_alter_table("instance_stats", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_instance_stats_instance_ts"), ["instance", "ts"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_instance_stats_ts"), ["ts"], unique=False)

    op.create_table(
        "model_versions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("data_hash", sa.String(length=64), nullable=True),
        sa.Column("train_rows", sa.Integer(), nullable=True),
        sa.Column("val_rows", sa.Integer(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("version", name=op.f("uq_model_versions_version")),
    )
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_model_versions_created_at"), ["created_at"], unique=False
        )

    op.create_table(
        "requests",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_token_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("instance", sa.String(length=128), nullable=True),
        sa.Column("policy", sa.String(length=32), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=True),
        sa.Column("request_class", sa.String(length=32), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("prompt_sha256", sa.String(length=64), nullable=True),
        sa.Column("prompt_text", sa.Text(), nullable=True),
        sa.Column("features", sa.JSON(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=True),
        sa.Column("predictor_path", sa.String(length=16), nullable=True),
        sa.Column("base_prediction", sa.Float(), nullable=True),
        sa.Column("corrected_prediction", sa.Float(), nullable=True),
        sa.Column("scheduled_prediction", sa.Float(), nullable=True),
        sa.Column("actual_tokens", sa.Integer(), nullable=True),
        sa.Column("abs_error", sa.Float(), nullable=True),
        sa.Column("rel_error", sa.Float(), nullable=True),
        sa.Column("miss", sa.Boolean(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("tpot_s", sa.Float(), nullable=True),
        sa.Column("qoe", sa.Float(), nullable=True),
        sa.Column("model_version", sa.String(length=64), nullable=True),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
        sa.UniqueConstraint("request_id", name=op.f("uq_requests_request_id")),
    )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_requests_finished_at"), ["finished_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_requests_instance_finished_at"),
            ["instance", "finished_at"],
            unique=False,
        )
        batch_op.create_index(batch_op.f("ix_requests_received_at"), ["received_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_requests_request_class_finished_at"),
            ["request_class", "finished_at"],
            unique=False,
        )

    op.create_table(
        "telemetry",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("host", sa.String(length=128), nullable=True),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=True),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("samples", sa.Integer(), server_default="1", nullable=False),
        sa.Column("sm_activity", sa.Float(), nullable=True),
        sa.Column("sm_activity_max", sa.Float(), nullable=True),
        sa.Column("sm_occupancy", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("throttle_reasons", sa.BigInteger(), nullable=True),
        sa.Column("memory_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_reserved_bytes", sa.BigInteger(), nullable=True),
        sa.Column("fragmentation", sa.Float(), nullable=True),
        sa.Column("errors", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetry")),
    )
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_telemetry_gpu_index_ts"), ["gpu_index", "ts"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_telemetry_ts"), ["ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_telemetry_ts"))
        batch_op.drop_index(batch_op.f("ix_telemetry_gpu_index_ts"))

    op.drop_table("telemetry")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_requests_request_class_finished_at"))
        batch_op.drop_index(batch_op.f("ix_requests_received_at"))
        batch_op.drop_index(batch_op.f("ix_requests_instance_finished_at"))
        batch_op.drop_index(batch_op.f("ix_requests_finished_at"))

    op.drop_table("requests")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_versions_created_at"))

    op.drop_table("model_versions")
    with op.batch_alter_table("instance_stats", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instance_stats_ts"))
        batch_op.drop_index(batch_op.f("ix_instance_stats_instance_ts"))

    op.drop_table("instance_stats")
    with op.batch_alter_table("controller_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_controller_events_ts"))
        batch_op.drop_index(batch_op.f("ix_controller_events_kind_ts"))

    op.drop_table("controller_events")
