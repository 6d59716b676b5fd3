"""A run's end of life (issue 20): the deletion audit, datasets that pin runs, retention rules.

Also two indexes on the trace tables that deleting needs: see the bottom of this module.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tracestore.db.base import Base, BigIntPK
from tracestore.models.traces import TraceEvent, TraceMessage


class RunDeletion(Base):
    """One deleted run: what it was (id, content hash, size), who deleted it, when, why.

    Never its content. Written in the deleting transaction, so a run is gone exactly when
    its audit row exists. The lake export reads it to delete the run from the lake too.
    """

    __tablename__ = "run_deletions"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    run_id: Mapped[str]
    # sha256 of the document's bytes as received (runs.content_hash), and their size.
    content_hash: Mapped[str]
    doc_bytes: Mapped[int]
    received_at: Mapped[datetime]
    # The run's ingest_seq: with run_id it names the exact row set an export wrote (a run
    # deleted, then posted again, is a new run with a higher sequence).
    ingest_seq: Mapped[int | None]
    deleted_at: Mapped[datetime]
    # The API key's name, the CLI user (`cli:NAME`), or `retention:RULE`.
    deleted_by: Mapped[str]
    reason: Mapped[str | None]
    # 'api', 'cli' or 'retention'.
    via: Mapped[str]
    # Deleted although a dataset pinned it; `pinned_by` lists those datasets' names.
    forced: Mapped[bool]
    pinned_by: Mapped[list[Any] | None]
    # Where the deletion falls in commit order, for lake exports (as runs.ingest_seq: on
    # SQLite max + 1 under the write lock; on PostgreSQL the deleting transaction's id,
    # the column's default set by migration 0006).
    deletion_seq: Mapped[int | None]

    __table_args__ = (
        Index("ix_run_deletions_run_id", "run_id"),
        Index("ix_run_deletions_deleted_at", "deleted_at"),
        Index("ix_run_deletions_deletion_seq", "deletion_seq"),
        # The highest sequence a deleted run held: on SQLite, where ingest_seq is max + 1,
        # the next sequence must stay above it (see docs/RETENTION.md, "the lake").
        Index("ix_run_deletions_ingest_seq", "ingest_seq"),
    )


class Dataset(Base):
    """A named, immutable set of runs: what a trainer trained on. Its runs are pinned."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    name: Mapped[str] = mapped_column(unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str | None]
    note: Mapped[str | None]
    # The list filters that selected the runs, as given (GET /v1/rollouts' names).
    filter: Mapped[dict[str, Any]]
    n_runs: Mapped[int]
    # sha256 over the sorted `run_id content_hash` lines: one value names the whole set.
    manifest_hash: Mapped[str]


class DatasetRun(Base):
    """One run of a dataset, by run_id (kept when a forced delete removes the run)."""

    __tablename__ = "dataset_runs"

    dataset_pk: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(primary_key=True)
    content_hash: Mapped[str]
    received_at: Mapped[datetime]

    __table_args__ = (
        # Is this run pinned? Asked for every run a delete or a sweep touches.
        Index("ix_dataset_runs_run_id", "run_id"),
    )


class RetentionRule(Base):
    """A retention rule: the runs of its scope older than `max_age_s`, or past the newest
    `keep_last`, are deleted by a sweep (pinned runs excepted)."""

    __tablename__ = "retention_rules"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    name: Mapped[str]
    # Scope: runs of this env / policy (the list filters' meaning); NULL: every run.
    env_id: Mapped[str | None]
    policy_id: Mapped[str | None]
    # Seconds since received_at past which a run goes; NULL: no age limit.
    max_age_s: Mapped[float | None]
    # Runs of the scope kept, newest first; NULL: no count limit.
    keep_last: Mapped[int | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (UniqueConstraint("name"),)


# Deleting a time step makes the database look for events and messages that point at it
# (the foreign keys cascade): without these indexes that is a scan of trace_events and
# trace_messages per time step, which made deleting one run take seconds on a large store.
# Declared here, beside the deletion they serve (migration 0006 creates them).
Index("ix_trace_events_time_step_pk", TraceEvent.time_step_pk)
Index("ix_trace_messages_time_step_pk", TraceMessage.time_step_pk)
