"""The v3 trace as it arrives (SPEC §3): shape classification, unwrapping, event typing.

Pure functions over parsed JSON; the ingest projection, the converters and the drift
comparison all read traces through this module so they agree on what a trace holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from tracestore.jsontext import member as _get

TraceKind = Literal["full", "wrapped", "summary", "db_row", "empty", "unknown"]
EventType = Literal["runtime", "environment", "lm_call", "plain"]

TRACE_KINDS: tuple[str, ...] = ("full", "wrapped", "summary", "db_row", "empty", "unknown")
EVENT_TYPES: tuple[str, ...] = ("runtime", "environment", "lm_call", "plain")

_FULL_KEYS = ("session_time_steps", "event_history")
_SUMMARY_KEYS = ("events_count", "lm_calls", "decision_rewards")
# Sets: `isdisjoint` tests an event's keys at C speed (prepare infers ~100 types a rollout).
_ENV_KEYS = frozenset(("reward", "terminated", "truncated"))
_LM_KEYS = frozenset(("model_name", "provider", "call_records"))


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
    if not _ENV_KEYS.isdisjoint(event):
        return "environment"
    if not _LM_KEYS.isdisjoint(event):
        return "lm_call"
    return "plain"


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_env(item: object) -> bool:
    # dict first: a plain dict then skips the (several times slower) Mapping ABC check.
    return isinstance(item, dict | Mapping) and infer_event_type(item) == "environment"


def _payload(content: object) -> object:
    # json_payload is a JSON string on the wire; a database read-back may hold the object.
    raw = _get(content, "json_payload")
    if isinstance(raw, str | bytes):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    return raw


# Message types whose content is the step's tool calls as JSON text (a list, or an object
# with `tool_calls`): synth-ai's task apps record `policy_tool_call` (the grpo-crafter app),
# hand-built apps `action`.
TOOL_CALL_MESSAGE_TYPES = frozenset({"policy_tool_call", "action"})
# Message types whose content is the observation the policy saw (hand-built apps).
OBSERVATION_MESSAGE_TYPES = frozenset({"observation"})


def message_value(message: object) -> object:
    """A message's content as a value: its JSON payload, else its text parsed as JSON.

    Text that is not JSON comes back as the text itself; no content gives None.
    """
    content = _get(message, "content")
    if isinstance(content, str):
        text: object = content
    else:
        payload = _payload(content)
        if payload is not None:
            return payload
        text = _get(content, "text")
    if not isinstance(text, str):
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _calls_in_message(message: object) -> list[Any]:
    value = message_value(message)
    if isinstance(value, list):
        return [c for c in value if isinstance(c, Mapping)]
    return _as_list(_get(value, "tool_calls"))


def _message_type(message: object) -> object:
    return _get(message, "message_type")


def time_step_tool_calls(messages: Iterable[Any], events: Iterable[Any]) -> list[Any] | None:
    """Return the raw tool calls of one trace time step (SPEC §5), or None when it has none.

    `messages` and `events` are the time step's items, each once. Sources in order: messages
    with `metadata.is_tool_call` (their `json_payload` -> `tool_calls`), then tool-call
    messages (`policy_tool_call`, `action`: their content is the list), then the LM events'
    `call_records[*].output_tool_calls`, then the environment events' `metadata.tool_calls`;
    the first source that yields a non-empty list wins.
    """
    messages = list(messages)
    events = list(events)
    calls: list[Any] = []
    for message in messages:
        if _get(_get(message, "metadata"), "is_tool_call") is True:
            calls.extend(_as_list(_get(_payload(_get(message, "content")), "tool_calls")))
    if calls:
        return calls
    for message in messages:
        if _message_type(message) in TOOL_CALL_MESSAGE_TYPES:
            calls.extend(_calls_in_message(message))
    if calls:
        return calls
    for event in events:
        if isinstance(event, Mapping) and infer_event_type(event) == "lm_call":
            for record in _as_list(event.get("call_records")):
                calls.extend(_as_list(_get(record, "output_tool_calls")))
    if calls:
        return calls
    for event in events:
        if _is_env(event):
            calls.extend(_as_list(_get(_get(event, "metadata"), "tool_calls")))
    return calls or None


def time_step_observation(messages: Iterable[Any]) -> object:
    """The observation a time step's `observation` message carries, or None."""
    for message in messages:
        if _message_type(message) in OBSERVATION_MESSAGE_TYPES:
            value = message_value(message)
            if value is not None:
                return value
    return None


