"""Tests for tracestore.drift.compare (SPEC §6): examples, injections, generated rollouts."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracestore.drift import (
    COMPARATOR_VERSION,
    DRIFT_KINDS,
    MAX_VALUE_CHARS,
    NOT_COMPARABLE_REASONS,
    Comparison,
    Finding,
    compare_rollout,
    shorten,
    summarize,
)
from tracestore.wire.trace import time_step_tool_calls

# --------------------------------------------------------------------------- examples

EXAMPLES_DIR = Path(
    os.environ.get("TRACESTORE_EXAMPLES_DIR", Path(__file__).resolve().parents[2] / "examples")
)
REPEAT_KINDS = ("retry", "conflict")


def _load_examples() -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    rollouts = EXAMPLES_DIR / "rollouts.jsonl"
    labels = EXAMPLES_DIR / "labels.jsonl"
    if not rollouts.exists() or not labels.exists():
        return []
    docs = [orjson.loads(line) for line in rollouts.read_bytes().splitlines() if line.strip()]
    labs = [json.loads(line) for line in labels.read_text().splitlines() if line.strip()]
    assert len(docs) == len(labs), "rollouts.jsonl and labels.jsonl must align line by line"
    return [(i, d, lab) for i, (d, lab) in enumerate(zip(docs, labs, strict=True))]


EXAMPLES = _load_examples()
needs_examples = pytest.mark.skipif(not EXAMPLES, reason=f"no examples in {EXAMPLES_DIR}")
LABELLED = [
    pytest.param(doc, lab, id=f"line{i}-{lab['kind']}")
    for i, doc, lab in EXAMPLES
    if lab["kind"] not in REPEAT_KINDS and "drift" in lab
]


def _example(kind: str, trace_kind: str | None = "__any__") -> dict[str, Any]:
    for _, doc, lab in EXAMPLES:
        if (
            lab["kind"] == kind
            and lab.get("drift") == []
            and (trace_kind == "__any__" or lab.get("trace_kind") == trace_kind)
        ):
            return copy.deepcopy(doc)
    pytest.skip(f"no clean {kind!r} example")


@needs_examples
def test_examples_are_loaded() -> None:
    # Guards the parametrized test below against silently running on nothing.
    assert len(LABELLED) >= 50
    assert {k for _, _, lab in EXAMPLES for k in lab.get("drift", [])} >= {
        "reward_mismatch",
        "done_mismatch",
        "tool_calls_mismatch",
        "return_mismatch",
        "correlation_conflict",
    }


@needs_examples
@pytest.mark.parametrize(("doc", "label"), LABELLED)
def test_example_finding_kinds_equal_labels(doc: dict[str, Any], label: dict[str, Any]) -> None:
    result = compare_rollout(doc)
    assert {f.kind for f in result.findings} == set(label["drift"])
    assert result.run_id == label["run_id"]
    # Every finding is located where it should be: per-step kinds carry a step, run-level
    # kinds do not.
    for finding in result.findings:
        per_step = finding.kind not in ("return_mismatch", "correlation_conflict")
        assert (finding.position is not None) == per_step


@needs_examples
def test_example_comparability_follows_trace_kind() -> None:
    for _, doc, lab in EXAMPLES:
        if lab["kind"] in REPEAT_KINDS:
            continue
        result = compare_rollout(doc)
        has_steps = any(t["steps"] for t in doc["trajectories"])
        expected = lab["trace_kind"] in ("full", "wrapped") and has_steps
        assert result.comparable is expected, lab["run_id"]
        if result.comparable:
            assert result.trajectory_steps == result.environment_events == lab["n_steps"]


# --------------------------------------------------------------------------- injection

Location = tuple[int | None, int | None, int | None]  # trajectory_index, step_index, position
RUN_LEVEL: Location = (None, None, None)


def _slots(doc: dict[str, Any]) -> list[tuple[int, int]]:
    return [(i, j) for i, t in enumerate(doc["trajectories"]) for j in range(len(t["steps"]))]


def _perturb_calls(calls: Any) -> list[Any]:
    """Change the first call's arguments in its own dialect (or invent a call)."""
    if not isinstance(calls, list) or not calls:
        return [{"tool_name": "injected_tool", "arguments": {}}]
    copied = copy.deepcopy(calls)
    call = copied[0]
    holder, key = call, None
    if isinstance(call.get("function"), dict):
        holder, key = call["function"], "arguments"
    elif call.get("arguments_json") is not None:
        key = "arguments_json"
    elif "arguments" in call:
        key = "arguments"
    else:
        key = "args"
    raw = holder.get(key)
    args = json.loads(raw) if isinstance(raw, str) else raw
    args = {**args, "__injected__": 1} if isinstance(args, dict) else {"__injected__": 1}
    holder[key] = json.dumps(args) if isinstance(raw, str) else args
    return copied


