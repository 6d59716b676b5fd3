"""Whole-document conversion: a RolloutResponse with its missing trace or trajectories filled.

`convert_document(doc, to=...)` returns a new RolloutResponse (a shallow copy of `doc`; the
input is not changed) and the `Conversion`. Converting never destroys what the producer
sent:

- by default (`replace=False`) only a missing part is filled: `to="trajectories"` when the
  document has no trajectories (null or `[]`), `to="trace"` when its trace is null or `{}`.
  A part the document has is kept as sent (`action` `kept`, with a warning saying how to
  replace it), even a summary trace;
- `replace=True` converts and overwrites the part (`action` `replaced`, a `replaced` loss
  entry), except when the conversion gives nothing (a summary trace has no steps; empty
  trajectories make no time steps): then the document's own part is kept, and a warning
  says so;
- filling a part from a source that gives nothing (`action` `filled`) leaves it empty, with
  a warning: there was nothing to lose.

Nothing else (metrics, envelope keys) is touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace as with_changes
from typing import Any, Literal, overload

from tracestore.convert.report import (
    CONVERTER_VERSION,
    Conversion,
    LossEntry,
    Provenance,
    source_sha256,
)
from tracestore.convert.to_trace import CONVERTER_NAME as TO_TRACE
from tracestore.convert.to_trace import trajectories_to_trace
from tracestore.convert.to_trajectories import CONVERTER_NAME as TO_TRAJECTORIES
from tracestore.convert.to_trajectories import trace_to_trajectories
from tracestore.wire.trace import classify_trace

Target = Literal["trace", "trajectories"]
TARGETS: tuple[Target, ...] = ("trace", "trajectories")


@overload
def convert_document(
    doc: Mapping[str, Any],
    to: Literal["trace"],
    *,
    replace: bool = False,
    created_at: str | None = None,
) -> tuple[dict[str, Any], Conversion[dict[str, Any]]]: ...


@overload
def convert_document(
    doc: Mapping[str, Any],
    to: Literal["trajectories"],
    *,
    replace: bool = False,
    created_at: str | None = None,
) -> tuple[dict[str, Any], Conversion[list[Any]]]: ...


@overload
def convert_document(
    doc: Mapping[str, Any], to: str, *, replace: bool = False, created_at: str | None = None
) -> tuple[dict[str, Any], Conversion[Any]]: ...


def convert_document(
    doc: Mapping[str, Any], to: str, *, replace: bool = False, created_at: str | None = None
) -> tuple[dict[str, Any], Conversion[Any]]:
    """Return a copy of `doc` with its trace or trajectories filled from the other part.

    `replace` overwrites a part the document already has; `created_at` stands in for the
    creation time of a trace made from trajectories (e.g. when the store received it).
    """
    if to == "trace":
        return _to_trace(doc, replace, created_at)
    if to == "trajectories":
        return _to_trajectories(doc, replace)
    raise ValueError(f"unknown conversion target {to!r}: expected one of {TARGETS}")


def _to_trace(
    doc: Mapping[str, Any], replace: bool, created_at: str | None
) -> tuple[dict[str, Any], Conversion[Any]]:
    new_doc = dict(doc)
    old = doc.get("trace")
    kind = classify_trace(old)
    has = kind not in (None, "empty")
    if has and not replace:
        return new_doc, _kept(
            doc,
            TO_TRACE,
            old,
            f"the document has a {kind} trace: kept as sent (replace converts the trajectories "
            "over it)",
        )
    conversion = trajectories_to_trace(doc, created_at=created_at)
    if not conversion.data["session_time_steps"]:
        why = "the trajectories hold no steps, so the converted trace is empty"
        if has:
            return new_doc, _kept(doc, TO_TRACE, old, f"{why}: the document's {kind} trace kept")
        new_doc["trace"] = conversion.data
        return new_doc, with_changes(conversion, warnings=(why,))
    new_doc["trace"] = conversion.data
    if has:
        entry = LossEntry("trace", "replaced", f"the document's {kind} trace was replaced")
        return new_doc, _replaced(conversion, entry)
    return new_doc, conversion


def _to_trajectories(
    doc: Mapping[str, Any], replace: bool
) -> tuple[dict[str, Any], Conversion[Any]]:
    new_doc = dict(doc)
    old = doc.get("trajectories")
    old_list: list[Any] = old if isinstance(old, list) else []
    has = bool(old_list)
    if has and not replace:
        return new_doc, _kept(
            doc,
            TO_TRAJECTORIES,
            old,
            f"the document has {len(old_list)} trajectories: kept as sent (replace converts the "
            "trace over them)",
        )
    conversion = trace_to_trajectories(doc)
    if not conversion.data:
        why = "; ".join(e.detail for e in conversion.losses if e.path == "trace") or "no steps"
        message = f"the trace gives no trajectories ({why})"
        if has:
            return new_doc, _kept(
                doc, TO_TRAJECTORIES, old, f"{message}: the document's trajectories kept"
            )
        new_doc["trajectories"] = conversion.data
        return new_doc, with_changes(conversion, warnings=(message,))
    new_doc["trajectories"] = conversion.data
    if has:
        entry = LossEntry(
            "trajectories", "replaced", f"the document's {len(old_list)} trajectories were replaced"
        )
        return new_doc, _replaced(conversion, entry)
    return new_doc, conversion


def _kept(doc: Mapping[str, Any], converter: str, part: Any, warning: str) -> Conversion[Any]:
    provenance = Provenance(converter, CONVERTER_VERSION, source_sha256(doc))
    return Conversion(part, [], provenance, "none", action="kept", warnings=(warning,))


def _replaced(conversion: Conversion[Any], entry: LossEntry) -> Conversion[Any]:
    return with_changes(conversion, losses=[*conversion.losses, entry], action="replaced")
