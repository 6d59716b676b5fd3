"""v3 traces: the session, its time steps, and each event and message stored once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from tracestore.db.base import Base, BigIntPK


class Trace(Base):
    """A run's v3 trace (`trajectory_idx` NULL) or a per-trajectory `trajectories[i].trace`."""

    __tablename__ = "traces"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    run_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"))
    trajectory_idx: Mapped[int | None]
    kind: Mapped[str]
    session_id: Mapped[str | None]
    created_at: Mapped[datetime | None]
    # `metadata` is reserved on declarative classes; the column keeps the wire name.
    meta: Mapped[Any] = mapped_column("metadata", nullable=True)
    session_metadata: Mapped[Any] = mapped_column(nullable=True)
    # A wrapped trace's keys beside `session_trace` (SPEC §3: unwrap, keep the wrapper).
    wrapper: Mapped[dict[str, Any] | None]
    # Keys of the trace with no column or child table (summary figures, unknown keys).
    extra: Mapped[dict[str, Any] | None]
    n_time_steps: Mapped[int]
    n_events: Mapped[int]
    n_messages: Mapped[int]
    # 'received' (posted by the producer) or 'converted' (made by tracestore from the
    # run's trajectories, e.g. by backfill), with the converter and the source's hash.
    origin: Mapped[str] = mapped_column(server_default="received")
    converter: Mapped[str | None]
    converter_version: Mapped[str | None]
    source_hash: Mapped[str | None]

    __table_args__ = (
        Index("ix_traces_run_pk", "run_pk"),
        Index("ix_traces_session_id", "session_id"),
        # At most one run-level trace per run, received or converted: concurrent backfills
        # cannot both store one.
        Index(
            "uq_traces_run_level",
            "run_pk",
            unique=True,
            sqlite_where=text("trajectory_idx IS NULL"),
            postgresql_where=text("trajectory_idx IS NULL"),
        ),
    )


class TraceTimeStep(Base):
    """`session_time_steps[position]`."""

    __tablename__ = "trace_time_steps"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    trace_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("traces.id", ondelete="CASCADE"))
    position: Mapped[int]
    step_id: Mapped[str | None]
    step_index: Mapped[int | None]
    turn_number: Mapped[int | None]
    timestamp: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    step_metadata: Mapped[Any] = mapped_column(nullable=True)
    extra: Mapped[dict[str, Any] | None]

    __table_args__ = (UniqueConstraint("trace_pk", "position"),)


class TraceEvent(Base):
    """One event, stored once though a full trace lists it twice (history and step)."""

    __tablename__ = "trace_events"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    trace_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("traces.id", ondelete="CASCADE"))
    run_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"))
    time_step_pk: Mapped[int | None] = mapped_column(
        BigIntPK, ForeignKey("trace_time_steps.id", ondelete="CASCADE")
    )
    # Order of the event in the trace (time-step order, then history-only events).
    position: Mapped[int]
    position_in_step: Mapped[int | None]
    history_position: Mapped[int | None]
    # Inferred from the keys (SPEC §3); an explicit `event_type` wins.
    event_type: Mapped[str]
    system_instance_id: Mapped[str | None]
    event_time: Mapped[float | None]
    time_record: Mapped[Any] = mapped_column(nullable=True)
    reward: Mapped[float | None]
    terminated: Mapped[bool | None]
    truncated: Mapped[bool | None]
    actions: Mapped[Any] = mapped_column(nullable=True)
    system_state_before: Mapped[Any] = mapped_column(nullable=True)
    system_state_after: Mapped[Any] = mapped_column(nullable=True)
    model_name: Mapped[str | None]
    provider: Mapped[str | None]
    input_tokens: Mapped[int | None]
    output_tokens: Mapped[int | None]
    total_tokens: Mapped[int | None]
    cost_usd: Mapped[float | None]
    latency_ms: Mapped[float | None]
    span_id: Mapped[str | None]
    trace_id: Mapped[str | None]
    # LLM call records, whole (request, response, tool calls, usage, token traces).
    call_records: Mapped[Any] = mapped_column(nullable=True)
    meta: Mapped[Any] = mapped_column("metadata", nullable=True)
    event_metadata: Mapped[Any] = mapped_column(nullable=True)
    extra: Mapped[dict[str, Any] | None]

    __table_args__ = (
        UniqueConstraint("trace_pk", "position"),
        Index("ix_trace_events_run_pk_event_type", "run_pk", "event_type"),
        Index("ix_trace_events_model_name", "model_name"),
    )


class TraceMessage(Base):
    """One message, stored once (history and step copies paired like events)."""

    __tablename__ = "trace_messages"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    trace_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("traces.id", ondelete="CASCADE"))
    run_pk: Mapped[int] = mapped_column(BigIntPK, ForeignKey("runs.id", ondelete="CASCADE"))
    time_step_pk: Mapped[int | None] = mapped_column(
        BigIntPK, ForeignKey("trace_time_steps.id", ondelete="CASCADE")
    )
    position: Mapped[int]
    position_in_step: Mapped[int | None]
    history_position: Mapped[int | None]
    message_type: Mapped[str | None]
    # content.text and content.json_payload (a JSON *string* on the wire, kept a string).
    text: Mapped[str | None]
    json_payload: Mapped[str | None]
    event_time: Mapped[float | None]
    message_time: Mapped[float | None]
    meta: Mapped[Any] = mapped_column("metadata", nullable=True)
    extra: Mapped[dict[str, Any] | None]

    __table_args__ = (
        UniqueConstraint("trace_pk", "position"),
        Index("ix_trace_messages_run_pk", "run_pk"),
    )