@dataclass(frozen=True, slots=True)
class EnvStep:
    """One environment event, with the tool calls of its time step (None: none found).

    `messages` and `lm_events` are the other items of its time step, each once.
    """

    event: Mapping[str, Any]
    tool_calls: list[Any] | None
    messages: tuple[Any, ...] = ()
    lm_events: tuple[Mapping[str, Any], ...] = ()

    def observation(self) -> object:
        """What the policy saw: `system_state_before`, else an `observation` message."""
        before = self.event.get("system_state_before")
        if before is not None:
            return before
        return time_step_observation(self.messages)


def _match_key(item: object) -> object:
    # Cheap, hashable pre-filter; equality of the whole object confirms a match. Equal
    # items must get equal keys (`_place_in_order` pairs by equality alone and must agree
    # with the keyed search): values that cannot be hashed (objects, lists) are keyed by
    # an equal-preserving hashable form, not by their repr (`{"a": 1, "b": 2}` and
    # `{"b": 2, "a": 1}` are equal, their reprs are not).
    key: object = (
        _get(_get(item, "metadata"), "step_id"),
        _get(_get(item, "time_record"), "event_time"),
        _get(item, "system_instance_id"),
    )
    try:
        hash(key)
    except TypeError:
        key = _hashable(key)
        try:
            hash(key)
        except TypeError:  # not JSON (a set, an object): equality alone decides
            return _UNHASHABLE
    return key


_UNHASHABLE = object()


