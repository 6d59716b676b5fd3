"""Hypothesis strategies for RolloutResponses as producers send them (and stranger)."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import strategies as st

# Any Unicode a JSON string can carry, NUL included; no lone surrogates (not UTF-8).
text = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ["", "\x00", "a\x00b", "\\u0000", "é漢字🙂", " ", "datetime.datetime(2025, 1, 1)"]
)
keys = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | text
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(keys, json_values, max_size=4)
# run_id: any Unicode but NUL (refused in ids: they appear in URLs and PostgreSQL text).
run_id_suffix = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
numbers = st.floats(allow_nan=False, allow_infinity=False, width=64) | st.integers(-1000, 1000)


# Names the wire models declare or the readers look up: an "undeclared" extra key must be
# none of them, or it changes what the document means (a stray `reward: []` on a step
# that drew no reward makes the document invalid).
READ_NAMES = frozenset(
    {
        "aborted",
        "actions",
        "branches",
        "call_records",
        "completed_at",
        "content",
        "cost_usd",
        "created_at",
        "decision_samples",
        "done",
        "env_id",
        "event_history",
        "event_metadata",
        "event_time",
        "event_type",
        "events",
        "events_score",
        "final",
        "inference_url",
        "info",
        "input_tokens",
        "json_payload",
        "kind",
        "latency_ms",
        "length",
        "markov_blanket_message_history",
        "markov_blanket_messages",
        "mean_return",
        "message_time",
        "message_type",
        "metadata",
        "metrics",
        "model_name",
        "n_events",
        "n_messages",
        "n_time_steps",
        "num_episodes",
        "num_steps",
        "obs",
        "ops_executed",
        "outcome_score",
        "output_tokens",
        "pipeline_metadata",
        "policy_id",
        "provider",
        "reward",
        "run_id",
        "session_id",
        "session_metadata",
        "session_time_steps",
        "session_trace",
        "span_id",
        "step_id",
        "step_index",
        "step_metadata",
        "steps",
        "system_instance_id",
        "system_state_after",
        "system_state_before",
        "terminated",
        "text",
        "time_record",
        "timestamp",
        "tool_calls",
        "total_tokens",
        "trace",
        "trace_correlation_id",
        "trace_id",
        "trajectories",
        "trajectory_idx",
        "truncated",
        "turn_number",
    }
)


def _with_extra(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    # Undeclared keys must not shadow declared ones (they would change the document's type).
    for key, value in extra.items():
        if key not in READ_NAMES:
            base.setdefault(key, value)
    return base


@st.composite
def steps(draw: st.DrawFn) -> dict[str, Any]:
    step: dict[str, Any] = {"obs": draw(json_objects)}
    if draw(st.booleans()):
        step["tool_calls"] = draw(st.lists(json_objects, max_size=2))
    for key, strategy in (
        ("reward", st.none() | numbers),
        ("done", st.booleans()),
        ("truncated", st.none() | st.booleans()),
        ("info", st.none() | json_objects),
    ):
        if draw(st.booleans()):
            step[key] = draw(strategy)
    return _with_extra(step, draw(json_objects))


@st.composite
def trajectories(draw: st.DrawFn) -> dict[str, Any]:
    traj: dict[str, Any] = {
        "env_id": draw(text),
        "policy_id": draw(text),
        "steps": draw(st.lists(steps(), max_size=3)),
        "length": draw(st.integers(0, 100)),
        "inference_url": draw(
            st.none() | st.just("") | st.builds(lambda c: f"https://h/v1?cid={c}", text)
        ),
    }
    if draw(st.booleans()):
        traj["final"] = draw(st.none() | json_objects)
    if draw(st.booleans()):
        traj["decision_samples"] = draw(st.none() | st.lists(json_objects, max_size=2))
    if draw(st.booleans()):
        traj["trace_correlation_id"] = draw(st.none() | text)
    return _with_extra(traj, draw(json_objects))


@st.composite
def events(draw: st.DrawFn, step_id: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        "system_instance_id": draw(text),
        "time_record": {"event_time": draw(numbers), "message_time": None},
        "metadata": {"step_id": step_id, **draw(json_objects)},
    }
    kind = draw(st.sampled_from(["environment", "lm", "plain"]))
    if kind == "environment":
        event.update(
            reward=draw(numbers),
            terminated=draw(st.booleans()),
            truncated=draw(st.none() | st.booleans()),
            system_state_before=draw(st.none() | json_objects),
        )
    elif kind == "lm":
        event.update(
            model_name=draw(text),
            input_tokens=draw(st.none() | st.integers(0, 10**6)),
            cost_usd=draw(st.none() | numbers),
            call_records=draw(st.lists(json_objects, max_size=2)),
        )
    return _with_extra(event, draw(json_objects))


@st.composite
def full_traces(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 3))
    time_steps: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    for i in range(n):
        step_events = draw(st.lists(events(f"decision_{i}"), max_size=2))
        history.extend(step_events)
        time_steps.append(
            {
                "step_id": f"decision_{i}",
                "step_index": i,
                "timestamp": draw(st.sampled_from(["2025-11-20T11:59:59Z", None, 1763639999.5])),
                "events": step_events,
                "markov_blanket_messages": [
                    {
                        "content": {"text": draw(st.none() | text), "json_payload": None},
                        "message_type": draw(text),
                        "time_record": {"event_time": 1.0, "message_time": None},
                        "metadata": {"step_id": f"decision_{i}"},
                    }
                ],
            }
        )
    trace = {
        "session_id": draw(text),
        "created_at": draw(
            st.sampled_from(
                [
                    None,
                    "2025-11-20 11:59:59+00:00",
                    "datetime.datetime(2025, 11, 20, 11, 59, 59, tzinfo=datetime.timezone.utc)",
                ]
            )
        ),
        "session_time_steps": time_steps,
        "event_history": history,
        "markov_blanket_message_history": [
            m for s in time_steps for m in s["markov_blanket_messages"]
        ],
        "metadata": draw(json_objects),
    }
    if draw(st.booleans()):
        return {"version": 3, "session_trace": trace, **draw(json_objects)}
    return _with_extra(trace, draw(json_objects))


@st.composite
def rollouts(draw: st.DrawFn) -> dict[str, Any]:
    """A RolloutResponse with arbitrary extra keys, Unicode, nulls and nested JSON."""
    doc: dict[str, Any] = {
        "run_id": f"run-{uuid.uuid4().hex}-{draw(run_id_suffix)}",
        "trajectories": draw(st.lists(trajectories(), max_size=2)),
        "metrics": _with_extra(
            {
                "episode_returns": draw(st.lists(numbers, max_size=3)),
                "mean_return": draw(numbers),
                "num_steps": draw(st.integers(0, 10**6)),
            },
            draw(json_objects),
        ),
    }
    optional = {
        "branches": st.dictionaries(keys, st.lists(text, max_size=2), max_size=2),
        "aborted": st.booleans(),
        "ops_executed": st.integers(0, 10**6),
        "trace_correlation_id": st.none() | text,
        "trace": st.none()
        | full_traces()
        | st.just({})
        | st.builds(lambda s: {"session_id": s, "events_count": 1, "lm_calls": []}, text),
        "pipeline_metadata": json_objects,
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            doc[key] = draw(strategy)
    return _with_extra(doc, draw(json_objects))
