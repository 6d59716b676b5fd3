"""Hand-built rollouts beside the examples (examples/): every tool-call dialect, a trace-only run
whose tool calls come from each SPEC section 5 source (including history-only items),
costs, null and negative rewards, a cid conflict, and a run whose env comes from its trace.
"""

from __future__ import annotations

from typing import Any

import orjson


def _env_event(step_id: str, reward: float | None, **meta: Any) -> dict[str, Any]:
    return {
        "system_instance_id": "env:grid",
        "time_record": {"event_time": 1.0, "message_time": None},
        "reward": reward,
        "terminated": False,
        "truncated": False,
        "metadata": {"step_id": step_id, **meta},
    }


def _lm_event(
    step_id: str,
    calls: list[Any],
    *,
    cost: float | None,
    latency: float | None,
    tokens: tuple[int, int] | None,
    model: str = "gpt-x",
) -> dict[str, Any]:
    return {
        "system_instance_id": "policy:grid",
        "time_record": {"event_time": 2.0, "message_time": None},
        "model_name": model,
        "provider": "openai",
        "input_tokens": tokens[0] if tokens else None,
        "output_tokens": tokens[1] if tokens else None,
        "total_tokens": sum(tokens) if tokens else None,
        "cost_usd": cost,
        "latency_ms": latency,
        "call_records": [{"call_id": f"c-{step_id}", "output_tool_calls": calls}],
        "metadata": {"step_id": step_id},
    }


def legacy_toolbox() -> dict[str, Any]:
    """Legacy-only, two trajectories in two envs, every tool-call dialect, a cid conflict."""
    steps_a = [
        {
            "obs": {"t": 0},
            "tool_calls": [
                {"tool_name": "search", "arguments": {"q": "a"}},
                {"tool": "open", "args": {"id": 1}},
            ],
            "reward": None,
            "done": False,
        },
        {
            "obs": {"t": 1},
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "b"}'},
                }
            ],
            "reward": -0.5,
            "done": False,
            "truncated": None,
        },
        {
            "obs": {"t": 2},
            "tool_calls": [
                {"name": "submit", "arguments_json": "{}"},
                {"tool": "open", "arguments": {}, "id": "x", "source": "policy"},
                {"tool_name": None, "name": "ghost"},
                "not-a-call",
            ],
            "reward": 2.0,
            "done": True,
        },
    ]
    steps_b = [
        {"obs": {"t": 0}, "reward": 0.25, "done": False},
        {"obs": {"t": 1}, "tool_calls": None, "reward": 0.0, "done": True, "truncated": True},
    ]
    return {
        "run_id": "case-legacy-toolbox",
        "trajectories": [
            {"env_id": "toolbox", "policy_id": "pol-tool", "steps": steps_a, "length": 3},
            {
                "env_id": "toolbox-b",
                "policy_id": "pol-b",
                "steps": steps_b,
                "length": 2,
                "trace_correlation_id": "cid-B",
            },
        ],
        "metrics": {"episode_returns": [1.5, 0.25], "mean_return": 0.875, "num_steps": 5},
        "trace": None,
        "pipeline_metadata": {"trace_correlation_id": "cid-A"},
    }


