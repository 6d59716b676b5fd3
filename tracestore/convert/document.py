"""Whole-document conversion: a RolloutResponse with its trace or trajectories filled in.

`convert_document(doc, to=...)` returns a new RolloutResponse (a shallow copy of `doc`; the
input is not changed) whose `trace` (`to="trace"`) or `trajectories` (`to="trajectories"`) is
replaced by the conversion of the other part, and the `Conversion`. When the document
already had a non-null trace, or a non-empty trajectories list, the loss report says it was
replaced (kind `replaced`). Nothing else (metrics, envelope keys) is touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal, overload

from tracestore.convert.report import Conversion, LossEntry
from tracestore.convert.to_trace import trajectories_to_trace
from tracestore.convert.to_trajectories import trace_to_trajectories
from tracestore.wire.trace import classify_trace

Target = Literal["trace", "trajectories"]
TARGETS: tuple[Target, ...] = ("trace", "trajectories")


@overload
def convert_document(
    doc: Mapping[str, Any], to: Literal["trace"]
) -> tuple[dict[str, Any], Conversion[dict[str, Any]]]: ...


@overload
def convert_document(
    doc: Mapping[str, Any], to: Literal["trajectories"]
) -> tuple[dict[str, Any], Conversion[list[Any]]]: ...


@overload
def convert_document(doc: Mapping[str, Any], to: str) -> tuple[dict[str, Any], Conversion[Any]]: ...


def convert_document(doc: Mapping[str, Any], to: str) -> tuple[dict[str, Any], Conversion[Any]]:
    """Return a copy of `doc` with its trace or trajectories converted from the other part."""
    new_doc = dict(doc)
    conversion: Conversion[Any]
    if to == "trace":
        conversion = trajectories_to_trace(doc)
        old = doc.get("trace")
        if old is not None:
            detail = f"the document's {classify_trace(old)} trace was replaced"
            conversion = _note(conversion, LossEntry("trace", "replaced", detail))
        new_doc["trace"] = conversion.data
    elif to == "trajectories":
        conversion = trace_to_trajectories(doc)
        old = doc.get("trajectories")
        if isinstance(old, list) and old:
            detail = f"the document's {len(old)} trajectories were replaced"
            conversion = _note(conversion, LossEntry("trajectories", "replaced", detail))
        new_doc["trajectories"] = conversion.data
    else:
        raise ValueError(f"unknown conversion target {to!r}: expected one of {TARGETS}")
    return new_doc, conversion


def _note(conversion: Conversion[Any], entry: LossEntry) -> Conversion[Any]:
    return replace(conversion, losses=[*conversion.losses, entry])
