"""Backfill: store converted v3 traces for legacy-only runs.

A legacy-only run has trajectories and no run-level trace row. Each batch converts its runs'
trajectories (the same pure converter as served reads) and stores the trace rows with
provenance (origin `converted`, converter, version, source hash) in ONE transaction, so a
kill loses at most the batch in flight and a rerun picks up where it stopped.

Concurrency: SQLite serializes batches with ingest (BEGIN IMMEDIATE). On PostgreSQL each
batch locks its runs with `FOR UPDATE SKIP LOCKED`, so several backfills share the work; the
unique index on (run_pk) WHERE trajectory_idx IS NULL makes a second trace for a run
impossible, and a run a concurrent backfill converted first is skipped, not failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from sqlalchemy import Connection, Engine, exists, func, select
from sqlalchemy.exc import IntegrityError

from tracestore.convert import trajectories_to_trace
from tracestore.db.uow import write_session
from tracestore.ingest.project import project_trace_document
from tracestore.models import Run, RunDocument, Trace
from tracestore.store.documents import decompress_document
from tracestore.store.rollouts import write_trace

_HAS_RUN_TRACE = exists().where(Trace.run_pk == Run.id, Trace.trajectory_idx.is_(None))
PENDING = (Run.n_trajectories > 0) & ~_HAS_RUN_TRACE


@dataclass(slots=True)
class BackfillResult:
    """What one backfill (or one batch of it) did."""

    runs: int = 0
    steps: int = 0
    skipped: int = 0  # converted meanwhile by a concurrent backfill
    failed: dict[str, str] = field(default_factory=dict)  # run_id -> reason

    def add(self, other: BackfillResult) -> None:
        """Accumulate another result into this one."""
        self.runs += other.runs
        self.steps += other.steps
        self.skipped += other.skipped
        self.failed.update(other.failed)


def count_pending(engine: Engine) -> int:
    """Legacy-only runs still without a trace."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Run).where(PENDING)).scalar_one())


def _convert_one(conn: Connection, run_pk: int, run_id: str, result: BackfillResult) -> None:
    body, encoding, received_at = conn.execute(
        select(RunDocument.body, RunDocument.encoding, Run.received_at)
        .join(Run, Run.id == RunDocument.run_pk)
        .where(RunDocument.run_pk == run_pk)
    ).one()
    doc = orjson.loads(decompress_document(body, encoding))
    try:
        # The receive time stands in for a creation time, as on a served read: the two agree.
        conversion = trajectories_to_trace(doc, created_at=received_at.isoformat())
        rows = project_trace_document(conversion.data)
    except Exception as exc:
        # A document the converter cannot handle is reported, and the batch goes on; it
        # stays pending for a later (fixed) converter.
        result.failed[run_id] = f"{type(exc).__name__}: {exc}"
        return
    provenance = conversion.provenance
    try:
        # A savepoint per run: a unique violation (another backfill stored this run's
        # trace first) undoes only this run's rows.
        with conn.begin_nested():
            write_trace(
                conn,
                run_pk,
                rows,
                {
                    "origin": "converted",
                    "converter": provenance.converter,
                    "converter_version": provenance.converter_version,
                    "source_hash": provenance.source_sha256,
                },
            )
    except IntegrityError:
        result.skipped += 1
        return
    result.runs += 1
    result.steps += len(rows.events)


def backfill_batch(engine: Engine, batch_size: int, after: int = 0) -> tuple[BackfillResult, int]:
    """Convert up to `batch_size` pending runs with key > `after` in one transaction.

    Returns the batch's result and the largest run key it looked at (0 when none was left).
    """
    result = BackfillResult()
    with write_session(engine) as session:
        conn = session.connection()
        query = (
            select(Run.id, Run.run_id)
            .where(PENDING, Run.id > after)
            .order_by(Run.id)
            .limit(batch_size)
        )
        if conn.dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True, of=Run)
        candidates = conn.execute(query).all()
        for run_pk, run_id in candidates:
            _convert_one(conn, run_pk, run_id, result)
    return result, (candidates[-1][0] if candidates else 0)


def backfill(
    engine: Engine,
    *,
    batch_size: int = 100,
    limit: int | None = None,
    on_batch: Callable[[BackfillResult], None] | None = None,
) -> BackfillResult:
    """Convert every pending run (or `limit` of them), batch by batch."""
    total = BackfillResult()
    after = 0
    while limit is None or total.runs + total.skipped + len(total.failed) < limit:
        size = (
            batch_size
            if limit is None
            else min(batch_size, limit - total.runs - total.skipped - len(total.failed))
        )
        batch, last = backfill_batch(engine, size, after)
        if last == 0:
            break
        # Failed runs stay pending; moving `after` past them keeps the loop from retrying
        # them forever within this run (a later backfill tries them again).
        after = last
        total.add(batch)
        if on_batch is not None:
            on_batch(batch)
    return total
