"""Deleting and forgetting (issue 20): the deletion audit, datasets that pin runs, retention
rules, and the indexes a delete needs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 09:40:00.000000

* `run_deletions`: one row per deleted run (run_id, content hash, size, who, when, why;
  never the content). `deletion_seq` places it in commit order for lake exports, as
  `runs.ingest_seq` does (PostgreSQL: the deleting transaction's id, the default here).
* `datasets` and `dataset_runs`: named, immutable sets of runs; a run named by one is
  pinned (deletion and retention skip it).
* `retention_rules`: rules by age and by count, scoped by env / policy.
* `ix_trace_events_time_step_pk`, `ix_trace_messages_time_step_pk`: deleting a time
  step makes the database look for rows pointing at it (the foreign keys cascade); without
  these, one scan of each table per time step.

Downgrading drops all of it (the audit too).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types of this revision (revisions never import live code).
PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_ = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
# The writing transaction's id as a BIGINT (as revision 0005's ingest_seq).
PG_XACT_ID = "(pg_current_xact_id())::text::bigint"


def upgrade() -> None:
    """Apply this revision."""
    dialect = op.get_bind().dialect.name
    seq_default = sa.text(PG_XACT_ID) if dialect == "postgresql" else None
    op.create_table(
        "run_deletions",
        sa.Column("id", PK, nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("doc_bytes", sa.BigInteger(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ingest_seq", sa.BigInteger(), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_by", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("pinned_by", JSON_, nullable=True),
        sa.Column("deletion_seq", sa.BigInteger(), server_default=seq_default, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_deletions")),
    )
    with op.batch_alter_table("run_deletions", schema=None) as batch_op:
        batch_op.create_index("ix_run_deletions_run_id", ["run_id"], unique=False)
        batch_op.create_index("ix_run_deletions_deleted_at", ["deleted_at"], unique=False)
        batch_op.create_index("ix_run_deletions_deletion_seq", ["deletion_seq"], unique=False)
        batch_op.create_index("ix_run_deletions_ingest_seq", ["ingest_seq"], unique=False)

    op.create_table(
        "datasets",
        sa.Column("id", PK, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("filter", JSON_, nullable=False),
        sa.Column("n_runs", sa.BigInteger(), nullable=False),
        sa.Column("manifest_hash", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("name", name=op.f("uq_datasets_name")),
    )
    op.create_table(
        "dataset_runs",
        sa.Column("dataset_pk", PK, nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_pk"],
            ["datasets.id"],
            name=op.f("fk_dataset_runs_dataset_pk_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dataset_pk", "run_id", name=op.f("pk_dataset_runs")),
    )
    with op.batch_alter_table("dataset_runs", schema=None) as batch_op:
        batch_op.create_index("ix_dataset_runs_run_id", ["run_id"], unique=False)

    op.create_table(
        "retention_rules",
        sa.Column("id", PK, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("env_id", sa.Text(), nullable=True),
        sa.Column("policy_id", sa.Text(), nullable=True),
        sa.Column("max_age_s", sa.Double(), nullable=True),
        sa.Column("keep_last", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retention_rules")),
        sa.UniqueConstraint("name", name=op.f("uq_retention_rules_name")),
    )

    with op.batch_alter_table("trace_events", schema=None) as batch_op:
        batch_op.create_index("ix_trace_events_time_step_pk", ["time_step_pk"], unique=False)
    with op.batch_alter_table("trace_messages", schema=None) as batch_op:
        batch_op.create_index("ix_trace_messages_time_step_pk", ["time_step_pk"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("trace_messages", schema=None) as batch_op:
        batch_op.drop_index("ix_trace_messages_time_step_pk")
    with op.batch_alter_table("trace_events", schema=None) as batch_op:
        batch_op.drop_index("ix_trace_events_time_step_pk")
    op.drop_table("retention_rules")
    with op.batch_alter_table("dataset_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_dataset_runs_run_id")
    op.drop_table("dataset_runs")
    op.drop_table("datasets")
    with op.batch_alter_table("run_deletions", schema=None) as batch_op:
        batch_op.drop_index("ix_run_deletions_ingest_seq")
        batch_op.drop_index("ix_run_deletions_deletion_seq")
        batch_op.drop_index("ix_run_deletions_deleted_at")
        batch_op.drop_index("ix_run_deletions_run_id")
    op.drop_table("run_deletions")