def inject(doc: dict[str, Any], kind: str, position: int) -> Location:
    """Inject one drift kind on the trajectory/envelope side; return where it must be found."""
    slots = _slots(doc)
    i, j = slots[position]
    step = doc["trajectories"][i]["steps"][j]
    here: Location = (i, j, position)
    if kind == "reward_mismatch":
        # The trace and metrics are untouched, so the return still matches: not implied.
        step["reward"] = float(step.get("reward") or 0) + 0.5
        return here
    if kind == "done_mismatch":
        step["done"] = not bool(step.get("done"))
        return here
    if kind == "truncated_mismatch":
        step["truncated"] = not bool(step.get("truncated"))
        return here
    if kind == "obs_mismatch":
        obs = step.get("obs")
        step["obs"] = {**obs, "__injected__": True} if isinstance(obs, dict) else {"x": 1}
        return here
    if kind == "tool_calls_mismatch":
        step["tool_calls"] = _perturb_calls(step.get("tool_calls"))
        return here
    if kind == "step_count_mismatch":
        # Removing (or adding) a trajectory step changes neither the trace nor the metrics,
        # and the common prefix still aligns: only step_count_mismatch is implied.
        if len(slots) >= 2:
            li, lj = slots[-1]
            del doc["trajectories"][li]["steps"][lj]
            return (None, None, len(slots) - 1)  # the trace's last event has no partner
        doc["trajectories"][i]["steps"].append(copy.deepcopy(step))
        return (i, j + 1, 1)
    if kind == "return_mismatch":
        returns = doc["metrics"]["episode_returns"]
        if returns:
            returns[0] = float(returns[0]) + 1.0
        else:
            returns.append(1.0)
        return RUN_LEVEL
    if kind == "correlation_conflict":
        doc["trace_correlation_id"] = "trace_injected_other_cid"
        return RUN_LEVEL
    raise AssertionError(kind)


def _located(result: Comparison, kind: str) -> list[Location]:
    return [
        (f.trajectory_index, f.step_index, f.position) for f in result.findings if f.kind == kind
    ]


# What each single injection on the Crafter example implies, beyond its own kind: nothing.
# (reward on the trajectory side leaves trace and metrics equal; dropping a step leaves the
# prefix aligned and the sums unchanged; the cid change touches no step.)
CRAFTER_CASES = list(DRIFT_KINDS)


@needs_examples
@pytest.mark.parametrize("kind", CRAFTER_CASES)
def test_crafter_single_injection(kind: str) -> None:
    doc = _example("crafter", "full")
    assert compare_rollout(doc).findings == []
    position = len(_slots(doc)) // 2
    where = inject(doc, kind, position)
    result = compare_rollout(doc)
    assert result.comparable
    assert {f.kind for f in result.findings} == {kind}
    assert _located(result, kind) == [where]


# The Sokoban example (wrapped trace, tool calls in the environment event's metadata and in
# `action` messages) has no system_state_before: its observations are `observation`
# messages, which the comparison reads, so an obs change is found there too.
SOKOBAN_IMPLIED: dict[str, set[str]] = {kind: {kind} for kind in DRIFT_KINDS}


@needs_examples
@pytest.mark.parametrize("kind", DRIFT_KINDS)
def test_sokoban_single_injection(kind: str) -> None:
    doc = _example("sokoban", "wrapped")
    assert compare_rollout(doc).findings == []
    where = inject(doc, kind, len(_slots(doc)) - 1)
    result = compare_rollout(doc)
    assert {f.kind for f in result.findings} == SOKOBAN_IMPLIED[kind]
    if SOKOBAN_IMPLIED[kind]:
        assert _located(result, kind) == [where]


@needs_examples
def test_crafter_trace_side_reward_change_implies_return_mismatch() -> None:
    # Changing the event in both copies (step and history) keeps it placed once; the trace's
    # reward sum moves with it, so return_mismatch is implied here.
    doc = _example("crafter", "full")
    trace = doc["trace"]
    k = 1
    step_event = next(e for e in trace["session_time_steps"][k]["events"] if "reward" in e)
    history_event = next(e for e in trace["event_history"] if e == step_event)
    for event in (step_event, history_event):
        event["reward"] = float(event["reward"]) + 2.0
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"reward_mismatch": 1, "return_mismatch": 1}
    assert _located(result, "reward_mismatch") == [(0, k, k)]


@needs_examples
def test_crafter_events_are_counted_once() -> None:
    # Every event is in the history and in its step; counting both would double the events.
    doc = _example("crafter", "full")
    trace = doc["trace"]
    assert len(trace["event_history"]) == sum(len(s["events"]) for s in trace["session_time_steps"])
    result = compare_rollout(doc)
    assert result.environment_events == len(trace["session_time_steps"])


# --------------------------------------------------------------------------- builder

DIALECTS = ("tool_name", "tool_args", "tool_arguments_id", "name_json", "openai")
SOURCES = ("message", "lm", "env", "all", "none")


def render_call(name: str, args: dict[str, Any], dialect: str, as_string: bool) -> dict[str, Any]:
    """One tool call in a SPEC §5 dialect."""
    text = json.dumps(args)
    value: Any = text if as_string else args
    if dialect == "tool_name":
        return {"tool_name": name, "arguments": value}
    if dialect == "tool_args":
        return {"tool": name, "args": value, "source": "groq"}
    if dialect == "tool_arguments_id":
        return {"tool": name, "arguments": value, "id": "call_1"}
    if dialect == "name_json":
        return {"name": name, "arguments_json": text}
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": value}}


def lm_record_call(name: str, args: dict[str, Any], index: int) -> dict[str, Any]:
    """A call as the producer's LLM call record writes it."""
    return {
        "name": name,
        "arguments_json": json.dumps(args),
        "arguments": None,
        "call_id": f"call_{index}",
        "index": index,
        "parent_call_id": None,
        "metadata": {},
    }


