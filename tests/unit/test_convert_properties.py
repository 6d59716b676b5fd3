"""Property tests for tracestore.convert: the round-trip law over generated trajectories."""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracestore.convert import (
    CARRY_KEY,
    PROVENANCE_KEY,
    canonical_json,
    convert_document,
    source_sha256,
    trace_to_trajectories,
    trajectories_to_trace,
)
from tracestore.drift import compare_rollout
from tracestore.toolcalls import normalize_tool_calls

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------- strategies

# Text that bites: NUL (refused by PostgreSQL), non-BMP, combining marks, JSON-looking.
odd_text = st.sampled_from(
    ["\u0000", "a\u0000b", "é", "e\u0301", "😀", "\u2028", '{"a": 1}', "", " "]
)
text = st.one_of(st.text(max_size=8), odd_text)
keys = st.one_of(st.text(max_size=5), odd_text)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # unbounded: beyond 64 bits orjson refuses them, the carry must not
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
# Hand-picked values, each one draw: generation costs about 0.1 ms a draw, and these
# reach the edges (64-bit limits, -0.0, deep nesting) more often than random draws do.
EDGE_VALUES: list[Any] = [
    2**63 - 1,
    2**64 - 1,
    -(2**63) - 1,
    2**70,
    -0.0,
    5e-324,
    1.7976931348623157e308,
    {"": [1, {"\u0000": "\u0000"}], "é": None},
    {"nested": {"deeper": {"deepest": [1.0, "x", [], {}]}}},
    [[], {}, [[None]]],
    {"text": "step 0: health 9/9. You see grass. Inventory: wood 2."},
]
edge_values = st.sampled_from(EDGE_VALUES)
# Nested JSON, three levels deep at most: st.recursive draws are several times slower, and
# depth adds nothing here (the converters never look inside these values).
json_shallow = st.one_of(
    edge_values, scalars, st.lists(scalars, max_size=2), st.dictionaries(keys, scalars, max_size=2)
)
json_values = st.one_of(
    json_shallow,
    st.lists(json_shallow, max_size=2),
    st.dictionaries(keys, json_shallow, max_size=2),
)
json_objects = st.one_of(
    edge_values.filter(lambda v: isinstance(v, dict)),
    st.dictionaries(keys, json_shallow, max_size=2),
)

arguments = st.one_of(
    json_objects,
    json_objects.map(lambda obj: json.dumps(obj)),  # arguments as a JSON string of one
)
names = st.sampled_from(["interact_many", "submit_answer", "tool"])


@st.composite
def tool_calls(draw: st.DrawFn) -> dict[str, Any]:
    """One tool call in any SPEC §5 dialect, sometimes with meaningless extra keys."""
    name, args = draw(names), draw(arguments)
    dialect = draw(st.integers(0, 4))
    call: dict[str, Any]
    if dialect == 0:
        call = {"tool_name": name, "arguments": args}
    elif dialect == 1:
        call = {"tool": name, "args": args}
    elif dialect == 2:
        call = {"tool": name, "arguments": args, "id": draw(text)}
    elif dialect == 3:
        call = {"name": name, "arguments_json": args if isinstance(args, str) else json.dumps(args)}
    else:
        call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}
    if draw(st.booleans()):
        call["source"] = draw(text)
    return call


rewards = st.one_of(
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
    st.integers(-(10**6), 10**6),
)
# Undeclared step keys producers add; one draw for all of them keeps generation cheap.
step_extras = st.dictionaries(
    st.sampled_from(["logprob", "value", "output"]), json_values, max_size=2
)


@st.composite
def steps(draw: st.DrawFn) -> dict[str, Any]:
    """A legacy step: declared keys (some optional or null) and undeclared ones."""
    step: dict[str, Any] = {"obs": draw(json_objects)}
    if draw(st.integers(0, 4)):  # absent tool_calls key, as older producers send
        step["tool_calls"] = draw(st.lists(tool_calls(), max_size=2))
    step["reward"] = draw(rewards)
    step["done"] = draw(st.booleans())
    if draw(st.integers(0, 4)):
        step["truncated"] = draw(st.one_of(st.none(), st.booleans()))
    if draw(st.integers(0, 4)):
        step["info"] = draw(st.one_of(st.none(), json_objects))
    step.update(draw(step_extras))
    if draw(st.integers(0, 9)) == 0:  # now and then, another key order
        order = draw(st.permutations(list(step)))
        step = {k: step[k] for k in order}
    return step


finals = st.one_of(
    st.none(),
    st.fixed_dictionaries({"observation": json_objects}),
    st.fixed_dictionaries({"observation": st.none()}),
    json_objects,
)
TRAJECTORY_OPTIONAL = {
    "final": finals,
    "length": st.integers(0, 5),
    "inference_url": st.one_of(st.none(), st.just(""), st.just("https://h/v1?cid=trace_x")),
    "decision_samples": st.one_of(st.none(), st.lists(json_objects, max_size=2)),
    "trace_correlation_id": st.one_of(st.none(), text),
    "extra": json_values,
}


