"""Legacy trajectories → a full-shape v3 trace (SPEC §3, §5), losslessly.

`trajectories_to_trace(doc)` reads a RolloutResponse's `trajectories` and writes a
`SessionTrace` shaped like a multi-step producer's (the Crafter app's):

- `session_id` = `metadata.run_id` = `run_id`; `metadata.env_id` / `policy_id` from the first
  trajectory; `created_at` is the document's existing trace's `created_at` when it parses as
  a datetime (original text kept), else null: never the clock, so output is deterministic.
- Several trajectories: their steps are concatenated in order into one sequence of time
  steps `decision_0`, `decision_1`, ... (`step_index` = position in that sequence,
  `turn_number` and `metadata.turn` = index within the trajectory). Each event's carry records
  `trajectory` and `step`; the trace-level carry records each trajectory's `n_steps`, so
  trajectories with no steps survive too.
- One environment event per step: `reward` (null → 0.0), `terminated` = bool(done),
  `truncated` (null → false), `system_state_before` = obs, `system_state_after` = the next
  step's obs within the same trajectory, or `final.observation` (else null) for its last step.
- The step's tool calls (when the step has a `tool_calls` list) as one assistant message,
  `metadata.is_tool_call` = true, `content.json_payload` = the JSON string
  `{"role": "assistant", "tool_calls": [...]}` with the calls exactly as sent (dialect kept).
- Each event and message is the same object in its time step and in `event_history` /
  `markov_blanket_message_history`, linked by `metadata.step_id`, as producers write them.
- Everything the trace has no place for goes in the `tracestore_legacy` carry (see
  `tracestore.convert.carry`); provenance goes in `metadata["tracestore_provenance"]`.

The output shares unchanged sub-objects (obs, info, tool calls, ...) with the input instead
of copying them: treat both as read-only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from tracestore.convert.carry import (
    CARRY_FORMAT,
    STEP_KEYS,
    TRAJECTORY_KEYS,
    derived_final,
    key_shape,
    make_entry,
    same,
)
from tracestore.convert.report import (
    CARRY_KEY,
    CONVERTER_VERSION,
    PROVENANCE_KEY,
    Conversion,
    LossCollector,
    Provenance,
    source_sha256,
)
from tracestore.wire.datetimes import parse_datetime
from tracestore.wire.trace import classify_trace, unwrap_trace

CONVERTER_NAME = "trajectories_to_trace"


def _payload(calls: list[Any]) -> tuple[str, bool]:
    # Returns the json_payload text and whether reading it back gives `calls` exactly. orjson
    # refuses integers beyond 64 bits; the stdlib writes them, but a reader parsing with
    # orjson would get floats, so such calls are also kept verbatim in the carry.
    body = {"role": "assistant", "tool_calls": calls}
    try:
        return orjson.dumps(body).decode(), True
    except TypeError:
        return json.dumps(body, ensure_ascii=False, default=repr), False


def _reward(value: object) -> tuple[float, str | None]:
    # Returns the trace reward and, when it is a default, why.
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value), None
        except OverflowError:
            return 0.0, "integer too large for a float: written as 0.0"
    if value is None:
        return 0.0, "null reward written as 0.0"
    return 0.0, "non-numeric reward written as 0.0"


def _not_bool(step: Mapping[str, Any], key: str) -> str:
    if key not in step:
        return "absent"
    return "null" if step[key] is None else "not a bool"


def _created_at(doc: Mapping[str, Any]) -> object:
    # The only creation time a legacy document can hold is its existing trace's.
    trace = doc.get("trace")
    if not isinstance(trace, Mapping):
        return None
    if classify_trace(trace) == "wrapped":
        trace = unwrap_trace(trace)[0]
    value = trace.get("created_at")
    return value if parse_datetime(value) is not None else None


class _Builder:
    """Accumulates the trace's time steps and history lists."""

    __slots__ = ("events", "losses", "messages", "time_steps")

    def __init__(self, losses: LossCollector) -> None:
        self.time_steps: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.losses = losses

    def step(self, t: int, j: int, step: object, after: object, instance: str) -> None:
        """Append the time step, environment event and tool-call message of one step."""
        i = len(self.time_steps)
        sid = f"decision_{i}"
        carry: dict[str, Any] = {"trajectory": t, "step": j}
        if isinstance(step, Mapping):
            obs = step.get("obs")
            reward, why = _reward(step.get("reward"))
            if why is not None:
                self.losses.add_step(t, j, "reward", "default", why)
            done = step.get("done")
            if type(done) is not bool:
                why = _not_bool(step, "done")
                self.losses.add_step(t, j, "done", "default", f"{why}: terminated = bool(done)")
            truncated = step.get("truncated")
            if type(truncated) is not bool:
                why = _not_bool(step, "truncated")
                self.losses.add_step(t, j, "truncated", "default", f"{why}: bool(truncated)")
            fields: dict[str, Any] = {}
            payload: str | None = None
            for key, value in step.items():
                if key == "obs":
                    continue
                if key == "reward":
                    if type(value) is not float:
                        fields[key] = value
                elif key in ("done", "truncated"):
                    if type(value) is not bool:
                        fields[key] = value
                elif key == "tool_calls" and isinstance(value, list):
                    payload, exact = _payload(value)
                    if not exact:
                        fields[key] = value
                else:  # info, a non-list tool_calls, undeclared keys: the trace has no place
                    fields[key] = value
            absent, order = key_shape(step, STEP_KEYS)
            make_entry(carry, fields, absent, order)
            terminated, truncated_flag = bool(done), bool(truncated)
        else:
            # Not an object: keep it whole; the event holds neutral values.
            carry["raw"] = step
            self.losses.add(f"trajectories[{t}].steps[{j}]", "default", "not an object: kept whole")
            obs, reward, terminated, truncated_flag, payload = None, 0.0, False, False, None
        event: dict[str, Any] = {
            "system_instance_id": instance,
            "time_record": {"event_time": None, "message_time": None},
            "metadata": {"turn": j, "step_id": sid, CARRY_KEY: carry},
            "event_metadata": None,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated_flag,
            "system_state_before": obs,
            "system_state_after": after,
        }
        step_messages: list[dict[str, Any]] = []
        if payload is not None:
            message = {
                "content": {"text": None, "json_payload": payload},
                "message_type": "assistant",
                "time_record": {"event_time": None, "message_time": None},
                "metadata": {"turn": j, "is_tool_call": True, "step_id": sid},
            }
            step_messages.append(message)
            self.messages.append(message)
        self.events.append(event)
        self.time_steps.append(
            {
                "step_id": sid,
                "step_index": i,
                "timestamp": None,
                "turn_number": j,
                "events": [event],
                "markov_blanket_messages": step_messages,
                "step_metadata": {},
                "completed_at": None,
            }
        )


