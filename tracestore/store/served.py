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

import orjson
from sqlalchemy.orm import Session

from tracestore.convert import Conversion, trace_to_trajectories, trajectories_to_trace
from tracestore.errors import NotFound
from tracestore.store.documents import load_document_received
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


def _document(session: Session, run_id: str) -> tuple[dict[str, Any], datetime]:
    raw, received_at = load_document_received(session.connection(), run_id)
    doc: dict[str, Any] = orjson.loads(raw)
    return doc, received_at


def _has_steps(doc: Mapping[str, Any]) -> bool:
    return any(t.get("steps") for t in doc.get("trajectories") or [] if isinstance(t, Mapping))


def serve_trace(doc: Mapping[str, Any], received_at: datetime | None = None) -> Served:
    """The full-shape v3 trace of a document: its own (unwrapped), else converted.

    A converted trace's `created_at` is the document's own when it has one, else the
    time the store received the rollout.
    """
    trace = doc.get("trace")
    kind = classify_trace(trace)
    if kind in USABLE_TRACE_KINDS and isinstance(trace, Mapping):
        session_trace = unwrap_trace(trace)[0] if kind == "wrapped" else trace
        return Served(session_trace, "stored", kind)
    if doc.get("trajectories"):
        created_at = received_at.isoformat() if received_at is not None else None
        conversion = trajectories_to_trace(doc, created_at=created_at)
        return Served(conversion.data, "converted", kind, conversion)
    raise NotFound(
        f"run {doc.get('run_id')!r} has no full trace (its trace is "
        f"{kind or 'null'}) and no trajectories to convert one from",
        run_id=doc.get("run_id"),
        trace_kind=kind,
    )


def serve_trajectories(doc: Mapping[str, Any]) -> Served:
    """The legacy trajectories of a document: its own, else converted from its trace."""
    kind = classify_trace(doc.get("trace"))
    trajectories = doc.get("trajectories")
    if trajectories:
        return Served(trajectories, "stored", kind)
    if kind in USABLE_TRACE_KINDS:
        conversion = trace_to_trajectories(doc)
        return Served(conversion.data, "converted", kind, conversion)
    raise NotFound(
        f"run {doc.get('run_id')!r} has no trajectories and no full trace (its trace is "
        f"{kind or 'null'}) to convert them from",
        run_id=doc.get("run_id"),
        trace_kind=kind,
    )


def served_trace(session: Session, run_id: str) -> Served:
    """The run's trace, stored or converted (NotFound when it has neither source)."""
    return serve_trace(*_document(session, run_id))


def served_trajectories(session: Session, run_id: str) -> Served:
    """The run's trajectories, stored or converted (NotFound when it has neither source)."""
    return serve_trajectories(_document(session, run_id)[0])