@dataclass
class GenStep:
    """One decision, and how each serialization writes it."""

    obs: dict[str, Any]
    reward: float | int | None = 0.0
    done: bool = False
    truncated: bool | None = False
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    omit_tool_calls_key: bool = False  # older producers (only used when calls are empty)
    traj_dialect: str = "tool_name"
    traj_args_str: bool = False
    trace_source: str = "all"
    trace_dialect: str = "tool_name"
    trace_args_str: bool = True
    before: str = "same"  # same | null | absent
    omit_truncated: bool = False  # event without `truncated` when it is false
    runtime_event: bool = False


@dataclass
class GenRollout:
    """A dual-serialized rollout as a producer would build it."""

    trajectories: list[list[GenStep]]
    history: str = "dual"  # dual | steps_only | history_only
    reverse_history: bool = False
    wrapped: bool = False
    step_ids: bool = True
    top_level_cid: bool = False
    cid: str = "trace_0123abcd"


@dataclass
class Built:
    """A built document and the positions where obs / tool calls are comparable."""

    doc: dict[str, Any]
    obs_positions: list[int]
    tool_positions: list[int]


def build_rollout(gen: GenRollout) -> Built:
    """Serialize `gen` twice (trajectories and a full trace), consistently."""
    url = f"https://infer.example/v1/chat/completions?cid={gen.cid}"
    flat = [s for steps in gen.trajectories for s in steps]
    time_steps: list[dict[str, Any]] = []
    obs_positions: list[int] = []
    tool_positions: list[int] = []
    clock = 1_764_000_000.0
    use_step_ids = gen.step_ids or gen.history == "history_only"
    for k, s in enumerate(flat):
        step_id = f"decision_{k}"

        def meta(extra: dict[str, Any] | None = None, _sid: str = step_id) -> dict[str, Any]:
            base: dict[str, Any] = {"turn": 0, "step_id": _sid} if use_step_ids else {}
            return base | (extra or {})

        clock += 1.0
        trace_calls = (
            [render_call(n, a, s.trace_dialect, s.trace_args_str) for n, a in s.calls]
            if s.trace_source != "none"
            else []
        )
        if trace_calls:
            tool_positions.append(k)
        events: list[dict[str, Any]] = []
        if s.runtime_event:
            events.append(
                {
                    "system_instance_id": "runtime",
                    "time_record": {"event_time": clock, "message_time": None},
                    "metadata": meta(),
                    "actions": [k % 4],
                }
            )
        if s.trace_source in ("lm", "all") or k % 2 == 0:
            with_calls = s.trace_source in ("lm", "all")
            events.append(
                {
                    "system_instance_id": "policy:gen",
                    "time_record": {"event_time": clock + 0.1, "message_time": None},
                    "metadata": meta(),
                    "event_metadata": None,
                    "model_name": "m",
                    "provider": "custom",
                    "latency_ms": 10,
                    "call_records": [
                        {
                            "call_id": f"rec-{k}",
                            "output_tool_calls": [
                                lm_record_call(n, a, x) for x, (n, a) in enumerate(s.calls)
                            ]
                            if with_calls
                            else [],
                        }
                    ],
                }
            )
        env_meta = meta({"tool_calls": trace_calls} if s.trace_source in ("env", "all") else {})
        env: dict[str, Any] = {
            "system_instance_id": "environment:gen",
            "time_record": {"event_time": clock + 0.2, "message_time": None},
            "metadata": env_meta,
            "event_metadata": None,
            "reward": float(s.reward or 0),
            "terminated": s.done,
        }
        if not (s.omit_truncated and not s.truncated):
            env["truncated"] = bool(s.truncated)
        if s.before == "same":
            env["system_state_before"] = copy.deepcopy(s.obs)
            obs_positions.append(k)
        elif s.before == "null":
            env["system_state_before"] = None
        env["system_state_after"] = copy.deepcopy(flat[k + 1].obs) if k + 1 < len(flat) else None
        events.append(env)
        assistant: dict[str, Any]
        if s.trace_source in ("message", "all"):
            payload = {"role": "assistant", "tool_calls": trace_calls}
            assistant = {
                "content": {"text": None, "json_payload": json.dumps(payload)},
                "message_type": "assistant",
                "time_record": {"event_time": clock + 0.15, "message_time": None},
                "metadata": meta({"is_tool_call": True}),
            }
        else:
            assistant = {
                "content": {"text": "ok", "json_payload": None},
                "message_type": "assistant",
                "time_record": {"event_time": clock + 0.15, "message_time": None},
                "metadata": meta(),
            }
        user = {
            "content": {"text": None, "json_payload": json.dumps({"role": "user", "k": k})},
            "message_type": "user",
            "time_record": {"event_time": clock, "message_time": None},
            "metadata": meta(),
        }
        time_steps.append(
            {
                "step_id": step_id,
                "step_index": k,
                "timestamp": "2025-11-20T11:59:59Z",
                "turn_number": 0,
                "events": events,
                "markov_blanket_messages": [user, assistant],
                "step_metadata": {},
                "completed_at": None,
            }
        )
    event_history = [copy.deepcopy(e) for ts in time_steps for e in ts["events"]]
    message_history = [copy.deepcopy(m) for ts in time_steps for m in ts["markov_blanket_messages"]]
    if gen.reverse_history and gen.history == "dual":  # only pairing order, not event order
        event_history.reverse()
        message_history.reverse()
    if gen.history == "steps_only":
        event_history, message_history = [], []
    elif gen.history == "history_only":
        for ts in time_steps:
            ts["events"], ts["markov_blanket_messages"] = [], []
    session = {
        "session_id": "run-gen",
        "created_at": "2025-11-20T11:59:59Z",
        "session_time_steps": time_steps,
        "event_history": event_history,
        "markov_blanket_message_history": message_history,
        "metadata": {"run_id": "run-gen"},
        "session_metadata": None,
    }
    trace: dict[str, Any] = (
        {"version": 3, "session_trace": session, "run_id": "run-gen"} if gen.wrapped else session
    )

    trajectories = []
    for steps in gen.trajectories:
        out_steps = []
        for s in steps:
            step: dict[str, Any] = {
                "obs": copy.deepcopy(s.obs),
                "reward": s.reward,
                "done": s.done,
                "truncated": s.truncated,
                "info": {"meta": {"inference_url": url}},
            }
            if s.calls or not s.omit_tool_calls_key:
                step["tool_calls"] = [
                    render_call(n, a, s.traj_dialect, s.traj_args_str) for n, a in s.calls
                ]
            out_steps.append(step)
        trajectories.append(
            {
                "env_id": "env",
                "policy_id": "pol",
                "steps": out_steps,
                "length": len(out_steps),
                "inference_url": url,
                "final": None,
                "trace_correlation_id": gen.cid,
            }
        )
    returns = [sum(float(s.reward or 0) for s in steps) for steps in gen.trajectories]
    doc = {
        "run_id": "run-gen",
        "trajectories": trajectories,
        "branches": {},
        "metrics": {
            "episode_returns": returns,
            "mean_return": sum(returns) / len(returns),
            "num_steps": len(flat),
        },
        "aborted": False,
        "ops_executed": 2 * len(flat),
        "trace_correlation_id": gen.cid if gen.top_level_cid else None,
        "trace": trace,
        "pipeline_metadata": {"inference_url": url, "trace_correlation_id": gen.cid},
    }
    return Built(wire(doc), obs_positions, tool_positions)