def _trajectory_entry(
    traj: Mapping[str, Any], n: int, last_after: object, env_id: object, policy_id: object
) -> dict[str, Any]:
    # The trajectory header's carry: what the trace's own values would not reproduce.
    fields: dict[str, Any] = {}
    for key, value in traj.items():
        if key == "steps":
            if not isinstance(value, list):
                fields[key] = value
        elif key == "env_id":
            if not same(value, env_id):
                fields[key] = value
        elif key == "policy_id":
            if not same(value, policy_id):
                fields[key] = value
        elif key == "length":
            if not same(value, n):
                fields[key] = value
        elif key == "final":
            expected = derived_final(last_after)
            if not (value == expected if expected is not None else value is None):
                fields[key] = value
        else:  # inference_url, decision_samples and undeclared keys: no place in a trace
            fields[key] = value
    absent, order = key_shape(traj, TRAJECTORY_KEYS)
    return make_entry({"n_steps": n}, fields, absent, order)


def trajectories_to_trace(doc: Mapping[str, Any]) -> Conversion[dict[str, Any]]:
    """Convert a RolloutResponse's legacy trajectories to a full v3 trace (lossless)."""
    provenance = Provenance(CONVERTER_NAME, CONVERTER_VERSION, source_sha256(doc))
    losses = LossCollector()
    trajectories = doc.get("trajectories")
    if not isinstance(trajectories, list):
        losses.add("trajectories", "lost", "not a list: no steps to convert")
        trajectories = []
    first = trajectories[0] if trajectories and isinstance(trajectories[0], Mapping) else {}
    env_id, policy_id = first.get("env_id"), first.get("policy_id")

    builder = _Builder(losses)
    entries: list[dict[str, Any]] = []
    counts: dict[int, int] = {}
    for t, traj in enumerate(trajectories):
        if not isinstance(traj, Mapping):
            entries.append({"n_steps": 0, "raw": traj})
            losses.add(f"trajectories[{t}]", "default", "not an object: kept whole")
            continue
        steps = traj.get("steps")
        step_list: list[Any] = steps if isinstance(steps, list) else []
        final = traj.get("final")
        final_obs = final.get("observation") if isinstance(final, Mapping) else None
        traj_env = traj.get("env_id")
        instance = f"environment:{traj_env}" if isinstance(traj_env, str) else "environment"
        n = len(step_list)
        for j, step in enumerate(step_list):
            if j + 1 < n:
                nxt = step_list[j + 1]
                after = nxt.get("obs") if isinstance(nxt, Mapping) else None
            else:
                after = final_obs
            builder.step(t, j, step, after, instance)
        if n and final_obs is None:
            losses.add(
                f"trajectories[{t}].final.observation",
                "default",
                "absent or null: the last step's system_state_after is null",
            )
        counts[t] = n
        entries.append(_trajectory_entry(traj, n, final_obs if n else None, env_id, policy_id))

    created_at = _created_at(doc)
    if created_at is None:
        losses.add("trace.created_at", "default", "no creation time in the document: null")
    run_id = doc.get("run_id")
    trace: dict[str, Any] = {
        "session_id": run_id,
        "created_at": created_at,
        "session_time_steps": builder.time_steps,
        "event_history": builder.events,
        "markov_blanket_message_history": builder.messages,
        "metadata": {
            "run_id": run_id,
            "env_id": env_id,
            "policy_id": policy_id,
            CARRY_KEY: {"format": CARRY_FORMAT, "trajectories": entries},
            PROVENANCE_KEY: provenance.as_dict(),
        },
        "session_metadata": None,
    }
    return Conversion(trace, losses.finish(counts), provenance, "trajectories")
