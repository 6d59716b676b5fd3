"""Drift between the two serializations of one rollout (SPEC §6): pure, no I/O.

`compare_rollout` aligns the trajectory steps (all trajectories, concatenated in order) with
the trace's environment events (each once, in time-step order) by position and reports where
they disagree. It runs inside the ingest transaction of every rollout, so it reads each
document once, never raises on odd input, and only renders values for findings.

Decisions where SPEC §6 is silent (each is asserted by tests/unit/test_drift_compare.py):

- Not-comparable reasons are checked in this order: the trace (`no_trace`, then the
  `<kind>_trace` of a kind other than full/wrapped), then `no_trajectories` (no trajectory
  has a step), then `no_environment_events`.
- `return_mismatch` is checked only for comparable runs, like the per-step kinds; it uses
  every environment event, not only the aligned prefix, and is skipped when
  `metrics.episode_returns` is not a list. Only `correlation_conflict` applies to every run.
- An environment event's `reward` null is 0.0, as a null step reward is (SPEC §5); a value
  that is not a number (after `float(x or 0)`) is a mismatch; tolerances are absolute. NaN
  needs no rule: ingest refuses NaN tokens, so documents never hold one.
- The trace "has tool calls for a step" when the first SPEC §5 source holding a non-empty
  list has one (`wire.trace.time_step_tool_calls`); an empty list falls through to the
  next source, and a step with none anywhere is not compared. A missing or null
  `step.tool_calls` is no calls.
- A tool-call message is any message of the time step whose `metadata.is_tool_call` is
  true, whatever its `message_type` (hand-built traces use their own types).
- obs and tool calls are compared as JSON values (`same_json`): `true` is not `1` (Python's
  `True == 1` would hide it), numbers compare by value (`1` equals `1.0`), key order does
  not matter. Only `done` / `truncated` are read as truthiness (`bool(x)`, SPEC §6; synth-ai's
  read-back writes `terminated` as 0/1, SPEC §3) and rewards as floats within a tolerance.
- Items found only in the history list belong to the time step whose `step_id` equals their
  `metadata.step_id`; an environment event in no time step falls back to its own metadata.
- Per-trajectory traces (`trajectories[i].trace`) are not compared; SPEC §6 names the
  top-level trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tracestore.correlation import Resolution, resolve_correlation
from tracestore.jsontext import member as _get
from tracestore.toolcalls import normalize_tool_calls
from tracestore.vocabulary import (
    DRIFT_KINDS,
    DriftKind,
    NotComparableReason,
)
from tracestore.wire.trace import (
    EnvStep,
    classify_trace,
    view_trace,
)

# Bump when a rule changes, so stored findings can be recomputed selectively.
# 2: obs and tool calls compared as JSON values (`true` is not `1`), in the comparison and
# in the phase-1 reproduction check.
COMPARATOR_VERSION = 2

_KIND_REASONS: dict[str, NotComparableReason] = {
    "summary": "summary_trace",
    "db_row": "db_row_trace",
    "empty": "empty_trace",
    "unknown": "unknown_trace",
}

REWARD_TOLERANCE = 1e-9
RETURN_TOLERANCE = 1e-6
MAX_VALUE_CHARS = 200
_ELLIPSIS = "…"
# Paths listed per cid in a correlation_conflict value; step URLs can repeat a cid hundreds
# of times, and the cids themselves must stay within the shortened text.
_MAX_PATHS_PER_CID = 2


@dataclass(frozen=True, slots=True)
class Finding:
    """One disagreement between the trajectory side and the trace side of a rollout."""

    kind: DriftKind
    message: str
    trajectory_index: int | None = None
    step_index: int | None = None  # index within trajectory `trajectory_index`
    position: int | None = None  # index in the aligned sequence (all trajectories' steps)
    expected: str | None = None  # trajectory / envelope side, shortened
    actual: str | None = None  # trace side (or the other cids), shortened

    def as_dict(self) -> dict[str, Any]:
        """Return the finding as a plain dict (for storage or JSON)."""
        return {
            "kind": self.kind,
            "trajectory_index": self.trajectory_index,
            "step_index": self.step_index,
            "position": self.position,
            "expected": self.expected,
            "actual": self.actual,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """The result of comparing one rollout: comparability and findings."""

    run_id: str | None
    comparable: bool
    reason: NotComparableReason | None
    findings: list[Finding] = field(default_factory=list)
    trajectory_steps: int = 0
    environment_events: int = 0
    version: int = COMPARATOR_VERSION

    @property
    def kinds(self) -> set[str]:
        """The distinct finding kinds."""
        return {f.kind for f in self.findings}


def summarize(findings: Iterable[Finding]) -> dict[str, int]:
    """Count findings per kind, in DRIFT_KINDS order, omitting kinds with none."""
    counts = Counter(f.kind for f in findings)
    return {kind: counts[kind] for kind in DRIFT_KINDS if counts[kind]}


def shorten(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """Render a value as compact JSON text cut to `limit` characters with an ellipsis."""
    try:
        text = orjson.dumps(value, default=_json_default).decode()
    except TypeError:  # e.g. an int beyond 64 bits; repr is still readable
        text = repr(value)
    return _cut(text, limit)


def _cut(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def _json_default(value: object) -> object:
    # orjson serializes only dict/list subclasses; documents may arrive as other Mappings.
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return repr(value)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class _Slot:
    """A trajectory step and where it stands."""

    trajectory_index: int
    step_index: int
    step: Any


@dataclass(slots=True)
class _TraceSide:
    """The trace's environment events, each once, with their time step's tool calls."""

    steps: list[EnvStep] = field(default_factory=list)
    events: list[Mapping[str, Any]] = field(default_factory=list)

    def tool_calls(self, i: int) -> list[Any] | None:
        return self.steps[i].tool_calls


def _read_trace(trace: Mapping[str, Any]) -> _TraceSide:
    steps = view_trace(trace).environment_steps()
    return _TraceSide(steps, [s.event for s in steps])


def _trajectory_slots(doc: Mapping[str, Any]) -> list[_Slot]:
    slots: list[_Slot] = []
    for i, trajectory in enumerate(_list(doc.get("trajectories"))):
        slots.extend(_Slot(i, j, step) for j, step in enumerate(_list(_get(trajectory, "steps"))))
    return slots


def _number(value: object) -> float | None:
    # SPEC §6 writes float(x or 0); None when the value cannot be read as a number.
    try:
        return float(value or 0)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _same_number(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return False
    # a == b covers equal infinities; NaN never compares equal (ingest refuses NaN tokens).
    return a == b or abs(a - b) <= tolerance


def same_json(a: object, b: object) -> bool:
    """Whether two parsed JSON values are equal as JSON: a boolean equals only a boolean."""
    if a != b:  # the usual answer when they differ, at C speed
        return False
    # `==` holds, but it also holds for true == 1 and 1.0 == true (a bool is an int in
    # Python): confirm. The same JSON text is the same value, which settles the common
    # case (both sides written from one dict) without a walk in Python.
    if a is b:
        return True
    try:
        if orjson.dumps(a) == orjson.dumps(b):
            return True
        # Keys sorted: the same object written in another key order (equal by `==`)
        # takes no walk (~40x slower on a large observation).
        if orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            b, option=orjson.OPT_SORT_KEYS
        ):
            return True
    except TypeError:  # an int past 64 bits, nesting orjson does not write: walk it
        pass
    return _same_json_walk(a, b)


def _same_json_walk(a: object, b: object) -> bool:
    # Called once `a == b` holds, so only where a boolean meets a number can they differ;
    # still a full comparison, iterative (documents nest up to 1,024 levels).
    stack: list[tuple[object, object]] = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, bool) or isinstance(y, bool):
            if type(x) is not type(y) or x != y:
                return False
        elif isinstance(x, Mapping):
            if not isinstance(y, Mapping) or x.keys() != y.keys():
                return False
            stack.extend((value, y[key]) for key, value in x.items())
        elif isinstance(x, list | tuple):
            if not isinstance(y, list | tuple) or len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def _where(slot: _Slot) -> str:
    return f"trajectory {slot.trajectory_index} step {slot.step_index}"


def _compare_step(side: _TraceSide, position: int, slot: _Slot) -> list[Finding]:
    step = slot.step
    event = side.events[position]
    out: list[Finding] = []

    def add(kind: DriftKind, what: str, expected: object, actual: object) -> None:
        out.append(
            Finding(
                kind=kind,
                message=f"{what} at {_where(slot)} (position {position})",
                trajectory_index=slot.trajectory_index,
                step_index=slot.step_index,
                position=position,
                expected=shorten(expected),
                actual=shorten(actual),
            )
        )

    step_reward, event_reward = _get(step, "reward"), event.get("reward")
    if not _same_number(_number(step_reward), _number(event_reward), REWARD_TOLERANCE):
        add("reward_mismatch", "reward differs", step_reward, event_reward)
    if bool(_get(step, "done")) != bool(event.get("terminated")):
        add(
            "done_mismatch",
            "done differs from terminated",
            _get(step, "done"),
            event.get("terminated"),
        )
    if bool(_get(step, "truncated")) != bool(event.get("truncated")):
        add(
            "truncated_mismatch",
            "truncated differs",
            _get(step, "truncated"),
            event.get("truncated"),
        )
    # What the policy saw: system_state_before, else the time step's observation message.
    seen = side.steps[position].observation()
    if seen is not None and not same_json(_get(step, "obs"), seen):
        what = (
            "obs differs from system_state_before"
            if event.get("system_state_before") is not None
            else "obs differs from the observation message"
        )
        add("obs_mismatch", what, _get(step, "obs"), seen)
    trace_calls = side.tool_calls(position)
    if trace_calls is not None:
        expected = normalize_tool_calls(_get(step, "tool_calls"))
        actual = normalize_tool_calls(trace_calls)
        if not same_json(expected, actual):
            add("tool_calls_mismatch", "tool calls differ", expected, actual)
    return out


def _step_count_finding(slots: Sequence[_Slot], side: _TraceSide) -> Finding:
    common = min(len(slots), len(side.events))
    extra = slots[common] if common < len(slots) else None
    where = "trajectory steps" if extra is not None else "environment events"
    return Finding(
        kind="step_count_mismatch",
        message=(
            f"{len(slots)} trajectory steps vs {len(side.events)} environment events;"
            f" {where} from position {common} have no partner"
        ),
        trajectory_index=extra.trajectory_index if extra is not None else None,
        step_index=extra.step_index if extra is not None else None,
        position=common,
        expected=shorten(len(slots)),
        actual=shorten(len(side.events)),
    )


def _return_finding(doc: Mapping[str, Any], side: _TraceSide) -> Finding | None:
    returns = _get(doc.get("metrics"), "episode_returns")
    if not isinstance(returns, list):
        return None
    parts = [_number(r) for r in returns]
    expected = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    rewards = [_number(e.get("reward")) for e in side.events]
    actual = None if any(r is None for r in rewards) else sum(r for r in rewards if r is not None)
    if _same_number(expected, actual, RETURN_TOLERANCE):
        return None
    return Finding(
        kind="return_mismatch",
        message="sum(metrics.episode_returns) differs from the sum of environment-event rewards",
        expected=shorten(expected if expected is not None else returns),
        actual=shorten(actual if actual is not None else [e.get("reward") for e in side.events]),
    )


def _correlation_finding(
    doc: Mapping[str, Any], resolution: Resolution | None = None
) -> Finding | None:
    resolution = resolve_correlation(doc) if resolution is None else resolution
    if not resolution.conflict:
        return None
    paths: dict[str, list[str]] = {}
    for location in resolution.locations:
        paths.setdefault(location.cid, []).append(location.path)

    def describe(cids: Iterable[str]) -> str:
        parts = []
        for cid in cids:
            shown = ", ".join(paths[cid][:_MAX_PATHS_PER_CID])
            more = len(paths[cid]) - _MAX_PATHS_PER_CID
            parts.append(f"{cid} @ {shown}" + (f" (+{more} more)" if more > 0 else ""))
        return _cut("; ".join(parts))

    canonical = resolution.correlation_id or resolution.distinct_cids[0]
    others = [cid for cid in resolution.distinct_cids if cid != canonical]
    return Finding(
        kind="correlation_conflict",
        message=(
            f"{len(resolution.distinct_cids)} distinct correlation ids: canonical {canonical!r}"
            f" ({resolution.source}) vs {', '.join(repr(c) for c in others)}"
        ),
        expected=describe([canonical]),
        actual=describe(others),
    )


def _not_comparable_reason(
    trace: object, slots: Sequence[_Slot], side: _TraceSide | None
) -> NotComparableReason | None:
    kind = classify_trace(trace)
    if kind is None:
        return "no_trace"
    if kind not in ("full", "wrapped"):
        return _KIND_REASONS.get(kind, "unknown_trace")
    if not slots:
        return "no_trajectories"
    if side is None or not side.events:
        return "no_environment_events"
    return None


def compare_rollout(doc: Mapping[str, Any], resolution: Resolution | None = None) -> Comparison:
    """Compare a RolloutResponse's trajectories with its trace (SPEC §6); `resolution` is
    the document's resolve_correlation when the caller has it (ingest does)."""
    run_id = doc.get("run_id")
    trace = doc.get("trace")
    slots = _trajectory_slots(doc)
    side: _TraceSide | None = None
    # Reading the trace is the expensive part; skip it when the run cannot be comparable.
    if slots and isinstance(trace, Mapping) and classify_trace(trace) in ("full", "wrapped"):
        side = _read_trace(trace)
    reason = _not_comparable_reason(trace, slots, side)

    findings: list[Finding] = []
    if reason is None and side is not None:
        if len(slots) != len(side.events):
            findings.append(_step_count_finding(slots, side))
        for position, slot in enumerate(slots[: len(side.events)]):
            findings.extend(_compare_step(side, position, slot))
        returned = _return_finding(doc, side)
        if returned is not None:
            findings.append(returned)
    conflict = _correlation_finding(doc, resolution)
    if conflict is not None:
        findings.append(conflict)
    return Comparison(
        run_id=run_id if isinstance(run_id, str) else None,
        comparable=reason is None,
        reason=reason,
        findings=findings,
        trajectory_steps=len(slots),
        environment_events=len(side.events) if side is not None else 0,
    )