def trace_only_grid() -> dict[str, Any]:
    """Trace-only: tool calls from messages, LM call records, and env metadata."""
    e0 = _env_event("decision_0", 1.0)
    lm0 = _lm_event(
        "decision_0",
        [{"id": "a", "type": "function", "function": {"name": "move", "arguments": "{}"}}],
        cost=0.0012,
        latency=250.5,
        tokens=(10, 5),
    )
    e1 = _env_event("decision_1", None, tool_calls=[{"tool": "look"}])
    e2 = _env_event("decision_2", -1.0)
    lm2 = _lm_event("decision_2", [{"name": "ignored"}], cost=0.0003, latency=None, tokens=(7, 3))
    assistant = {
        "content": {
            "text": None,
            "json_payload": orjson.dumps(
                {"role": "assistant", "tool_calls": [{"tool_name": "craft"}, {"name": "craft"}]}
            ).decode(),
        },
        "message_type": "assistant",
        "time_record": {"event_time": 3.0, "message_time": None},
        "metadata": {"step_id": "decision_2", "is_tool_call": True},
    }
    # Only in the history list: an LM event of decision_1 (its calls beat the environment
    # event's metadata), and an environment event of a step the trace does not have.
    late_lm = _lm_event(
        "decision_1", [{"name": "look2"}], cost=None, latency=120.0, tokens=None, model="gpt-y"
    )
    orphan = _env_event("decision_9", 0.5, tool_calls=[{"tool": "orphan"}, {"tool": "orphan"}])
    steps = [
        {"step_id": "decision_0", "step_index": 0, "events": [lm0, e0]},
        {"step_id": "decision_1", "step_index": 1, "events": [e1]},
        {
            "step_id": "decision_2",
            "step_index": 2,
            "events": [lm2, e2],
            "markov_blanket_messages": [assistant],
        },
    ]
    return {
        "run_id": "case-trace-only-grid",
        "trajectories": [],
        "metrics": {"episode_returns": [0.5], "mean_return": 0.5, "num_steps": 4},
        "trace": {
            "session_id": "case-trace-only-grid",
            "created_at": "2025-11-18T10:00:00Z",
            "session_time_steps": steps,
            "event_history": [lm0, e0, e1, late_lm, lm2, e2, orphan],
            "markov_blanket_message_history": [assistant],
            "metadata": {"env_id": "gridworld", "policy_id": "pol-grid"},
        },
        "trace_correlation_id": "trace_grid_1",
    }


def _message(step_id: str, message_type: str, content: Any, **meta: Any) -> dict[str, Any]:
    return {
        "content": content,
        "message_type": message_type,
        "time_record": {"event_time": 3.0, "message_time": None},
        "metadata": {"step_id": step_id, **meta},
    }


def trace_only_tool_messages() -> dict[str, Any]:
    """Trace-only: tool calls recorded as policy_tool_call and action messages (SPEC
    section 5, source 2), as payloads, as JSON text, as a list or an object, beside the
    other sources they beat or yield to."""

    def payload(value: Any) -> dict[str, Any]:
        return {"text": None, "json_payload": orjson.dumps(value).decode()}

    ptc = [{"tool_name": "ptc", "arguments": {"x": 1}}, "not an object", {"tool": "ptc2"}]
    messages = {
        # A list payload (its objects only) beats the LM event's calls.
        "decision_0": [_message("decision_0", "policy_tool_call", payload(ptc))],
        # An object's tool_calls, in the text (no payload).
        "decision_1": [
            _message("decision_1", "action", {"text": '{"tool_calls": [{"tool": "act"}]}'})
        ],
        # The content a plain string holding a list.
        "decision_2": [_message("decision_2", "action", '[{"name": "str-act"}]')],
        # A null payload and text that is not JSON: nothing; the event's own calls.
        "decision_3": [
            _message("decision_3", "policy_tool_call", {"text": "go", "json_payload": "null"})
        ],
        # An empty is_tool_call list gives nothing: the typed message's calls.
        "decision_4": [
            _message("decision_4", "assistant", payload({"tool_calls": []}), is_tool_call=True),
            _message("decision_4", "policy_tool_call", payload({"tool_calls": [{"tool": "t4"}]})),
        ],
        # An is_tool_call message with calls beats a typed one.
        "decision_5": [
            _message(
                "decision_5",
                "assistant",
                payload({"tool_calls": [{"tool": "first"}]}),
                is_tool_call=True,
            ),
            _message("decision_5", "action", payload([{"tool": "second"}])),
        ],
    }
    steps = []
    events: list[Any] = []
    for i, (step_id, step_messages) in enumerate(messages.items()):
        env = _env_event(step_id, 0.5, tool_calls=[{"tool": "own"}])
        lm = _lm_event(step_id, [{"name": "lm"}], cost=None, latency=None, tokens=None)
        steps.append(
            {
                "step_id": step_id,
                "step_index": i,
                "events": [lm, env],
                "markov_blanket_messages": step_messages,
            }
        )
        events += [lm, env]
    # Only in the history: a policy_tool_call of decision_3 (by its step_id), which beats
    # the LM event there.
    late = _message("decision_3", "policy_tool_call", payload({"tool_calls": [{"tool": "late"}]}))
    history = [m for step_messages in messages.values() for m in step_messages] + [late]
    return {
        "run_id": "case-trace-tool-messages",
        "trajectories": [],
        "metrics": {"episode_returns": [3.0], "mean_return": 3.0, "num_steps": 6},
        "trace": {
            "session_id": "case-trace-tool-messages",
            "created_at": "2025-11-18T12:00:00Z",
            "session_time_steps": steps,
            "event_history": events,
            "markov_blanket_message_history": history,
            "metadata": {"env_id": "toolmessages", "policy_id": "pol-tm"},
        },
    }


