"""Trace provenance: received or converted (by which converter, from which source hash).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 11:56:18.898590
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("traces", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("origin", sa.Text(), server_default="received", nullable=False)
        )
        batch_op.add_column(sa.Column("converter", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("converter_version", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("source_hash", sa.Text(), nullable=True))
        batch_op.create_index(
            "uq_traces_run_level",
            ["run_pk"],
            unique=True,
            sqlite_where=sa.text("trajectory_idx IS NULL"),
            postgresql_where=sa.text("trajectory_idx IS NULL"),
        )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("traces", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_traces_run_level",
            sqlite_where=sa.text("trajectory_idx IS NULL"),
            postgresql_where=sa.text("trajectory_idx IS NULL"),
        )
        batch_op.drop_column("source_hash")
        batch_op.drop_column("converter_version")
        batch_op.drop_column("converter")
        batch_op.drop_column("origin")