def wire(doc: dict[str, Any]) -> dict[str, Any]:
    """Through JSON text and back, as ingest delivers it (no shared objects between sides)."""
    parsed: dict[str, Any] = orjson.loads(orjson.dumps(doc))
    return parsed


def simple_rollout(*steps: GenStep, **options: Any) -> dict[str, Any]:
    """A one-trajectory rollout from explicit steps."""
    return build_rollout(GenRollout([list(steps)], **options)).doc


def obs(k: int) -> dict[str, Any]:
    """A small observation."""
    return {"text": f"step {k}", "inventory": {"wood": k}}


# --------------------------------------------------------------------------- generated

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
_args = st.dictionaries(st.text(max_size=5), _leaf, max_size=3)
_obs = st.dictionaries(
    st.text(min_size=1, max_size=5),
    st.recursive(
        _leaf,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=5,
    ),
    max_size=4,
)


@st.composite
def gen_steps(draw: st.DrawFn) -> GenStep:
    """A random decision in random dialects."""
    calls = draw(
        st.lists(
            st.tuples(st.sampled_from(["interact_many", "move", "craft", "noop"]), _args),
            max_size=2,
        )
    )
    return GenStep(
        obs=draw(_obs),
        reward=draw(st.one_of(st.none(), st.integers(-5, 5), st.floats(-100, 100))),
        done=draw(st.booleans()),
        truncated=draw(st.one_of(st.none(), st.booleans())),
        calls=calls,
        omit_tool_calls_key=draw(st.booleans()),
        traj_dialect=draw(st.sampled_from(DIALECTS)),
        traj_args_str=draw(st.booleans()),
        trace_source=draw(st.sampled_from(SOURCES)),
        trace_dialect=draw(st.sampled_from(DIALECTS)),
        trace_args_str=draw(st.booleans()),
        before=draw(st.sampled_from(["same", "same", "null", "absent"])),
        omit_truncated=draw(st.booleans()),
        runtime_event=draw(st.booleans()),
    )


@st.composite
def gen_rollouts(draw: st.DrawFn) -> GenRollout:
    """A random clean dual-serialized rollout (1 to 3 trajectories, at least one step)."""
    trajectories = draw(st.lists(st.lists(gen_steps(), max_size=4), min_size=1, max_size=3))
    if not any(trajectories):
        trajectories[0].append(draw(gen_steps()))
    return GenRollout(
        trajectories=trajectories,
        history=draw(st.sampled_from(["dual", "dual", "steps_only", "history_only"])),
        reverse_history=draw(st.booleans()),
        wrapped=draw(st.booleans()),
        step_ids=draw(st.booleans()),
        top_level_cid=draw(st.booleans()),
        cid=draw(st.sampled_from(["trace_abc123", "smoke-7f0e", "x"])),
    )


