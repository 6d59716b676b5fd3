"""Deleting runs (issue 20): every row of a run, and an audit row, in the caller's transaction.

A run's rows are deleted children first, each table by an indexed key (`run_pk`, or the
run's traces for time steps), rather than through the foreign keys' ON DELETE CASCADE:
a cascade deletes row by row, and only where the child key is indexed. The audit row
(`run_deletions`) is written in the same transaction: a run is gone exactly when its
audit row exists. Functions take a session and never commit.

Runs pinned by a dataset (store/datasets.py) are refused (`Pinned`) or skipped unless
forced. On PostgreSQL the runs are locked (FOR UPDATE) before their pins are read, so a
dataset made meanwhile (which reads its runs FOR SHARE) either pins a run before the
delete sees it, or finds it gone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Connection, Table, bindparam, delete, func, insert, select
from sqlalchemy.orm import Session

from tracestore.errors import NotFound, Pinned
from tracestore.models import (
    Run,
    RunDeletion,
    RunDocument,
    Step,
    Trace,
    TraceEvent,
    TraceMessage,
    TraceTimeStep,
    Trajectory,
)
from tracestore.models.drift import DriftCheck, DriftFinding
from tracestore.store.datasets import pins

_PKS: BindParameter[list[int]] = bindparam("pks", expanding=True)


def _table(model: Any) -> Table:
    table: Table = model.__table__
    return table


# Children before parents. Every table that holds a run's rows is here; the tests check
# that no table with a foreign key path to `runs` is missing (tests/deletion).
PURGE: tuple[tuple[Table, Any], ...] = (
    (_table(DriftFinding), DriftFinding.run_pk.in_(_PKS)),
    (_table(DriftCheck), DriftCheck.run_pk.in_(_PKS)),
    (_table(TraceEvent), TraceEvent.run_pk.in_(_PKS)),
    (_table(TraceMessage), TraceMessage.run_pk.in_(_PKS)),
    (
        _table(TraceTimeStep),
        TraceTimeStep.trace_pk.in_(select(Trace.id).where(Trace.run_pk.in_(_PKS))),
    ),
    (_table(Trace), Trace.run_pk.in_(_PKS)),
    (_table(Step), Step.run_pk.in_(_PKS)),
    (_table(Trajectory), Trajectory.run_pk.in_(_PKS)),
    (_table(RunDocument), RunDocument.run_pk.in_(_PKS)),
    (_table(Run), Run.id.in_(_PKS)),
)
PURGED_TABLES = tuple(table.name for table, _ in PURGE)
_STATEMENTS = tuple(delete(table).where(where) for table, where in PURGE)
_RUN_COLUMNS = (
    Run.id,
    Run.run_id,
    Run.content_hash,
    Run.doc_bytes,
    Run.received_at,
    Run.ingest_seq,
)
_MAX_DELETION_SEQ = select(func.coalesce(func.max(RunDeletion.deletion_seq), 0))


@dataclass(frozen=True, slots=True)
class Deletion:
    """Who deletes, how and why: what the audit row records besides the run."""

    by: str
    via: str  # 'api', 'cli' or 'retention'
    reason: str | None = None
    force: bool = False


@dataclass(slots=True)
class Deleted:
    """The outcome of deleting some runs: the audit of each deleted one, and the runs left
    alone because a dataset pins them (run_id -> dataset names)."""

    deleted: list[dict[str, Any]] = field(default_factory=list)
    pinned: dict[str, list[str]] = field(default_factory=dict)
    # Asked for but not there (already deleted, or never stored).
    missing: list[str] = field(default_factory=list)


def purge(conn: Connection, run_pks: Sequence[int]) -> None:
    """Delete every row of the runs with these keys (no audit, no pin check)."""
    if not run_pks:
        return
    params = {"pks": list(run_pks)}
    for statement in _STATEMENTS:
        conn.execute(statement, params)


def _locked(conn: Connection, where: Any) -> list[Any]:
    query = select(*_RUN_COLUMNS).where(where).order_by(Run.id)
    if conn.dialect.name == "postgresql":
        # Lock the runs: a concurrent dataset (FOR SHARE) or delete waits for us.
        query = query.with_for_update(of=Run)
    return list(conn.execute(query))


def _deletion_seqs(conn: Connection, n: int) -> list[int | None]:
    # SQLite: max + 1 onwards, commit-ordered because writers hold the single write lock
    # (BEGIN IMMEDIATE, db/uow.write_session) until they commit. PostgreSQL: the column's
    # default, the deleting transaction's id (migration 0006).
    if conn.dialect.name != "sqlite":
        return [None] * n
    start = conn.execute(_MAX_DELETION_SEQ).scalar_one() or 0
    return list(range(start + 1, start + 1 + n))


def delete_where(
    session: Session,
    where: Any,
    how: Deletion,
    now: datetime,
    wanted: Sequence[str] = (),
    only: Callable[[Any], bool] | None = None,
) -> Deleted:
    """Delete the runs matching `where` (a clause on `runs`) and `only` (a test of each
    row, when given), skipping pinned ones unless `how.force`, with an audit row each.
    `wanted`: run_ids asked for by name, reported in `missing` when not found."""
    conn = session.connection()
    rows = _locked(conn, where)
    if only is not None:
        rows = [r for r in rows if only(r)]
    found = {r.run_id for r in rows}
    outcome = Deleted(missing=[w for w in dict.fromkeys(wanted) if w not in found])
    pinned = pins(conn, [r.run_id for r in rows])
    doomed = [r for r in rows if how.force or r.run_id not in pinned]
    outcome.pinned = {r: names for r, names in pinned.items() if not how.force}
    if not doomed:
        return outcome
    seqs = _deletion_seqs(conn, len(doomed))
    audit = []
    for row, seq in zip(doomed, seqs, strict=True):
        entry: dict[str, Any] = {
            "run_id": row.run_id,
            "content_hash": row.content_hash,
            "doc_bytes": row.doc_bytes,
            "received_at": row.received_at,
            "ingest_seq": row.ingest_seq,
            "deleted_at": now,
            "deleted_by": how.by,
            "reason": how.reason,
            "via": how.via,
            "forced": row.run_id in pinned,
            "pinned_by": pinned.get(row.run_id),
        }
        if seq is not None:
            entry["deletion_seq"] = seq
        audit.append(entry)
    purge(conn, [r.id for r in doomed])
    # One statement per shape: SQLite rows carry deletion_seq, PostgreSQL's take the default.
    conn.execute(insert(RunDeletion), audit)
    outcome.deleted = audit
    return outcome


def delete_run(session: Session, run_id: str, how: Deletion, now: datetime) -> dict[str, Any]:
    """Delete one run and write its audit row; returns the audit entry.

    NotFound when no run has this id (a second delete of the same run), Pinned when a
    dataset pins it and `how.force` is not set.
    """
    outcome = delete_where(session, Run.run_id == run_id, how, now, wanted=[run_id])
    if outcome.missing:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    if outcome.pinned:
        names = outcome.pinned[run_id]
        raise Pinned(
            f"run {run_id!r} is pinned by dataset{'s' if len(names) > 1 else ''} "
            f"{', '.join(names)}: drop the dataset, or force the delete",
            run_id=run_id,
            pinned_by=names,
        )
    return outcome.deleted[0]


def delete_pks(
    session: Session, runs: Sequence[tuple[int, str, int | None]], how: Deletion, now: datetime
) -> Deleted:
    """Delete the runs of these (pk, run_id, ingest_seq) that still exist (retention's
    batches).

    All three must match: on SQLite the pk of a run deleted meanwhile (by hand, or by a
    sweep beside this one) is given to the next run stored, which is not the run planned.
    """
    if not runs:
        return Deleted()
    planned = set(runs)
    return delete_where(
        session,
        Run.id.in_([pk for pk, _, _ in runs]),
        how,
        now,
        only=lambda row: (row.id, row.run_id, row.ingest_seq) in planned,
    )


def deletions(
    session: Session, *, run_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Audit rows, newest first (of one run_id when given)."""
    query = select(RunDeletion).order_by(RunDeletion.id.desc()).limit(limit)
    if run_id is not None:
        query = query.where(RunDeletion.run_id == run_id)
    columns = [c.name for c in _table(RunDeletion).columns]
    return [{c: getattr(r, c) for c in columns} for r in session.connection().execute(query)]


def deletions_between(conn: Connection, after: int, upto: int | None) -> list[Any]:
    """(run_id, ingest_seq) of the deletions with `after <= deletion_seq < upto` (upto
    None: no upper bound), in commit order: what a lake export removes."""
    query = select(RunDeletion.run_id, RunDeletion.ingest_seq, RunDeletion.deletion_seq).where(
        RunDeletion.deletion_seq >= after
    )
    if upto is not None:
        query = query.where(RunDeletion.deletion_seq < upto)
    return list(conn.execute(query.order_by(RunDeletion.deletion_seq)))
