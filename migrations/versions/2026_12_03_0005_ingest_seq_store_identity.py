"""Runs get a commit-ordered ingest sequence, and the store an id (issue 15: lake exports).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 09:00:00.000000

`runs.ingest_seq` places each run in commit order, so an incremental export can take
"everything past the last cut" and never miss a run committed after it:

* SQLite: a counter that ingest assigns inside its write transaction. SQLite has one
  writer at a time, so values are handed out in commit order. Runs already stored get
  their key (`id`), which on SQLite was handed out the same way (max + 1 under the lock).
* PostgreSQL: the id of the transaction that wrote the run, as the column's default
  (`pg_current_xact_id()`, 64-bit, never wraps). Transaction ids are not commit-ordered;
  the exporter cuts below the oldest transaction still open instead, so a run whose
  transaction commits late is taken by the next export. Runs already stored get this
  migration's transaction id: all of them committed before it.

`store_identity` holds one random id per store; every exported row carries it.
Downgrading drops both (a later upgrade draws a new store id).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The writing transaction's id as a BIGINT (xid8 has no direct cast to bigint).
PG_XACT_ID = "(pg_current_xact_id())::text::bigint"


def upgrade() -> None:
    """Apply this revision."""
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.add_column(
            "runs",
            sa.Column(
                "ingest_seq", sa.BigInteger(), server_default=sa.text(PG_XACT_ID), nullable=True
            ),
        )
        # Adding a column with a volatile default already fills existing rows; say so
        # explicitly, whatever PostgreSQL decides to do with the default.
        op.execute(f"UPDATE runs SET ingest_seq = {PG_XACT_ID} WHERE ingest_seq IS NULL")
    else:
        with op.batch_alter_table("runs", schema=None) as batch_op:
            batch_op.add_column(sa.Column("ingest_seq", sa.BigInteger(), nullable=True))
        op.execute("UPDATE runs SET ingest_seq = id")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_ingest_seq", ["ingest_seq"], unique=False)
    identity = op.create_table(
        "store_identity",
        sa.Column("store_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("store_id", name=op.f("pk_store_identity")),
    )
    op.bulk_insert(identity, [{"store_id": uuid.uuid4().hex, "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("store_identity")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_ingest_seq")
        batch_op.drop_column("ingest_seq")