GEN_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@GEN_SETTINGS
@given(gen_rollouts())
def test_generated_clean_rollouts_have_no_findings(gen: GenRollout) -> None:
    built = build_rollout(gen)
    result = compare_rollout(built.doc)
    assert result.comparable, result.reason
    assert result.findings == []
    assert result.trajectory_steps == result.environment_events


@GEN_SETTINGS
@given(gen_rollouts(), st.data())
def test_generated_single_injection_is_found(gen: GenRollout, data: st.DataObject) -> None:
    built = build_rollout(gen)
    n = len(_slots(built.doc))
    applicable: dict[str, list[int]] = {
        "step_count_mismatch": [0],
        "reward_mismatch": list(range(n)),
        "done_mismatch": list(range(n)),
        "truncated_mismatch": list(range(n)),
        "obs_mismatch": built.obs_positions,
        "tool_calls_mismatch": built.tool_positions,
        "return_mismatch": [0],
        "correlation_conflict": [0],
    }
    kind = data.draw(st.sampled_from([k for k in DRIFT_KINDS if applicable[k]]))
    position = data.draw(st.sampled_from(applicable[kind]))
    where = inject(built.doc, kind, position)
    result = compare_rollout(built.doc)
    assert {f.kind for f in result.findings} == {kind}
    assert _located(result, kind) == [where]


# --------------------------------------------------------------------------- tolerances


def _reward_case(traj_reward: float | None, event_reward: float) -> Comparison:
    doc = simple_rollout(GenStep(obs(0), reward=event_reward), GenStep(obs(1), reward=1.0))
    doc["trajectories"][0]["steps"][0]["reward"] = traj_reward
    return compare_rollout(doc)


def test_reward_difference_below_tolerance_is_not_drift() -> None:
    assert _reward_case(0.1 + 1e-12, 0.1).findings == []


def test_reward_difference_of_1e_6_is_drift() -> None:
    result = _reward_case(0.1 + 1e-6, 0.1)
    assert summarize(result.findings) == {"reward_mismatch": 1}
    assert _located(result, "reward_mismatch") == [(0, 0, 0)]


def test_null_step_reward_matches_zero_event_reward() -> None:
    assert _reward_case(None, 0.0).findings == []


def test_null_event_reward_reads_as_zero() -> None:
    doc = simple_rollout(GenStep(obs(0), reward=None))
    doc["trace"]["session_time_steps"][0]["events"][-1]["reward"] = None
    doc["trace"]["event_history"][-1]["reward"] = None
    assert compare_rollout(doc).findings == []


def test_unreadable_step_reward_is_drift() -> None:
    doc = simple_rollout(GenStep(obs(0), reward=0.0))
    doc["trajectories"][0]["steps"][0]["reward"] = "n/a"
    assert summarize(compare_rollout(doc).findings) == {"reward_mismatch": 1}


@pytest.mark.parametrize(("offset", "kinds"), [(1e-7, set()), (1e-5, {"return_mismatch"})])
def test_return_tolerance(offset: float, kinds: set[str]) -> None:
    doc = simple_rollout(GenStep(obs(0), reward=0.25), GenStep(obs(1), reward=0.5))
    doc["metrics"]["episode_returns"] = [0.75 + offset]
    assert {f.kind for f in compare_rollout(doc).findings} == kinds


def test_return_compares_sum_over_episodes_with_all_events() -> None:
    # Two trajectories, two episode returns; the trace sum covers every event, including
    # events beyond the trajectory steps (here the trajectory lost its last step).
    doc = build_rollout(
        GenRollout([[GenStep(obs(0), reward=1.0)], [GenStep(obs(1), reward=2.0)]])
    ).doc
    assert compare_rollout(doc).findings == []
    doc["trajectories"][1]["steps"].clear()
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"step_count_mismatch": 1}
    doc["metrics"]["episode_returns"] = [1.0]
    assert summarize(compare_rollout(doc).findings) == {
        "step_count_mismatch": 1,
        "return_mismatch": 1,
    }


def test_missing_episode_returns_is_not_compared() -> None:
    doc = simple_rollout(GenStep(obs(0), reward=3.0))
    del doc["metrics"]["episode_returns"]
    assert compare_rollout(doc).findings == []


# --------------------------------------------------------------------------- alignment


def test_several_trajectories_are_concatenated() -> None:
    gen = GenRollout(
        [[GenStep(obs(0)), GenStep(obs(1))], [GenStep(obs(2)), GenStep(obs(3), done=True)]]
    )
    doc = build_rollout(gen).doc
    assert compare_rollout(doc).findings == []
    doc["trajectories"][1]["steps"][0]["done"] = True
    result = compare_rollout(doc)
    assert _located(result, "done_mismatch") == [(1, 0, 2)]
    assert result.findings[0].expected == "true"
    assert result.findings[0].actual == "false"


def test_extra_trajectory_step_is_located_on_the_trajectory() -> None:
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)))
    doc["trajectories"][0]["steps"].append({"obs": obs(2), "reward": 0.0, "done": False})
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"step_count_mismatch": 1}
    finding = result.findings[0]
    assert (finding.trajectory_index, finding.step_index, finding.position) == (0, 2, 2)
    assert (finding.expected, finding.actual) == ("3", "2")