@st.composite
def trajectories(draw: st.DrawFn) -> dict[str, Any]:
    """A legacy trajectory, with or without its optional and undeclared keys."""
    traj: dict[str, Any] = {
        "env_id": draw(st.sampled_from(["env-a", "env-b"])),
        "policy_id": draw(st.one_of(st.just("pol"), st.none())),
        "steps": draw(st.lists(steps(), max_size=3)),
    }
    traj.update(draw(st.fixed_dictionaries({}, optional=TRAJECTORY_OPTIONAL)))
    if draw(st.booleans()) and traj["steps"]:
        traj["length"] = len(traj["steps"])  # the usual, reproducible case
    return traj


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A RolloutResponse with 0 to 3 trajectories and no trace."""
    return {
        "run_id": draw(st.text(min_size=1, max_size=8)),
        "trajectories": draw(st.lists(trajectories(), max_size=3)),
        "metrics": {"episode_returns": [0.0], "mean_return": 0.0, "num_steps": 0},
        "trace_correlation_id": None,
        "trace": None,
        "pipeline_metadata": {},
    }


def _text(value: object) -> str:
    # Key order and number types show in the text; stdlib json writes any int.
    return json.dumps(value, ensure_ascii=False)


# ----------------------------------------------------------------------- properties


@SETTINGS
@given(documents())
def test_round_trip_law(doc: dict[str, Any]) -> None:
    trace = trajectories_to_trace(doc)
    back = trace_to_trajectories(trace.data)
    assert back.method == "carry"
    assert back.losses == []
    assert back.data == doc["trajectories"]
    # Key order and number types too: the JSON text is identical.
    assert _text(back.data) == _text(doc["trajectories"])
    assert all(PROVENANCE_KEY not in t for t in back.data)
    # Deterministic, and the provenance hashes the canonical source.
    assert _text(trajectories_to_trace(doc).data) == _text(trace.data)
    assert trace.provenance.source_sha256 == hashlib.sha256(canonical_json(doc)).hexdigest()
    with contextlib.suppress(TypeError):  # an int beyond 64 bits: the stdlib fallback
        assert canonical_json(doc) == orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    # What the API does: convert the document, serialize, parse, convert back.
    with_trace, _ = convert_document(doc, to="trace", replace=True)
    parsed = json.loads(json.dumps(with_trace, ensure_ascii=False))
    again, back_again = convert_document({**parsed, "trajectories": []}, to="trajectories")
    assert back_again.method == "carry"
    assert again["trajectories"] == doc["trajectories"]


def _clamp_ints(value: Any) -> Any:
    # orjson (the wire parser, and the drift comparison's json_payload reader) reads integers
    # beyond 64 bits as floats, so a trace cannot say them to an orjson reader; only the
    # carry keeps them. Documents parsed off the wire never hold them.
    if isinstance(value, dict):
        return {k: _clamp_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clamp_ints(v) for v in value]
    if type(value) is int and not -(2**63) <= value < 2**64:
        return 2**63 - 1
    return value


@settings(SETTINGS, max_examples=100)
@given(documents().map(_clamp_ints))
def test_the_trace_alone_says_what_the_trajectories_said(doc: dict[str, Any]) -> None:
    trace = trajectories_to_trace(doc).data
    # The drift comparison finds nothing step-level between the input and our trace.
    kinds = compare_rollout({**doc, "trace": trace}).kinds
    assert not kinds - {"return_mismatch", "correlation_conflict"}
    # Without the carry, reading it as a producer trace gives the same decisions.
    stripped = {**trace, "metadata": {k: v for k, v in trace["metadata"].items() if k != CARRY_KEY}}
    conv = trace_to_trajectories(stripped)
    all_steps = [s for t in doc["trajectories"] for s in t["steps"]]
    if not all_steps:
        assert conv.data == []
        return
    assert conv.method == "trace"
    (traj,) = conv.data
    assert len(traj["steps"]) == len(all_steps)
    for got, want in zip(traj["steps"], all_steps, strict=True):
        assert got["obs"] == want["obs"]
        assert got["reward"] == float(want["reward"] or 0)
        assert got["done"] is want["done"]
        assert got["truncated"] is bool(want.get("truncated"))
        assert normalize_tool_calls(got["tool_calls"]) == normalize_tool_calls(
            want.get("tool_calls")
        )
    assert "trajectories[0].steps[*].info" in {e.path for e in conv.losses}


# A producer-like trace with arbitrary event and message contents: reading it never raises.
event_values = {
    "reward": st.one_of(rewards, json_values),
    "terminated": json_values,
    "truncated": json_values,
    "system_state_before": json_values,
    "system_state_after": json_values,
    "metadata": st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={"step_id": st.sampled_from(["decision_0", "x"]), "tool_calls": json_values},
        ),
    ),
    "call_records": json_values,
    "actions": json_values,
}
odd_events = st.one_of(json_values, st.fixed_dictionaries({}, optional=event_values))
odd_traces = st.fixed_dictionaries(
    {},
    optional={
        "session_time_steps": st.lists(
            st.one_of(
                json_values,
                st.fixed_dictionaries(
                    {"step_id": st.sampled_from(["decision_0", "x"])},
                    optional={
                        "events": st.lists(odd_events, max_size=3),
                        "markov_blanket_messages": json_values,
                    },
                ),
            ),
            max_size=3,
        ),
        "event_history": st.lists(odd_events, max_size=3),
        "metadata": st.one_of(json_values, st.fixed_dictionaries({CARRY_KEY: json_values})),
    },
).map(lambda t: {**t, "event_history": t.get("event_history", [])})


@settings(SETTINGS, max_examples=100)
@given(odd_traces, st.booleans())
def test_reading_odd_traces_never_raises(trace: dict[str, Any], wrap: bool) -> None:
    source = {"version": 3, "session_trace": trace} if wrap else trace
    conv = trace_to_trajectories(source)
    assert isinstance(conv.data, list)
    if conv.method == "trace":
        assert len(conv.data) == 1
    assert conv.provenance.source_sha256 == source_sha256(source)
