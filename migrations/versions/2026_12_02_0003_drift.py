"""Drift: per-run checks and findings (SPEC §6), and legacy-trajectory reads (SPEC §7).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 12:03:50.223329

Runs stored before this revision have no drift check: `tracestore drift --recompute`
checks them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types of this revision (revisions never import live code).
PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "drift_checks",
        sa.Column("run_pk", PK, nullable=False),
        sa.Column("comparator_version", sa.BigInteger(), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("comparable", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("trajectory_steps", sa.BigInteger(), nullable=False),
        sa.Column("environment_events", sa.BigInteger(), nullable=False),
        sa.Column("n_findings", sa.BigInteger(), nullable=False),
        sa.Column("usable_trace", sa.Boolean(), nullable=False),
        sa.Column("dual_serialized", sa.Boolean(), nullable=False),
        sa.Column("reproduces", sa.Boolean(), nullable=True),
        sa.Column("reproduce_gap", sa.Text(), nullable=True),
        sa.Column("reproduce_detail", sa.Text(), nullable=True),
        sa.Column("converter_version", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_drift_checks_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_pk", name=op.f("pk_drift_checks")),
    )
    op.create_table(
        "drift_findings",
        sa.Column("id", PK, nullable=False),
        sa.Column("run_pk", PK, nullable=False),
        sa.Column("ordinal", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("trajectory_index", sa.BigInteger(), nullable=True),
        sa.Column("step_index", sa.BigInteger(), nullable=True),
        sa.Column("position", sa.BigInteger(), nullable=True),
        sa.Column("expected", sa.Text(), nullable=True),
        sa.Column("actual", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("comparator_version", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"],
            ["drift_checks.run_pk"],
            name=op.f("fk_drift_findings_run_pk_drift_checks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drift_findings")),
        sa.UniqueConstraint("run_pk", "ordinal", name=op.f("uq_drift_findings_run_pk_ordinal")),
    )
    with op.batch_alter_table("drift_findings", schema=None) as batch_op:
        batch_op.create_index("ix_drift_findings_kind_run_pk", ["kind", "run_pk"], unique=False)

    op.create_table(
        "legacy_reads",
        sa.Column("id", PK, nullable=False),
        sa.Column("client", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("route", sa.Text(), nullable=False),
        sa.Column("reads", sa.BigInteger(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_legacy_reads")),
        sa.UniqueConstraint(
            "client", "day", "route", name=op.f("uq_legacy_reads_client_day_route")
        ),
    )
    with op.batch_alter_table("legacy_reads", schema=None) as batch_op:
        batch_op.create_index("ix_legacy_reads_day", ["day"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("legacy_reads", schema=None) as batch_op:
        batch_op.drop_index("ix_legacy_reads_day")
    op.drop_table("legacy_reads")

    with op.batch_alter_table("drift_findings", schema=None) as batch_op:
        batch_op.drop_index("ix_drift_findings_kind_run_pk")
    op.drop_table("drift_findings")
    op.drop_table("drift_checks")
