"""Initial schema: runs and their documents, trajectories and steps, traces.

Revision ID: 0001
Revises:
Create Date: 2026-12-02 11:27:06.876634
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types of this revision (revisions never import live code):
# JSON on SQLite, JSONB on PostgreSQL.
JSON_ = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    """Apply this revision."""

    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("correlation_id", sa.Text(), nullable=True),
        sa.Column("correlation_source", sa.Text(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("trace_kind", sa.Text(), nullable=True),
        sa.Column("n_trajectories", sa.BigInteger(), nullable=False),
        sa.Column("n_steps", sa.BigInteger(), nullable=False),
        sa.Column("n_events", sa.BigInteger(), nullable=False),
        sa.Column("n_messages", sa.BigInteger(), nullable=False),
        sa.Column("mean_return", sa.Double(), nullable=True),
        sa.Column("num_steps", sa.BigInteger(), nullable=True),
        sa.Column("num_episodes", sa.BigInteger(), nullable=True),
        sa.Column("outcome_score", sa.Double(), nullable=True),
        sa.Column("events_score", sa.Double(), nullable=True),
        sa.Column("metrics", JSON_, nullable=False),
        sa.Column("aborted", sa.Boolean(), nullable=False),
        sa.Column("ops_executed", sa.BigInteger(), nullable=False),
        sa.Column("branches", JSON_, nullable=True),
        sa.Column("pipeline_metadata", JSON_, nullable=True),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("doc_bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_runs_run_id")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_correlation_id", ["correlation_id"], unique=False)
        batch_op.create_index("ix_runs_received_at", ["received_at"], unique=False)

    op.create_table(
        "run_documents",
        sa.Column("run_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("encoding", sa.Text(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_run_documents_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_pk", name=op.f("pk_run_documents")),
    )
    op.create_table(
        "traces",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trajectory_idx", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("metadata", JSON_, nullable=True),
        sa.Column("session_metadata", JSON_, nullable=True),
        sa.Column("wrapper", JSON_, nullable=True),
        sa.Column("extra", JSON_, nullable=True),
        sa.Column("n_time_steps", sa.BigInteger(), nullable=False),
        sa.Column("n_events", sa.BigInteger(), nullable=False),
        sa.Column("n_messages", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_traces_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_traces")),
    )
    with op.batch_alter_table("traces", schema=None) as batch_op:
        batch_op.create_index("ix_traces_run_pk", ["run_pk"], unique=False)
        batch_op.create_index("ix_traces_session_id", ["session_id"], unique=False)

    op.create_table(
        "trajectories",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("env_id", sa.Text(), nullable=True),
        sa.Column("policy_id", sa.Text(), nullable=True),
        sa.Column("length", sa.BigInteger(), nullable=True),
        sa.Column("inference_url", sa.Text(), nullable=True),
        sa.Column("correlation_id", sa.Text(), nullable=True),
        sa.Column("correlation_source", sa.Text(), nullable=True),
        sa.Column("final", JSON_, nullable=True),
        sa.Column("decision_samples", JSON_, nullable=True),
        sa.Column("n_steps", sa.BigInteger(), nullable=False),
        sa.Column("extra", JSON_, nullable=True),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_trajectories_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectories")),
        sa.UniqueConstraint("run_pk", "idx", name=op.f("uq_trajectories_run_pk_idx")),
    )
    with op.batch_alter_table("trajectories", schema=None) as batch_op:
        batch_op.create_index("ix_trajectories_correlation_id", ["correlation_id"], unique=False)
        batch_op.create_index("ix_trajectories_env_id", ["env_id"], unique=False)
        batch_op.create_index("ix_trajectories_policy_id", ["policy_id"], unique=False)

    op.create_table(
        "steps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "trajectory_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("obs", JSON_, nullable=True),
        sa.Column("tool_calls", JSON_, nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("done", sa.Boolean(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=True),
        sa.Column("info", JSON_, nullable=True),
        sa.Column("extra", JSON_, nullable=True),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_steps_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["trajectory_pk"],
            ["trajectories.id"],
            name=op.f("fk_steps_trajectory_pk_trajectories"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
        sa.UniqueConstraint("trajectory_pk", "idx", name=op.f("uq_steps_trajectory_pk_idx")),
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.create_index("ix_steps_run_pk", ["run_pk"], unique=False)

    op.create_table(
        "trace_time_steps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trace_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("step_id", sa.Text(), nullable=True),
        sa.Column("step_index", sa.BigInteger(), nullable=True),
        sa.Column("turn_number", sa.BigInteger(), nullable=True),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("step_metadata", JSON_, nullable=True),
        sa.Column("extra", JSON_, nullable=True),
        sa.ForeignKeyConstraint(
            ["trace_pk"],
            ["traces.id"],
            name=op.f("fk_trace_time_steps_trace_pk_traces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trace_time_steps")),
        sa.UniqueConstraint(
            "trace_pk", "position", name=op.f("uq_trace_time_steps_trace_pk_position")
        ),
    )
    op.create_table(
        "trace_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trace_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "time_step_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("position_in_step", sa.BigInteger(), nullable=True),
        sa.Column("history_position", sa.BigInteger(), nullable=True),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("system_instance_id", sa.Text(), nullable=True),
        sa.Column("event_time", sa.Double(), nullable=True),
        sa.Column("time_record", JSON_, nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("terminated", sa.Boolean(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=True),
        sa.Column("actions", JSON_, nullable=True),
        sa.Column("system_state_before", JSON_, nullable=True),
        sa.Column("system_state_after", JSON_, nullable=True),
        sa.Column("model_name", sa.Text(), nullable=True),
        sa.Column("provider", sa.Text(), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("output_tokens", sa.BigInteger(), nullable=True),
        sa.Column("total_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cost_usd", sa.Double(), nullable=True),
        sa.Column("latency_ms", sa.Double(), nullable=True),
        sa.Column("span_id", sa.Text(), nullable=True),
        sa.Column("trace_id", sa.Text(), nullable=True),
        sa.Column("call_records", JSON_, nullable=True),
        sa.Column("metadata", JSON_, nullable=True),
        sa.Column("event_metadata", JSON_, nullable=True),
        sa.Column("extra", JSON_, nullable=True),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_trace_events_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["time_step_pk"],
            ["trace_time_steps.id"],
            name=op.f("fk_trace_events_time_step_pk_trace_time_steps"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trace_pk"],
            ["traces.id"],
            name=op.f("fk_trace_events_trace_pk_traces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trace_events")),
        sa.UniqueConstraint("trace_pk", "position", name=op.f("uq_trace_events_trace_pk_position")),
    )
    with op.batch_alter_table("trace_events", schema=None) as batch_op:
        batch_op.create_index("ix_trace_events_model_name", ["model_name"], unique=False)
        batch_op.create_index(
            "ix_trace_events_run_pk_event_type", ["run_pk", "event_type"], unique=False
        )

    op.create_table(
        "trace_messages",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trace_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "time_step_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("position_in_step", sa.BigInteger(), nullable=True),
        sa.Column("history_position", sa.BigInteger(), nullable=True),
        sa.Column("message_type", sa.Text(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("json_payload", sa.Text(), nullable=True),
        sa.Column("event_time", sa.Double(), nullable=True),
        sa.Column("message_time", sa.Double(), nullable=True),
        sa.Column("metadata", JSON_, nullable=True),
        sa.Column("extra", JSON_, nullable=True),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_trace_messages_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["time_step_pk"],
            ["trace_time_steps.id"],
            name=op.f("fk_trace_messages_time_step_pk_trace_time_steps"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trace_pk"],
            ["traces.id"],
            name=op.f("fk_trace_messages_trace_pk_traces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trace_messages")),
        sa.UniqueConstraint(
            "trace_pk", "position", name=op.f("uq_trace_messages_trace_pk_position")
        ),
    )
    with op.batch_alter_table("trace_messages", schema=None) as batch_op:
        batch_op.create_index("ix_trace_messages_run_pk", ["run_pk"], unique=False)


def downgrade() -> None:
    """Revert this revision."""

    with op.batch_alter_table("trace_messages", schema=None) as batch_op:
        batch_op.drop_index("ix_trace_messages_run_pk")

    op.drop_table("trace_messages")
    with op.batch_alter_table("trace_events", schema=None) as batch_op:
        batch_op.drop_index("ix_trace_events_run_pk_event_type")
        batch_op.drop_index("ix_trace_events_model_name")

    op.drop_table("trace_events")
    op.drop_table("trace_time_steps")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index("ix_steps_run_pk")

    op.drop_table("steps")
    with op.batch_alter_table("trajectories", schema=None) as batch_op:
        batch_op.drop_index("ix_trajectories_policy_id")
        batch_op.drop_index("ix_trajectories_env_id")
        batch_op.drop_index("ix_trajectories_correlation_id")

    op.drop_table("trajectories")
    with op.batch_alter_table("traces", schema=None) as batch_op:
        batch_op.drop_index("ix_traces_session_id")
        batch_op.drop_index("ix_traces_run_pk")

    op.drop_table("traces")
    op.drop_table("run_documents")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_received_at")
        batch_op.drop_index("ix_runs_correlation_id")

    op.drop_table("runs")