def test_other_kinds_compare_only_the_common_prefix() -> None:
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)), GenStep(obs(2)))
    steps = doc["trajectories"][0]["steps"]
    steps[0]["done"] = True
    del steps[2]
    assert summarize(compare_rollout(doc).findings) == {
        "step_count_mismatch": 1,
        "done_mismatch": 1,
    }


def test_event_without_system_state_before_skips_obs() -> None:
    doc = simple_rollout(GenStep(obs(0), before="null"), GenStep(obs(1), before="absent"))
    for step in doc["trajectories"][0]["steps"]:
        step["obs"] = {"different": True}
    assert compare_rollout(doc).findings == []


def test_step_without_trace_tool_calls_skips_tool_calls() -> None:
    doc = simple_rollout(GenStep(obs(0), calls=[("move", {"d": 1})], trace_source="none"))
    assert compare_rollout(doc).findings == []


def test_trajectory_without_calls_vs_trace_with_calls_is_drift() -> None:
    doc = simple_rollout(GenStep(obs(0), calls=[("move", {"d": 1})]))
    del doc["trajectories"][0]["steps"][0]["tool_calls"]  # an older producer omits the key
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"tool_calls_mismatch": 1}
    assert result.findings[0].expected == "[]"


def test_tool_call_dialects_compare_equal() -> None:
    args = {"actions": ["move_up", 3]}
    for traj in DIALECTS:
        for trace in DIALECTS:
            doc = simple_rollout(
                GenStep(
                    obs(0),
                    calls=[("interact_many", args)],
                    traj_dialect=traj,
                    trace_dialect=trace,
                    trace_source="message",
                )
            )
            assert compare_rollout(doc).findings == [], (traj, trace)


def test_tool_call_order_matters() -> None:
    calls = [("a", {"x": 1}), ("b", {"x": 2})]
    doc = simple_rollout(GenStep(obs(0), calls=calls))
    doc["trajectories"][0]["steps"][0]["tool_calls"].reverse()
    assert summarize(compare_rollout(doc).findings) == {"tool_calls_mismatch": 1}


@pytest.mark.parametrize("source", ["message", "lm"])
def test_history_only_items_find_their_time_step_by_step_id(source: str) -> None:
    # Steps hold nothing; the history holds every event and message with metadata.step_id.
    doc = simple_rollout(
        GenStep(obs(0), calls=[("a", {"x": 1})], trace_source=source),
        GenStep(obs(1), calls=[("b", {"x": 2})], trace_source=source),
        history="history_only",
    )
    assert compare_rollout(doc).findings == []
    doc["trajectories"][0]["steps"][1]["tool_calls"] = [{"tool": "b", "args": {"x": 3}}]
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"tool_calls_mismatch": 1}
    assert _located(result, "tool_calls_mismatch") == [(0, 1, 1)]


def test_two_environment_events_in_one_time_step_keep_their_own_tool_calls() -> None:
    # Alignment is per environment event; each event's metadata.tool_calls is its own.
    doc = simple_rollout(
        GenStep(obs(0), calls=[("a", {})], trace_source="env"),
        GenStep(obs(1), calls=[("b", {})], trace_source="env"),
        history="steps_only",
    )
    steps = doc["trace"]["session_time_steps"]
    steps[0]["events"].extend(steps.pop(1)["events"])
    assert compare_rollout(doc).findings == []
    doc["trajectories"][0]["steps"][0]["tool_calls"] = [{"tool": "b", "args": {}}]
    assert _located(compare_rollout(doc), "tool_calls_mismatch") == [(0, 0, 0)]


def test_runtime_and_lm_events_are_not_aligned() -> None:
    doc = simple_rollout(GenStep(obs(0), runtime_event=True), GenStep(obs(1), runtime_event=True))
    result = compare_rollout(doc)
    assert result.environment_events == 2
    assert result.findings == []


# --------------------------------------------------------------------------- time_step_tool_calls


def _msg(payload: object, is_tool_call: object = True) -> dict[str, Any]:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return {"content": {"json_payload": text}, "metadata": {"is_tool_call": is_tool_call}}


def _lm(*lists: list[Any]) -> dict[str, Any]:
    return {"model_name": "m", "call_records": [{"output_tool_calls": calls} for calls in lists]}


def _env(calls: list[Any] | None) -> dict[str, Any]:
    return {"reward": 0.0, "metadata": {} if calls is None else {"tool_calls": calls}}


A, B, C = {"tool": "a", "args": {}}, {"name": "b", "arguments_json": "{}"}, {"tool": "c"}


@pytest.mark.parametrize(
    ("messages", "events", "expected"),
    [
        ([_msg({"tool_calls": [A]})], [_lm([B]), _env([C])], [A]),
        ([_msg({"tool_calls": []})], [_lm([B]), _env([C])], [B]),
        ([_msg({"tool_calls": [A]}, is_tool_call=False)], [_lm([B])], [B]),
        ([_msg("not json")], [_lm([], [B, B])], [B, B]),
        ([_msg({"tool_calls": [A]}), _msg({"tool_calls": [A]})], [], [A, A]),
        ([], [_lm([]), _env([C])], [C]),
        ([], [_lm([]), _env(None)], None),
        (
            [
                {
                    "content": {"json_payload": {"tool_calls": [A]}},
                    "metadata": {"is_tool_call": True},
                }
            ],
            [],
            [A],
        ),
        (["junk", None], [7, {"actions": [1]}], None),
    ],
)
def test_time_step_tool_calls_sources(
    messages: list[Any], events: list[Any], expected: list[Any] | None
) -> None:
    assert time_step_tool_calls(messages, events) == expected


