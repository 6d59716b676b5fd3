"""The drift tables: writes inside the caller's transaction, and the SQL of its queries.

The rows themselves are computed before the transaction, purely (`drift.rows`). Every
dialect difference of the drift tables (the UTC day of a timestamp, the upsert of legacy
reads) is in this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Date,
    Table,
    bindparam,
    cast,
    delete,
    exists,
    func,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from tracestore.db.bulk import bulk_insert_all
from tracestore.models import Run
from tracestore.models.drift import DriftCheck, DriftFinding, LegacyRead
from tracestore.vocabulary import DRIFT_KINDS


def _table(model: Any) -> Table:
    table: Table = model.__table__
    return table


CHECKS = _table(DriftCheck)
FINDINGS = _table(DriftFinding)
LEGACY_READS = _table(LegacyRead)


@dataclass(frozen=True, slots=True)
class DriftRows:
    """A run's drift check row and finding rows, without the run's key."""

    check: dict[str, Any]
    findings: list[dict[str, Any]]


# --- writes: inside the caller's transaction ----------------------------------------------


def drift_writes(
    items: Sequence[tuple[int, DriftRows]],
) -> list[tuple[Table, list[dict[str, Any]]]]:
    """The drift rows of several new runs (run key, rows), by table, for db/bulk.py."""
    now = datetime.now(UTC)
    return [
        (CHECKS, [dict(r.check, run_pk=pk, checked_at=now) for pk, r in items]),
        (FINDINGS, [dict(f, run_pk=pk) for pk, r in items for f in r.findings]),
    ]


def write_drift_many(conn: Connection, items: Sequence[tuple[int, DriftRows]]) -> None:
    """Insert the drift rows of several new runs (run key, rows) in one statement a table."""
    # Straight to the driver (db/bulk.py), as the rollout's own rows: SQLAlchemy's
    # executemany built each row's parameters at ~0.05 ms a run.
    bulk_insert_all(conn, drift_writes(items))


def replace_drift(conn: Connection, items: Sequence[tuple[int, DriftRows]]) -> None:
    """Replace the drift rows of several runs (recompute), in the caller's transaction."""
    if not items:
        return
    pks = [pk for pk, _ in items]
    # Findings first: SQLite cascades only with foreign keys on, which a caller may not have.
    conn.execute(delete(FINDINGS).where(FINDINGS.c.run_pk.in_(pks)))
    conn.execute(delete(CHECKS).where(CHECKS.c.run_pk.in_(pks)))
    write_drift_many(conn, items)


@dataclass(frozen=True, slots=True)
class ReadCount:
    """Legacy reads of one (client, UTC day, route), aggregated in memory."""

    client: str
    day: date
    route: str
    reads: int
    last_seen: datetime


def upsert_legacy_reads(conn: Connection, counts: Iterable[ReadCount]) -> None:
    """Add read counts to `legacy_reads`, one upsert per (client, day, route)."""
    rows = [
        {
            "client": c.client,
            "day": c.day,
            "route": c.route,
            "reads": c.reads,
            "last_seen": c.last_seen,
        }
        for c in counts
    ]
    if not rows:
        return
    name = conn.dialect.name
    stmt: Any
    if name == "postgresql":
        stmt = postgresql.insert(LEGACY_READS)
        latest = func.greatest(LEGACY_READS.c.last_seen, stmt.excluded.last_seen)
    elif name == "sqlite":
        stmt = sqlite.insert(LEGACY_READS)
        # SQLite's two-argument max() is a scalar; timestamps are ISO text there, so the
        # text order is the time order.
        latest = func.max(LEGACY_READS.c.last_seen, stmt.excluded.last_seen)
    else:  # pragma: no cover - the engine refuses other databases
        raise ValueError(f"unsupported database {name!r}")
    stmt = stmt.on_conflict_do_update(
        index_elements=["client", "day", "route"],
        set_={"reads": LEGACY_READS.c.reads + stmt.excluded.reads, "last_seen": latest},
    )
    conn.execute(stmt, rows)


# --- queries ------------------------------------------------------------------------------


def utc_day(column: Any, dialect_name: str) -> ColumnElement[Any]:
    """The UTC calendar day of a stored timestamp, as a SQL expression."""
    if dialect_name == "postgresql":
        # timestamptz::date would use the session's time zone; fix it to UTC.
        return cast(func.timezone("UTC", column), Date)
    # SQLite keeps naive UTC text ('YYYY-MM-DD HH:MM:SS.ffffff'): its date() is the day.
    return func.date(column)


def as_date(value: object) -> date:
    """A day read back from utc_day (a date on PostgreSQL, 'YYYY-MM-DD' text on SQLite)."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value))


def has_drift_clause(value: bool, kind: str | None = None) -> ColumnElement[bool]:
    """A where-clause over Run.id: the run has (or has not) a stored finding (of `kind`)."""
    # An alias: a query that itself selects findings must not correlate this one away.
    finding = aliased(DriftFinding)
    found = exists().where(finding.run_pk == Run.id)
    if kind is not None:
        found = found.where(finding.kind == kind)
    return found if value else ~found


# Built once (a hot path of every run listing): executed with the keys as parameters.
_KINDS_OF_RUNS = (
    select(DriftFinding.run_pk, DriftFinding.kind)
    .where(DriftFinding.run_pk.in_(bindparam("pks", expanding=True)))
    .distinct()
)


def drift_kinds_for(session: Session, run_pks: Sequence[int]) -> dict[int, list[str]]:
    """The distinct finding kinds of each run (in DRIFT_KINDS order); runs without: absent."""
    if not run_pks:
        return {}
    return kinds_by_run(session.connection().execute(_KINDS_OF_RUNS, {"pks": list(run_pks)}))


_KIND_ORDER: dict[str, int] = {kind: i for i, kind in enumerate(DRIFT_KINDS)}


def kinds_by_run(pairs: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    """The distinct kinds of each run among `(run_pk, kind)` pairs, in DRIFT_KINDS order."""
    found: dict[int, set[str]] = {}
    for run_pk, kind in pairs:
        found.setdefault(run_pk, set()).add(kind)
    return {
        pk: sorted(kinds, key=lambda k: (_KIND_ORDER.get(k, len(_KIND_ORDER)), k))
        for pk, kinds in found.items()
    }
