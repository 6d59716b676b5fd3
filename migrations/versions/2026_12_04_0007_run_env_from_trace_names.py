"""Runs whose trace names its env and policy `env_name` / `policy_name` carry them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 14:10:00.000000

synth-ai's traces name a session's env and policy `env_name` / `policy_name` in their
metadata (its `filter` reads them so), and the trace -> trajectories converter already
read them when `env_id` / `policy_id` are absent. Ingest now does too (`runs.env_id` /
`runs.policy_id` of a run without trajectories, ingest/project.py `_trace_name`), so a
trace-only run is found by `?env_id=` and by env-scoped retention rules. Runs already
stored get them here: where a run's id is still unset and its run-level trace's metadata
has no `env_id` (absent or null) but a string `env_name` of at most 1,024 UTF-8 bytes
(likewise for the policy). Computed in SQL, about one indexed look-up per such run.

Downgrading unsets what this revision (or ingest since) took from those names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copy of ingest's MAX_ID_BYTES at this revision: a longer name is not taken.
MAX_ID_BYTES = 1024
# (the id's key, the name read when it is absent or null)
PAIRS = (("env_id", "env_name"), ("policy_id", "policy_name"))


def _unnamed(key: str, dialect: str) -> str:
    """SQL: the trace `t`'s metadata has no `key`, or a null one."""
    if dialect == "postgresql":
        return f"coalesce(jsonb_typeof(t.metadata -> '{key}'), 'null') = 'null'"
    return f"coalesce(json_type(t.metadata, '$.{key}'), 'null') = 'null'"


def _named(key: str, dialect: str) -> str:
    """SQL: the string `t`'s metadata names under `key`, if it may be an id (else NULL)."""
    if dialect == "postgresql":
        value = f"t.metadata ->> '{key}'"
        is_string = f"jsonb_typeof(t.metadata -> '{key}') = 'string'"
        size = f"octet_length({value})"
    else:
        value = f"json_extract(t.metadata, '$.{key}')"
        is_string = f"json_type(t.metadata, '$.{key}') = 'text'"
        size = f"length(CAST({value} AS BLOB))"
    return f"CASE WHEN {is_string} AND {size} <= {MAX_ID_BYTES} THEN {value} END"


def _run_trace(condition: str) -> str:
    # The run-level trace of the run being updated, with no first trajectory naming one
    # (a trajectory's own id always comes first).
    return f"FROM traces AS t WHERE t.run_pk = runs.id AND t.trajectory_idx IS NULL AND {condition}"


def upgrade() -> None:
    """Apply this revision."""
    dialect = op.get_bind().dialect.name
    for key, name in PAIRS:
        taken = f"(SELECT {_named(name, dialect)} {_run_trace(_unnamed(key, dialect))})"
        op.execute(f"UPDATE runs SET {key} = {taken} WHERE {key} IS NULL")
    if dialect == "sqlite":
        _names_with_nul()


def _names_with_nul() -> None:
    """SQLite's json_extract cuts a string at a NUL: take such names again, in Python
    (only runs whose trace's metadata holds an escaped NUL somewhere, rare)."""
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT runs.id, t.metadata, j.env_id, j.policy_id FROM runs "
            "JOIN traces AS t ON t.run_pk = runs.id AND t.trajectory_idx IS NULL "
            "LEFT JOIN trajectories AS j ON j.run_pk = runs.id AND j.idx = 0 "
            "WHERE instr(t.metadata, '\\u0000') > 0"
        )
    ).all()
    for run_pk, text, env_id, policy_id in rows:
        metadata = json.loads(text)
        if not isinstance(metadata, dict):
            continue
        named: dict[str, str | None] = {}
        for (key, name), own in zip(PAIRS, (env_id, policy_id), strict=True):
            if own is not None or metadata.get(key) is not None:
                continue  # the trajectory's or the metadata's own id: not this revision's
            value = metadata.get(name)
            fits = isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) <= (
                MAX_ID_BYTES
            )
            named[key] = value if fits else None
        if named:
            sets = ", ".join(f"{key} = :{key}" for key in named)
            conn.execute(sa.text(f"UPDATE runs SET {sets} WHERE id = :id"), {**named, "id": run_pk})


def downgrade() -> None:
    """Revert this revision."""
    dialect = op.get_bind().dialect.name
    for key, _name in PAIRS:
        no_trajectory = (
            f"NOT EXISTS (SELECT 1 FROM trajectories AS j WHERE j.run_pk = runs.id "
            f"AND j.idx = 0 AND j.{key} IS NOT NULL)"
        )
        from_name = f"EXISTS (SELECT 1 {_run_trace(_unnamed(key, dialect))})"
        op.execute(f"UPDATE runs SET {key} = NULL WHERE {no_trajectory} AND {from_name}")