# --------------------------------------------------------------------------- not comparable


def _with_conflict(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc.setdefault("pipeline_metadata", {})["trace_correlation_id"] = "trace_pm"
    doc["trace_correlation_id"] = "trace_top"
    return doc


def _assert_not_comparable(doc: dict[str, Any], reason: str) -> None:
    result = compare_rollout(doc)
    assert (result.comparable, result.reason) == (False, reason)
    assert reason in NOT_COMPARABLE_REASONS
    assert {f.kind for f in result.findings} <= {"correlation_conflict"}
    conflicted = compare_rollout(_with_conflict(doc))
    assert (conflicted.comparable, conflicted.reason) == (False, reason)
    assert summarize(conflicted.findings) == {"correlation_conflict": 1}
    finding = conflicted.findings[0]
    assert finding.expected is not None
    assert finding.actual is not None
    assert finding.expected.startswith("trace_top @ trace_correlation_id")
    assert "trace_pm @ pipeline_metadata.trace_correlation_id" in finding.actual


@needs_examples
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("math", "summary_trace"),
        ("crafter_compact", "summary_trace"),
        ("legacy_only", "no_trace"),
        ("trace_only", "no_trajectories"),
    ],
)
def test_examples_not_comparable(kind: str, reason: str) -> None:
    doc = _example(kind)
    _assert_not_comparable(doc, reason)
    # return_mismatch is a comparison of the two formats: not reported for these runs.
    doc["metrics"]["episode_returns"] = [12345.0]
    assert compare_rollout(doc).findings == []


def _mutate_trace(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)))
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.update(trace=None), "no_trace"),
        (lambda d: d.pop("trace"), "no_trace"),
        (lambda d: d.update(trace={}), "empty_trace"),
        (lambda d: d.update(trace={"timesteps": []}), "db_row_trace"),
        (lambda d: d.update(trace={"events_count": 3, "decision_rewards": [1]}), "summary_trace"),
        (lambda d: d.update(trace="not a trace"), "unknown_trace"),
        (lambda d: d.update(trace={"session_trace": None, "version": 3}), "no_environment_events"),
        (lambda d: d.update(trajectories=[]), "no_trajectories"),
        (lambda d: d["trajectories"][0].update(steps=[]), "no_trajectories"),
        (lambda d: d.update(trajectories=None), "no_trajectories"),
        (
            lambda d: d["trace"].update(
                session_time_steps=[{"events": [{"model_name": "m"}]}], event_history=[]
            ),
            "no_environment_events",
        ),
    ],
)
def test_built_not_comparable(mutate: Callable[[dict[str, Any]], None], reason: str) -> None:
    _assert_not_comparable(_mutate_trace(mutate), reason)


def test_conflict_lists_every_cid_with_locations() -> None:
    doc = simple_rollout(GenStep(obs(0)), cid="trace_a")
    doc["trajectories"][0]["trace_correlation_id"] = "trace_b"
    doc["trajectories"][0]["steps"][0]["info"]["meta"]["inference_url"] = "https://h/?cid=trace_c"
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"correlation_conflict": 1}
    finding = result.findings[0]
    assert finding.expected is not None
    assert finding.actual is not None
    assert finding.expected.startswith("trace_a @ pipeline_metadata.trace_correlation_id")
    assert "trace_b @ trajectories[0].trace_correlation_id" in finding.actual
    assert "trace_c @ trajectories[0].steps[0].info.meta.inference_url" in finding.actual
    assert (finding.trajectory_index, finding.step_index, finding.position) == RUN_LEVEL


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"trajectories": "x", "trace": {"session_time_steps": "x"}},
        {"trajectories": [None, {"steps": [None, 3]}], "trace": {"event_history": [None, 1]}},
        {
            "trajectories": [{"steps": [None]}],
            "metrics": {"episode_returns": [None, "x"]},
            "trace": {"session_time_steps": [None, {"events": [{"reward": "bad"}]}]},
        },
    ],
)
def test_malformed_documents_do_not_raise(doc: dict[str, Any]) -> None:
    result = compare_rollout(doc)
    assert result.version == COMPARATOR_VERSION
    for finding in result.findings:
        assert finding.kind in DRIFT_KINDS


# --------------------------------------------------------------------------- values


def test_long_values_are_shortened() -> None:
    big = {"text": "x" * 5000}
    doc = simple_rollout(GenStep(big))
    doc["trajectories"][0]["steps"][0]["obs"] = {"text": "y" * 5000}
    finding = compare_rollout(doc).findings[0]
    assert finding.kind == "obs_mismatch"
    for value in (finding.expected, finding.actual):
        assert value is not None
        assert len(value) == MAX_VALUE_CHARS
        assert value.endswith("…")
    assert shorten({"a": 1}) == '{"a":1}'
    assert shorten("z" * 10, limit=5) == '"zzz…'  # JSON text: the quote counts


