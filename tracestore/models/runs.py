"""One row per accepted rollout, and its compressed raw document."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, LargeBinary
from sqlalchemy.orm import Mapped, mapped_column

from tracestore.db.base import Base, BigIntPK


class Run(Base):
    """A rollout (one RolloutResponse), with the figures queries filter and sort by."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    run_id: Mapped[str] = mapped_column(unique=True)
    # Canonical cid (SPEC §4) and where it was found.
    correlation_id: Mapped[str | None]
    correlation_source: Mapped[str | None]
    received_at: Mapped[datetime]
    # SPEC §3 shape of `trace`; NULL when trace is null.
    trace_kind: Mapped[str | None]
    n_trajectories: Mapped[int]
    n_steps: Mapped[int]
    n_events: Mapped[int]
    n_messages: Mapped[int]
    mean_return: Mapped[float | None]
    num_steps: Mapped[int | None]
    num_episodes: Mapped[int | None]
    outcome_score: Mapped[float | None]
    events_score: Mapped[float | None]
    metrics: Mapped[dict[str, Any]]
    aborted: Mapped[bool]
    ops_executed: Mapped[int]
    branches: Mapped[Any] = mapped_column(nullable=True)
    pipeline_metadata: Mapped[Any] = mapped_column(nullable=True)
    # sha256 of the document's bytes as received: equal bytes are a duplicate at once;
    # otherwise ingest compares JSON values (duplicate, or conflict).
    content_hash: Mapped[str]
    # Size of the document as received, in bytes.
    doc_bytes: Mapped[int]
    # The run's env and policy as the reports read them (reports/views.sql, run_facts): its
    # first trajectory's, else the string its run-level trace's metadata names. Filters
    # match these besides every trajectory's, so runs without trajectories are found too.
    env_id: Mapped[str | None]
    policy_id: Mapped[str | None]
    # Environment events of the run-level full or wrapped trace: the decision steps of a
    # run without trajectory steps (n_steps counts trajectory steps only).
    n_trace_steps: Mapped[int] = mapped_column(server_default="0")
    # Where the run falls in commit order, for incremental exports (issue 15; how an
    # export cuts on it: tracestore/reports/watermark.py, docs/SCALING.md). On SQLite a
    # counter that write_many assigns under the single write lock, so values commit in
    # order. On PostgreSQL the writing transaction's id (the column's default, set by
    # migration 0005: pg_current_xact_id()); ids are not commit-ordered, so the export
    # cuts below the oldest transaction still open instead. NULL only on SQLite, for a
    # row some other writer left without one; the export sequences those first.
    ingest_seq: Mapped[int | None]

    __table_args__ = (
        Index("ix_runs_correlation_id", "correlation_id"),
        Index("ix_runs_received_at", "received_at"),
        Index("ix_runs_env_id", "env_id"),
        Index("ix_runs_policy_id", "policy_id"),
        Index("ix_runs_ingest_seq", "ingest_seq"),
    )


class RunDocument(Base):
    """The document as received, zstd-compressed: what GET /v1/rollouts/{run_id} returns.

    The typed tables are what queries and reports read; this copy is what makes the store
    lossless to the byte (key order, number spelling, NUL characters on PostgreSQL).
    """

    __tablename__ = "run_documents"

    run_pk: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    encoding: Mapped[str]
    body: Mapped[bytes] = mapped_column(LargeBinary)