def _hashable(value: object) -> object:
    """A hashable form of a JSON value, equal for equal values (objects in any key order)."""
    if isinstance(value, Mapping):
        return frozenset((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


@dataclass(slots=True)
class Placed:
    """One event or message, once, with where it stood in the trace (never changed after
    `place_once`: not frozen, whose __init__ cost three times as much, ~80 a rollout)."""

    item: Any
    step_position: int | None  # index into session_time_steps, when inside a step
    position_in_step: int | None
    history_position: int | None  # index into the top-level history list, when there


def place_once(history: Sequence[Any], per_step: Sequence[Sequence[Any]]) -> list[Placed]:
    """Pair each step's items with their copies in the history list so each is kept once.

    Order: the steps' items in time-step order, then history items found in no step. When
    no step holds items, the history order is the order.
    """
    in_order = _place_in_order(history, per_step)
    return in_order if in_order is not None else _place_by_key(history, per_step)


def _place_by_key(history: Sequence[Any], per_step: Sequence[Sequence[Any]]) -> list[Placed]:
    """`place_once` in general: each step item's copy is the first unused history item
    equal to it, found by a cheap key (equality confirms)."""
    candidates: dict[object, list[int]] = {}
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


def _place_in_order(
    history: Sequence[Any], per_step: Sequence[Sequence[Any]]
) -> list[Placed] | None:
    """`place_once`'s answer when the history lists the steps' items first, in their order
    (as synth-ai's tracer writes it), else None.

    Then each step item's copy is the history item at its own position, the one
    `_place_by_key` finds (the first unused equal item), with no key built: the keys were
    about a third of reading a trace.
    """
    placed: list[Placed] = []
    h = 0
    n = len(history)
    for s, items in enumerate(per_step):
        for p, item in enumerate(items):
            if h >= n or history[h] != item:
                return None
            placed.append(Placed(item, s, p, h))
            h += 1
    placed.extend(Placed(history[k], None, None, k) for k in range(h, n))
    return placed


@dataclass(slots=True)
class TraceView:
    """A full trace read once: time steps, and each event and message placed once."""

    session: Mapping[str, Any]
    wrapper: dict[str, Any] | None
    time_steps: list[Any]
    events: list[Placed] = field(default_factory=list)
    messages: list[Placed] = field(default_factory=list)
    # environment_steps() once per view: ingest's comparison and reproduction check both
    # read it (a view is never changed after it is made).
    _env_steps: list[EnvStep] | None = None

    def environment_events(self) -> Iterator[Mapping[str, Any]]:
        """Environment events, each once, in time-step order."""
        for placed in self.events:
            if _is_env(placed.item):
                yield placed.item

    def environment_steps(self) -> list[EnvStep]:
        """Environment events in order, each with its time step's tool calls (SPEC §5).

        Items group with their time step by placement, else by `metadata.step_id` (a step's
        id, or an unknown id that history-only items share). The converters and the drift
        comparison both read steps here, so a converted trajectory never drifts from the
        trace it came from.
        """
        if self._env_steps is None:
            self._env_steps = self._read_environment_steps()
        return self._env_steps

    def _read_environment_steps(self) -> list[EnvStep]:
        positions: dict[str, int] = {}
        for s, time_step in enumerate(self.time_steps):
            sid = _get(time_step, "step_id")
            if isinstance(sid, str):
                positions.setdefault(sid, s)

        def group_of(item: object, step_position: int | None) -> object:
            if step_position is not None:
                return step_position
            sid = _get(_get(item, "metadata"), "step_id")
            return positions.get(sid, sid) if isinstance(sid, str) else None

        # Each event's type is inferred once: the loops below would otherwise repeat it.
        group_events: dict[object, list[tuple[Any, bool]]] = {}
        env: list[tuple[Mapping[str, Any], object]] = []
        for placed in self.events:
            item = placed.item
            is_env = _is_env(item)
            key = group_of(item, placed.step_position)
            if key is not None:
                group_events.setdefault(key, []).append((item, is_env))
            if is_env:
                env.append((item, key))
        group_messages: dict[object, list[Any]] = {}
        for placed in self.messages:
            key = group_of(placed.item, placed.step_position)
            if key is not None:
                group_messages.setdefault(key, []).append(placed.item)
        out: list[EnvStep] = []
        for event, key in env:
            if key is None:
                out.append(EnvStep(event, time_step_tool_calls((), (event,))))
                continue
            # Another environment event of the same time step must not lend its metadata.
            others = [e for e, e_env in group_events.get(key, ()) if e is event or not e_env]
            messages = tuple(group_messages.get(key, ()))
            calls = time_step_tool_calls(messages, others)
            lm_events = tuple(
                e
                for e in others
                if e is not event and isinstance(e, Mapping) and infer_event_type(e) == "lm_call"
            )
            out.append(EnvStep(event, calls, messages, lm_events))
        return out


_recent = threading.local()


@contextmanager
def reusing_views() -> Iterator[None]:
    """Within this block (one thread), view_trace reuses its last view of the same object.

    Ingest reads one trace three times (projection, drift comparison, reproduction check)
    and changes nothing in between; outside such a block every call reads afresh, so code
    that edits a trace and reads it again never sees a stale view.
    """
    _recent.active = True
    try:
        yield
    finally:
        _recent.active = False
        _recent.entry = None


def view_trace(trace: Mapping[str, Any]) -> TraceView:
    """Read a `full` or `wrapped` trace (other kinds give a view with no steps or events)."""
    if not getattr(_recent, "active", False):
        return _view_trace(trace)
    cached = getattr(_recent, "entry", None)
    if cached is not None and cached[0] is trace:
        view: TraceView = cached[1]
        return view
    view = _view_trace(trace)
    _recent.entry = (trace, view)
    return view


def _view_trace(trace: Mapping[str, Any]) -> TraceView:
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
