"""The v3 trace as it arrives (SPEC §3): shape classification, unwrapping, event typing.

Pure functions over parsed JSON; the ingest projection, the converters and the drift
comparison all read traces through this module so they agree on what a trace holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TraceKind = Literal["full", "wrapped", "summary", "db_row", "empty", "unknown"]
EventType = Literal["runtime", "environment", "lm_call", "plain"]

TRACE_KINDS: tuple[str, ...] = ("full", "wrapped", "summary", "db_row", "empty", "unknown")
EVENT_TYPES: tuple[str, ...] = ("runtime", "environment", "lm_call", "plain")

_FULL_KEYS = ("session_time_steps", "event_history")
_SUMMARY_KEYS = ("events_count", "lm_calls", "decision_rewards")
_ENV_KEYS = ("reward", "terminated", "truncated")
_LM_KEYS = ("model_name", "provider", "call_records")


def classify_trace(trace: object) -> TraceKind | None:
    """Return the SPEC §3 `trace_kind` of a `trace` value (None when it is null/absent)."""
    if trace is None:
        return None
    if not isinstance(trace, Mapping):
        return "unknown"
    if not trace:
        return "empty"
    if "session_trace" in trace and (
        isinstance(trace["session_trace"], Mapping) or trace["session_trace"] is None
    ):
        return "wrapped"
    if any(k in trace for k in _FULL_KEYS):
        return "full"
    if "timesteps" in trace:
        return "db_row"
    if any(k in trace for k in _SUMMARY_KEYS):
        return "summary"
    return "unknown"


def unwrap_trace(trace: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """Split a `wrapped` trace into its inner trace and the wrapper's other keys."""
    inner = trace.get("session_trace")
    wrapper = {k: v for k, v in trace.items() if k != "session_trace"}
    return (inner if isinstance(inner, Mapping) else {}), wrapper


def infer_event_type(event: Mapping[str, Any]) -> str:
    """Infer an event's type from its keys (SPEC §3); an explicit `event_type` wins."""
    explicit = event.get("event_type")
    if isinstance(explicit, str) and explicit:
        return explicit
    if "actions" in event:
        return "runtime"
    if any(k in event for k in _ENV_KEYS):
        return "environment"
    if any(k in event for k in _LM_KEYS):
        return "lm_call"
    return "plain"


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _step_id_of(item: object) -> object:
    if isinstance(item, Mapping):
        meta = item.get("metadata")
        if isinstance(meta, Mapping):
            return meta.get("step_id")
    return None


def _event_time_of(item: object) -> object:
    if isinstance(item, Mapping):
        record = item.get("time_record")
        if isinstance(record, Mapping):
            return record.get("event_time")
    return None


def _match_key(item: object) -> tuple[str, str, str]:
    # Cheap, hashable pre-filter; equality of the whole object confirms a match. repr()
    # keeps unhashable or odd values (lists, floats) usable as part of the key.
    sid = item.get("system_instance_id") if isinstance(item, Mapping) else None
    return (repr(_step_id_of(item)), repr(_event_time_of(item)), repr(sid))


@dataclass(frozen=True, slots=True)
class Placed:
    """One event or message, once, with where it stood in the trace."""

    item: Any
    step_position: int | None  # index into session_time_steps, when inside a step
    position_in_step: int | None
    history_position: int | None  # index into the top-level history list, when there


def place_once(history: Sequence[Any], per_step: Sequence[Sequence[Any]]) -> list[Placed]:
    """Pair each step's items with their copies in the history list so each is kept once.

    Order: the steps' items in time-step order, then history items found in no step. When
    no step holds items, the history order is the order.
    """
    candidates: dict[tuple[str, str, str], list[int]] = {}
    for h, item in enumerate(history):
        candidates.setdefault(_match_key(item), []).append(h)
    used: set[int] = set()
    placed: list[Placed] = []
    for s, items in enumerate(per_step):
        for p, item in enumerate(items):
            match: int | None = None
            for h in candidates.get(_match_key(item), ()):
                if h not in used and history[h] == item:
                    match = h
                    break
            if match is not None:
                used.add(match)
            placed.append(Placed(item, s, p, match))
    placed.extend(Placed(item, None, None, h) for h, item in enumerate(history) if h not in used)
    return placed


@dataclass(slots=True)
class TraceView:
    """A full trace read once: time steps, and each event and message placed once."""

    session: Mapping[str, Any]
    wrapper: dict[str, Any] | None
    time_steps: list[Any]
    events: list[Placed] = field(default_factory=list)
    messages: list[Placed] = field(default_factory=list)

    def environment_events(self) -> Iterator[Mapping[str, Any]]:
        """Environment events, each once, in time-step order."""
        for placed in self.events:
            item = placed.item
            if isinstance(item, Mapping) and infer_event_type(item) == "environment":
                yield item


def view_trace(trace: Mapping[str, Any]) -> TraceView:
    """Read a `full` or `wrapped` trace (other kinds give a view with no steps or events)."""
    wrapper: dict[str, Any] | None = None
    session: Mapping[str, Any] = trace
    if classify_trace(trace) == "wrapped":
        session, wrapper = unwrap_trace(trace)
    steps = _as_list(session.get("session_time_steps"))
    step_events = [_as_list(s.get("events")) if isinstance(s, Mapping) else [] for s in steps]
    step_messages = [
        _as_list(s.get("markov_blanket_messages")) if isinstance(s, Mapping) else [] for s in steps
    ]
    return TraceView(
        session=session,
        wrapper=wrapper,
        time_steps=steps,
        events=place_once(_as_list(session.get("event_history")), step_events),
        messages=place_once(_as_list(session.get("markov_blanket_message_history")), step_messages),
    )
