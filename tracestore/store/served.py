"""Served reads across formats: a run's trace or trajectories, stored or converted.

Readers of either format keep working whatever the producer sent: a legacy-only run is
served a trace converted from its trajectories, a trace-only run is served trajectories
converted from its trace. Conversion runs on the stored document, with the same pure
converters as `POST /v1/convert` and `tracestore backfill` (deterministic, so a served
conversion equals a backfilled one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from tracestore.convert import Conversion, trace_to_trajectories, trajectories_to_trace
from tracestore.errors import NotFound
from tracestore.models import Run, RunDocument
from tracestore.store.documents import decompress_document
from tracestore.wire.trace import classify_trace, unwrap_trace

Source = Literal["stored", "converted"]
USABLE_TRACE_KINDS = ("full", "wrapped")


@dataclass(frozen=True, slots=True)
class Served:
    """A part of a run as served, with where it came from."""

    data: Any
    source: Source
    trace_kind: str | None
    conversion: Conversion[Any] | None = None


def serve_trace(doc: Mapping[str, Any], received_at: datetime | None = None) -> Served:
    """The full-shape v3 trace of a document: its own (unwrapped), else converted.

    A full or wrapped trace with nothing in it (`session_trace: null`: `holds_nothing`)
    is converted too when the run has trajectories (docs/FORMAT.md §5). A
    converted trace's `created_at` is the document's own when it has one, else the time
    the store received the rollout.
    """
    trace = doc.get("trace")
    kind = classify_trace(trace)
    session: Mapping[str, Any] | None = None
    if kind in USABLE_TRACE_KINDS and isinstance(trace, Mapping):
        session = unwrap_trace(trace)[0] if kind == "wrapped" else trace
        if not holds_nothing(session):
            return Served(session, "stored", kind)
    if doc.get("trajectories"):
        created_at = received_at.isoformat() if received_at is not None else None
        conversion = trajectories_to_trace(doc, created_at=created_at)
        return Served(conversion.data, "converted", kind, conversion)
    if session is not None and classify_trace(session) == "full":
        # An empty trace in the full shape is still the producer's answer; `{}` (what
        # `session_trace: null` unwraps to) has no shape at all and is never served.
        return Served(session, "stored", kind)
    raise nothing_to_serve(doc.get("run_id"), kind, "trace", empty=session is not None)


def holds_nothing(session: Mapping[str, Any]) -> bool:
    """Whether a session trace (full shape, unwrapped) has nothing in it: every member but
    its `session_id` and `created_at` null or empty (no time step, event, message or
    metadata), as hand-built apps send an empty inner trace (docs/FORMAT.md §3)."""
    # Only a trace without a thing a producer recorded: one with metadata or time steps
    # but no events is still the producer's trace, served as sent.
    return all(
        value is None or (isinstance(value, list | dict | str) and not value)
        for key, value in session.items()
        if key not in _IDENTITY_KEYS
    )


_IDENTITY_KEYS = frozenset(("session_id", "created_at"))


def serve_trajectories(doc: Mapping[str, Any]) -> Served:
    """The legacy trajectories of a document: its own, else converted from its trace."""
    kind = classify_trace(doc.get("trace"))
    trajectories = doc.get("trajectories")
    if trajectories:
        return Served(trajectories, "stored", kind)
    if kind in USABLE_TRACE_KINDS:
        conversion = trace_to_trajectories(doc)
        return Served(conversion.data, "converted", kind, conversion)
    raise nothing_to_serve(doc.get("run_id"), kind, "trajectories")


def nothing_to_serve(
    run_id: object, kind: str | None, part: str, *, empty: bool = False
) -> NotFound:
    """The 404 of a run that has neither a usable trace nor trajectories (`empty`: its
    trace is full or wrapped, with nothing in it)."""
    if part == "trace":
        what = "no full trace (its trace is {}) and no trajectories to convert one from"
    else:
        what = "no trajectories and no full trace (its trace is {}) to convert them from"
    said = f"{kind}, with nothing in it" if empty else kind or "null"
    return NotFound(f"run {run_id!r} has " + what.format(said), run_id=run_id, trace_kind=kind)


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A stored rollout as received, with what its run row says of its parts."""

    raw: bytes
    received_at: datetime
    trace_kind: str | None
    n_steps: int
    n_trajectories: int
    # The run-level trace's events and messages: a full or wrapped trace without any may
    # be one with nothing in it (`holds_nothing` decides, from the document).
    n_events: int = 0
    n_messages: int = 0

    def converts(self, part: Literal["trace", "trajectories"]) -> bool:
        """Whether serving `part` may convert it from the other part (as serve_trace and
        serve_trajectories decide from the document: ingest wrote these columns from it).
        A full or wrapped trace without events and messages may still hold metadata and be
        served as stored: counted as converting, so a read is charged enough."""
        if part == "trace":
            holds = self.n_events > 0 or self.n_messages > 0
            return not (self.trace_kind in USABLE_TRACE_KINDS and holds) and self.n_trajectories > 0
        return self.n_trajectories == 0

    def servable(self) -> bool:
        """Whether either part can be served (its usable trace or its trajectories)."""
        return self.trace_kind in USABLE_TRACE_KINDS or self.n_trajectories > 0


_STORED = (
    select(
        RunDocument.body,
        RunDocument.encoding,
        Run.received_at,
        Run.trace_kind,
        Run.n_steps,
        Run.n_trajectories,
        Run.n_events,
        Run.n_messages,
    )
    .join(Run, Run.id == RunDocument.run_pk)
    .where(Run.run_id == bindparam("run_id"))
)


def stored_run(session: Session, run_id: str) -> StoredRun:
    """The stored rollout `run_id` (NotFound when absent)."""
    row = session.connection().execute(_STORED, {"run_id": run_id}).first()
    if row is None:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    return StoredRun(
        decompress_document(row.body, row.encoding),
        row.received_at,
        row.trace_kind,
        row.n_steps,
        row.n_trajectories,
        row.n_events,
        row.n_messages,
    )
