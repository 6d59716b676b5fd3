"""Runs carry their env, policy and trace step count, so trace-only runs are found.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 18:00:00.000000

`runs.env_id` / `runs.policy_id`: the run's first trajectory's, else the string its
run-level trace's metadata names (as reports/views.sql reads them); `runs.n_trace_steps`:
the environment events of its run-level full or wrapped trace. Runs already stored get
them here, computed in SQL from their stored rows (about one indexed look-up per run and
column; a store of a million runs takes minutes, inside the upgrade's transaction).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Identifiers longer than this (UTF-8 bytes) are not indexed (frozen copy of ingest's
# MAX_ID_BYTES at this revision): such a name in a trace's metadata is not taken.
MAX_ID_BYTES = 1024


def _named_in_trace(key: str, dialect: str) -> str:
    """SQL: the string the run-level trace's metadata names under `key` (else NULL)."""
    if dialect == "postgresql":
        value = f"t.metadata ->> '{key}'"
        is_string = f"jsonb_typeof(t.metadata -> '{key}') = 'string'"
        size = f"octet_length({value})"
    else:
        value = f"json_extract(t.metadata, '$.{key}')"
        is_string = f"json_type(t.metadata, '$.{key}') = 'text'"
        size = f"length(CAST({value} AS BLOB))"
    return (
        f"(SELECT CASE WHEN {is_string} AND {size} <= {MAX_ID_BYTES} THEN {value} END "
        "FROM traces AS t WHERE t.run_pk = runs.id AND t.trajectory_idx IS NULL)"
    )


def _backfill(dialect: str) -> None:
    first = "(SELECT {0} FROM trajectories AS j WHERE j.run_pk = runs.id AND j.idx = 0)"
    env = f"coalesce({first.format('j.env_id')}, {_named_in_trace('env_id', dialect)})"
    policy = f"coalesce({first.format('j.policy_id')}, {_named_in_trace('policy_id', dialect)})"
    steps = (
        "CASE WHEN runs.trace_kind IN ('full', 'wrapped') THEN ("
        "SELECT count(*) FROM trace_events AS e JOIN traces AS t ON t.id = e.trace_pk "
        "WHERE t.run_pk = runs.id AND t.trajectory_idx IS NULL "
        "AND e.event_type = 'environment') ELSE 0 END"
    )
    op.execute(f"UPDATE runs SET env_id = {env}, policy_id = {policy}, n_trace_steps = {steps}")
    if dialect == "sqlite":
        _names_with_nul()


def _names_with_nul() -> None:
    """SQLite's json_extract cuts a string at a NUL: take such names again, in Python.

    Only runs whose first trajectory names none and whose trace's metadata holds an
    escaped NUL somewhere (rare) are read.
    """
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT runs.id, t.metadata, j.env_id, j.policy_id FROM runs "
            "JOIN traces AS t ON t.run_pk = runs.id AND t.trajectory_idx IS NULL "
            "LEFT JOIN trajectories AS j ON j.run_pk = runs.id AND j.idx = 0 "
            "WHERE instr(t.metadata, '\\u0000') > 0 "
            "AND (j.env_id IS NULL OR j.policy_id IS NULL)"
        )
    ).all()
    for run_pk, text, env_id, policy_id in rows:
        metadata = json.loads(text)
        if not isinstance(metadata, dict):
            continue
        named = {}
        for key, own in (("env_id", env_id), ("policy_id", policy_id)):
            value = metadata.get(key)
            if own is None and isinstance(value, str):
                size = len(value.encode("utf-8", "surrogatepass"))
                named[key] = value if size <= MAX_ID_BYTES else None
        if named:
            sets = ", ".join(f"{key} = :{key}" for key in named)
            conn.execute(sa.text(f"UPDATE runs SET {sets} WHERE id = :id"), {**named, "id": run_pk})


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("env_id", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("policy_id", sa.Text(), nullable=True))
        batch_op.add_column(
            sa.Column("n_trace_steps", sa.BigInteger(), server_default="0", nullable=False)
        )
    _backfill(op.get_bind().dialect.name)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_env_id", ["env_id"], unique=False)
        batch_op.create_index("ix_runs_policy_id", ["policy_id"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_policy_id")
        batch_op.drop_index("ix_runs_env_id")
        batch_op.drop_column("n_trace_steps")
        batch_op.drop_column("policy_id")
        batch_op.drop_column("env_id")
