"""A rollout's drift rows, computed before its ingest transaction: pure, no I/O.

`drift_rows(doc)` runs the comparison (docs/FORMAT.md §6) and the phase-1 reproduction
check (the trace alone, converted by `trace_to_trajectories`, gives back the stored steps'
obs, reward, done, truncated and normalized tool calls), so writing them inside the
rollouts' transaction (with the rollout's rows: `store.rollouts.write_many`) is two bulk
inserts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracestore.convert import CONVERTER_VERSION
from tracestore.convert.to_trajectories import core_steps
from tracestore.correlation import Resolution
from tracestore.drift.compare import REWARD_TOLERANCE, Comparison, compare_rollout, same_json
from tracestore.jsontext import member as _get
from tracestore.store.drift import DriftRows
from tracestore.toolcalls import normalize_tool_calls
from tracestore.wire.trace import classify_trace, infer_event_type, unwrap_trace

# Fields the reproduction check compares, in the order a gap is reported.
REPRODUCED_FIELDS = ("obs", "reward", "done", "truncated", "tool_calls")
_MAX_DETAIL = 200


@dataclass(frozen=True, slots=True)
class Reproduction:
    """Whether a dual-serialized run's trace alone gives back its trajectory steps."""

    dual_serialized: bool
    reproduces: bool | None = None
    gap: str | None = None  # first field that does not come back, or `<kind>_trace`
    detail: str | None = None
    converter_version: str | None = None


def _steps(trajectories: object) -> list[Any]:
    if not isinstance(trajectories, list):
        return []
    out: list[Any] = []
    for trajectory in trajectories:
        steps = _get(trajectory, "steps")
        if isinstance(steps, list):
            out.extend(steps)
    return out


def _reward(value: object) -> float | None:
    try:
        return float(value or 0)  # type: ignore[arg-type]  # SPEC §6 reads float(x or 0)
    except (TypeError, ValueError):
        return None


def _differing_fields(stored: object, converted: object) -> list[str]:
    fields: list[str] = []
    # As the comparison reads them: JSON values, where `true` does not come back as `1`.
    if not same_json(_get(stored, "obs"), _get(converted, "obs")):
        fields.append("obs")
    a, b = _reward(_get(stored, "reward")), _reward(_get(converted, "reward"))
    if a is None or b is None or (a != b and abs(a - b) > REWARD_TOLERANCE):
        fields.append("reward")
    if bool(_get(stored, "done")) != bool(_get(converted, "done")):
        fields.append("done")
    if bool(_get(stored, "truncated")) != bool(_get(converted, "truncated")):
        fields.append("truncated")
    stored_calls = normalize_tool_calls(_get(stored, "tool_calls"))
    if not same_json(stored_calls, normalize_tool_calls(_get(converted, "tool_calls"))):
        fields.append("tool_calls")
    return fields


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 1] + "…"


def reproduction(doc: Mapping[str, Any]) -> Reproduction:
    """Check that the trace alone reproduces the stored trajectory steps (issue 3, phase 1)."""
    stored = _steps(doc.get("trajectories"))
    trace = doc.get("trace")
    kind = classify_trace(trace)
    if not stored or kind is None:
        return Reproduction(dual_serialized=False)
    if kind not in ("full", "wrapped") or not isinstance(trace, Mapping):
        return Reproduction(True, False, f"{kind}_trace", f"a {kind} trace has no per-step events")
    # The trace alone, without the envelope: the envelope only lends the cid and inference
    # URL, which are not compared. Only the compared fields are converted (core_steps).
    converted = core_steps(trace)
    if len(converted) != len(stored):
        return Reproduction(
            True,
            False,
            "step_count",
            f"{len(stored)} trajectory steps, the trace converts to {len(converted)}",
            CONVERTER_VERSION,
        )
    counts: dict[str, int] = {}
    first: tuple[int, list[str]] | None = None
    for position, (a, b) in enumerate(zip(stored, converted, strict=True)):
        fields = _differing_fields(a, b)
        for name in fields:
            counts[name] = counts.get(name, 0) + 1
        if fields and first is None:
            first = (position, fields)
    if first is None:
        return Reproduction(True, True, converter_version=CONVERTER_VERSION)
    position, fields = first
    differing = ", ".join(f"{name} {counts[name]}" for name in REPRODUCED_FIELDS if name in counts)
    return Reproduction(
        True,
        False,
        fields[0],
        _cut(
            f"{', '.join(fields)} first differ{'s' if len(fields) == 1 else ''} at position "
            f"{position}; "
            f"steps differing per field: {differing}"
        ),
        CONVERTER_VERSION,
    )


def _has_environment_event(trace: Mapping[str, Any]) -> bool:
    # Stops at the first environment event: cheaper than reading the whole trace.
    session = unwrap_trace(trace)[0] if classify_trace(trace) == "wrapped" else trace
    history = session.get("event_history")
    items: list[Any] = list(history) if isinstance(history, list) else []
    for step in session.get("session_time_steps") or ():
        events = _get(step, "events")
        if isinstance(events, list):
            items.extend(events)
    return any(isinstance(e, Mapping) and infer_event_type(e) == "environment" for e in items)


def _usable_trace(doc: Mapping[str, Any], comparison: Comparison) -> bool:
    if comparison.comparable:
        return True
    trace = doc.get("trace")
    # Only runs without trajectory steps leave it open: compare_rollout skipped the trace.
    if comparison.reason == "no_trajectories" and isinstance(trace, Mapping):
        return classify_trace(trace) in ("full", "wrapped") and _has_environment_event(trace)
    return False


def drift_rows(doc: Mapping[str, Any], resolution: Resolution | None = None) -> DriftRows:
    """The drift rows of a validated rollout (pure); written later with the rollout's own
    rows (store/drift.py `drift_writes`), or by `replace_drift` when recomputed.
    `resolution`: the document's resolve_correlation, when the caller has it."""
    comparison = compare_rollout(doc, resolution)
    repro = reproduction(doc)
    check = {
        "comparator_version": comparison.version,
        "comparable": comparison.comparable,
        "reason": comparison.reason,
        "trajectory_steps": comparison.trajectory_steps,
        "environment_events": comparison.environment_events,
        "n_findings": len(comparison.findings),
        "usable_trace": _usable_trace(doc, comparison),
        "dual_serialized": repro.dual_serialized,
        "reproduces": repro.reproduces,
        "reproduce_gap": repro.gap,
        "reproduce_detail": repro.detail,
        "converter_version": repro.converter_version,
    }
    findings = [
        {
            "ordinal": i,
            "kind": f.kind,
            "trajectory_index": f.trajectory_index,
            "step_index": f.step_index,
            "position": f.position,
            "expected": f.expected,
            "actual": f.actual,
            "message": f.message,
            "comparator_version": comparison.version,
        }
        for i, f in enumerate(comparison.findings)
    ]
    return DriftRows(check, findings)