def dual_two_envs() -> dict[str, Any]:
    """Dual-serialized, its two trajectories in two envs, a reward drifting in the second's
    (the trace converted from the trajectories, then one reward changed)."""
    from tracestore.convert.to_trace import trajectories_to_trace

    def trajectory(env: str) -> dict[str, Any]:
        steps = [
            {
                "obs": {"i": i},
                "tool_calls": [{"tool_name": "go", "arguments": {}}],
                "reward": 1.0,
                "done": i == 1,
            }
            for i in range(2)
        ]
        return {"env_id": env, "policy_id": "pol-2env", "steps": steps, "length": 2}

    doc: dict[str, Any] = {
        "run_id": "case-dual-two-envs",
        "trajectories": [trajectory("two-env-a"), trajectory("two-env-b")],
        "metrics": {"episode_returns": [2.0, 2.0], "mean_return": 2.0, "num_steps": 4},
    }
    trace = trajectories_to_trace(doc, created_at="2025-11-18T13:00:00+00:00").data
    # The event is the same object in its time step and in the history.
    trace["session_time_steps"][3]["events"][0]["reward"] = 5.0
    doc["trace"] = trace
    return doc


def stepless_trajectory_with_trace() -> dict[str, Any]:
    """A trajectory without a step beside a full trace: both parts sent, yet not
    dual-serialized (nothing of the trajectory to compare)."""
    doc = dual_two_envs()
    doc["run_id"] = "case-stepless-trajectory"
    doc["trajectories"] = [{"env_id": "stepless", "policy_id": "pol-0", "steps": []}]
    return doc


def env_from_trace() -> dict[str, Any]:
    """Trajectory without env_id, summary trace naming the env; no cid at all."""
    return {
        "run_id": "case-env-from-trace",
        "trajectories": [
            {
                "env_id": None,
                "policy_id": None,
                "steps": [
                    {"obs": {"x": 1}, "reward": 0.0, "done": False},
                    {"obs": {"x": 2}, "reward": 1.0, "done": True},
                ],
            }
        ],
        "metrics": {"episode_returns": [1.0], "mean_return": 1.0, "num_steps": 2},
        "trace": {"session_id": "s-1", "metadata": {"env_id": "meta-env"}, "events_count": 2},
    }


def env_from_trace_names() -> dict[str, Any]:
    """Trace-only, its env and policy named as synth-ai's traces name them (no LM call)."""
    step = {"step_id": "decision_0", "step_index": 0, "events": [_env_event("decision_0", 0.25)]}
    return {
        "run_id": "case-env-from-trace-names",
        "trajectories": [],
        "metrics": {"episode_returns": [0.25], "mean_return": 0.25, "num_steps": 1},
        "trace": {
            "session_id": "case-env-from-trace-names",
            "created_at": "2025-11-18T11:00:00Z",
            "session_time_steps": [step],
            "event_history": [],
            "markov_blanket_message_history": [],
            "metadata": {"env_name": "crafter", "policy_name": "crafter-react"},
        },
    }


def env_id_no_id() -> dict[str, Any]:
    """Trace-only, its metadata's env_id a number (no id: the name is not taken in its
    place) and its policy_id null (the name is)."""
    doc = env_from_trace_names()
    doc["run_id"] = doc["trace"]["session_id"] = "case-env-id-no-id"
    doc["trace"]["metadata"] = {
        "env_id": 7,
        "env_name": "crafter",
        "policy_id": None,
        "policy_name": "crafter-react",
    }
    return doc


def all_cases() -> list[bytes]:
    """The hand-built rollouts as raw documents, in ingest order."""
    docs = (
        legacy_toolbox(),
        trace_only_grid(),
        trace_only_tool_messages(),
        dual_two_envs(),
        stepless_trajectory_with_trace(),
        env_from_trace(),
        env_from_trace_names(),
        env_id_no_id(),
    )
    return [orjson.dumps(doc) for doc in docs]