def test_summarize_and_as_dict() -> None:
    findings = [
        Finding("return_mismatch", "m"),
        Finding("reward_mismatch", "m", 0, 1, 1, "1.0", "2.0"),
        Finding("reward_mismatch", "m", 0, 2, 2, "1.0", "2.0"),
    ]
    assert summarize(findings) == {"reward_mismatch": 2, "return_mismatch": 1}
    assert list(summarize(findings)) == ["reward_mismatch", "return_mismatch"]
    assert findings[1].as_dict() == {
        "kind": "reward_mismatch",
        "trajectory_index": 0,
        "step_index": 1,
        "position": 1,
        "expected": "1.0",
        "actual": "2.0",
        "message": "m",
    }


# --------------------------------------------------------------------------- JSON values
#
# obs and tool-call arguments are compared as JSON values: Python's `True == 1` and
# `1.0 == True` must not hide a boolean that the other side wrote as a number (QA session
# 18, finding 3), while numbers still compare by value and key order does not matter.


def set_state(doc: dict[str, Any], position: int, state: object) -> None:
    """Give the environment event at `position` this system_state_before, in both lists."""
    step_id = f"decision_{position}"
    trace = doc["trace"]
    for events in [ts["events"] for ts in trace["session_time_steps"]] + [trace["event_history"]]:
        for event in events:
            if "system_state_before" in event and event["metadata"].get("step_id") == step_id:
                event["system_state_before"] = state


def test_boolean_obs_against_number_state_is_obs_mismatch() -> None:
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)), GenStep(obs(2)))
    doc["trajectories"][0]["steps"][1]["obs"] = {"door_open": True, "hp": 1}
    set_state(doc, 1, {"door_open": 1, "hp": True})
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"obs_mismatch": 1}
    assert _located(result, "obs_mismatch") == [(0, 1, 1)]
    finding = result.findings[0]
    assert (finding.expected, finding.actual) == (
        '{"door_open":true,"hp":1}',
        '{"door_open":1,"hp":true}',
    )


def test_float_true_against_one_in_a_nested_list_is_obs_mismatch() -> None:
    # 1.0 == True in Python too; and the difference sits deep in a list of lists.
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)))
    doc["trajectories"][0]["steps"][0]["obs"] = {"grid": [[0, 1.0], [2, 3]]}
    set_state(doc, 0, {"grid": [[0, True], [2, 3]]})
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"obs_mismatch": 1}
    assert _located(result, "obs_mismatch") == [(0, 0, 0)]


def test_only_booleans_against_numbers_count_not_key_order_or_int_against_float() -> None:
    # Step 0: same JSON value (other key order, 1 against 1.0, booleans on both sides);
    # step 1: true against 1. Only step 1 drifts.
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)))
    steps = doc["trajectories"][0]["steps"]
    steps[0]["obs"] = {"a": 1, "b": [1.0, True, {"c": False}]}
    set_state(doc, 0, {"b": [1, True, {"c": False}], "a": 1.0})
    steps[1]["obs"] = {"lit": True}
    set_state(doc, 1, {"lit": 1})
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"obs_mismatch": 1}
    assert _located(result, "obs_mismatch") == [(0, 1, 1)]


def test_boolean_against_number_is_found_past_what_orjson_writes() -> None:
    # An integer past 64 bits and nesting deeper than 254 levels: orjson cannot write
    # either, so the comparison walks the values itself.
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1)))
    steps = doc["trajectories"][0]["steps"]
    steps[0]["obs"] = {"seed": 2**70, "flag": True}
    set_state(doc, 0, {"seed": 2**70, "flag": 1})

    def deep(leaf: object) -> object:
        value: object = leaf
        for _ in range(300):
            value = [value]
        return value

    steps[1]["obs"] = {"deep": deep(False)}
    set_state(doc, 1, {"deep": deep(0)})
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"obs_mismatch": 2}
    assert _located(result, "obs_mismatch") == [(0, 0, 0), (0, 1, 1)]


def test_boolean_argument_against_number_is_tool_calls_mismatch() -> None:
    # The trace writes the arguments as JSON text holding `true`; the trajectory's own
    # JSON text (another dialect) says 1.
    doc = simple_rollout(
        GenStep(obs(0), calls=[("a", {"x": 1})], trace_source="message"),
        GenStep(obs(1), calls=[("a", {"x": 2, "confirm": True})], trace_source="message"),
    )
    doc["trajectories"][0]["steps"][1]["tool_calls"] = [
        {"name": "a", "arguments_json": '{"x": 2.0, "confirm": 1}'}
    ]
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"tool_calls_mismatch": 1}
    assert _located(result, "tool_calls_mismatch") == [(0, 1, 1)]


def test_terminated_as_one_is_still_done_while_obs_true_against_one_drifts() -> None:
    # synth-ai's read-back writes `terminated` as 0/1 (SPEC §3): that tolerance stays;
    # the same boolean-as-number in the observation is drift.
    doc = simple_rollout(GenStep(obs(0)), GenStep(obs(1), done=True))
    trace = doc["trace"]
    for event in [e for ts in trace["session_time_steps"] for e in ts["events"]] + trace[
        "event_history"
    ]:
        if "terminated" in event:
            event["terminated"] = 1 if event["terminated"] else 0
    doc["trajectories"][0]["steps"][1]["obs"] = {"done_flag": True}
    set_state(doc, 1, {"done_flag": 1})
    result = compare_rollout(doc)
    assert summarize(result.findings) == {"obs_mismatch": 1}
