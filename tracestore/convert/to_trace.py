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
- An LM call event from the step's `info.meta` (model, token counts, latency, a call record
  of the kept request and raw response). Its typed fields hold only what a trace may
  (a non-number latency or a token count that is no 64-bit integer is null), and its call
  record lists the response's tool calls only when the step made calls: readers take a
  time step's calls from the first source with some (FORMAT §5).
- Each event and message is the same object in its time step and in `event_history` /
  `markov_blanket_message_history`, linked by `metadata.step_id`, as producers write them.
- Everything the trace has no place for goes in the `tracestore_legacy` carry (see
  `tracestore.convert.carry`); provenance goes in `metadata["tracestore_provenance"]`.

The output shares unchanged sub-objects (obs, info, tool calls, ...) with the input instead
of copying them: treat both as read-only.
"""

from __future__ import annotations

import json
from collections import Counter
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
from tracestore.convert.numbers import whole_or_float
from tracestore.convert.report import (
    CARRY_KEY,
    CONVERTER_VERSION,
    PROVENANCE_KEY,
    Conversion,
    LossCollector,
    LossEntry,
    Provenance,
    source_sha256,
)
from tracestore.wire.datetimes import parse_datetime
from tracestore.wire.trace import classify_trace, unwrap_trace

CONVERTER_NAME = "trajectories_to_trace"


def _trace_call(call: object) -> object:
    # In a trace, as on the model's wire, a tool call's `arguments` are JSON text: the
    # producer's own trace writes them with Python's json.dumps, which SFT readers compare
    # as text. Other dialects' keys (`args`) are kept as they are.
    if not isinstance(call, Mapping):
        return call
    out = dict(call)
    if isinstance(out.get("arguments"), dict | list):
        out["arguments"] = json.dumps(out["arguments"])
    function = out.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), dict | list):
        out["function"] = {**function, "arguments": json.dumps(function["arguments"])}
    return out


def _payload(calls: list[Any]) -> tuple[str, bool]:
    # Returns the json_payload text and whether reading it back gives `calls` exactly (else
    # the carry keeps them). orjson refuses integers beyond 64 bits; the stdlib writes them,
    # but a reader parsing with orjson would get floats.
    in_trace = [_trace_call(c) for c in calls]
    body = {"role": "assistant", "tool_calls": in_trace}
    exact = in_trace == calls
    try:
        return orjson.dumps(body).decode(), exact
    except TypeError:
        return json.dumps(body, ensure_ascii=False, default=repr), False


def _reward(value: object) -> tuple[float, str | None]:
    # Returns the trace reward and, when it is a default, why.
    if isinstance(value, float):
        return value, None  # as read (a RoundedFloat stays one, to be reported)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            # An integer no double holds stays whole: the trace says the step's number.
            return whole_or_float(value), None
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
    # The only creation time a legacy document itself can hold is its existing trace's.
    trace = doc.get("trace")
    if not isinstance(trace, Mapping):
        return None
    if classify_trace(trace) == "wrapped":
        trace = unwrap_trace(trace)[0]
    value = trace.get("created_at")
    return value if parse_datetime(value) is not None else None


def _message(
    kind: str, payload: str, j: int, sid: str, *, tool_call: bool = False, stand_in: bool = False
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"turn": j}
    if tool_call:
        metadata["is_tool_call"] = True
    if stand_in:
        # Says which value stands in for a prompt the trajectories did not keep.
        metadata["tracestore_stand_in"] = "obs"
    metadata["step_id"] = sid
    return {
        "content": {"text": None, "json_payload": payload},
        "message_type": kind,
        "time_record": {"event_time": None, "message_time": None},
        "metadata": metadata,
    }


def _prompt_payload(obs: object) -> str:
    # The user message of a chat: the observation's text when it has one (the Crafter
    # producer's `{"text": ...}`), else the observation as JSON text.
    text = obs.get("text") if isinstance(obs, Mapping) else obs
    if not isinstance(text, str):
        text = _json_text(obs)
    return _json_text({"role": "user", "content": text})


def _json_text(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, default=repr)


# Typed trace fields hold 64-bit integers: ingest refuses a token count past them.
_INT64 = 1 << 63


def _int(value: object) -> int | None:
    # A bool is no count (JSON's true is not 1), and ingest refuses it in a typed field.
    return value if type(value) is int and -_INT64 <= value < _INT64 else None


def _number(value: object) -> float | None:
    # As `_int`, for `latency_ms`: a bool is no number; an integer must read as a double.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        float(value)
    except OverflowError:
        return None
    return value


def _text_of(content: object) -> str | None:
    # A chat message's content: text, or a list of parts whose text is joined.
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, Mapping)]
        joined = "".join(t for t in texts if isinstance(t, str))
        return joined or None
    return None


def _chat_messages(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of the model request a step's `info.meta` kept, as role + text."""
    request = meta.get("inference_request")
    messages = request.get("messages") if isinstance(request, Mapping) else None
    out: list[dict[str, Any]] = []
    for message in _as_list(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            continue
        text = _text_of(message.get("content", message.get("text")))
        if text is not None:
            out.append({"role": message["role"], "content": text})
    return out


def _response_message(response: object) -> Mapping[str, Any]:
    choices = response.get("choices") if isinstance(response, Mapping) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, Mapping) else None
    return message if isinstance(message, Mapping) else {}


def _output_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for index, call in enumerate(_as_list(message.get("tool_calls"))):
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            arguments = function.get("arguments")
            calls.append(
                {
                    "name": function.get("name"),
                    "arguments_json": arguments if isinstance(arguments, str) else None,
                    "call_id": call.get("id"),
                    "index": index,
                }
            )
    return calls


def _call_record(
    meta: Mapping[str, Any], request: list[dict[str, Any]], model: object
) -> dict[str, Any] | None:
    """An LLM call record from the request and raw response a step's info kept."""
    raw = meta.get("raw_response")
    response: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if not request and not response:
        return None
    message = _response_message(response)
    usage = response.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    choices = _as_list(response.get("choices"))
    first = choices[0] if choices and isinstance(choices[0], Mapping) else {}
    return {
        "call_id": response.get("id"),
        "api_type": "chat_completions",
        "model_name": model if isinstance(model, str) else None,
        "input_messages": [
            {"role": m["role"], "parts": [{"type": "text", "text": m["content"]}]} for m in request
        ],
        "output_text": _text_of(message.get("content")),
        "output_tool_calls": _output_calls(message),
        "usage": {
            "input_tokens": _int(usage.get("prompt_tokens")),
            "output_tokens": _int(usage.get("completion_tokens")),
            "total_tokens": _int(usage.get("total_tokens")),
        },
        "finish_reason": first.get("finish_reason"),
    }


# The LM event's token counts and the `info.meta.usage` keys they are read from, the first
# present (OpenAI's name, then the trace's own).
_TOKEN_FIELDS = (
    ("input_tokens", ("prompt_tokens", "input_tokens")),
    ("output_tokens", ("completion_tokens", "output_tokens")),
    ("total_tokens", ("total_tokens",)),
)


def _usage_count(usage: Mapping[str, Any], names: tuple[str, ...]) -> object:
    """The first of `names` present in `usage` (its value, null included), else None."""
    for name in names:
        if name in usage:
            return usage[name]
    return None


def _lm_event(
    meta: Mapping[str, Any], request: list[dict[str, Any]], j: int, sid: str, policy: str
) -> dict[str, Any] | None:
    """The LM call a step's `info.meta` describes (usage, timing, model, request), if any."""
    usage = meta.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    latency = meta.get("inference_ms")
    response = meta.get("raw_response")
    model = meta.get("model", meta.get("model_name"))
    if model is None and isinstance(response, Mapping):
        model = response.get("model")
    if not usage and latency is None and model is None and not request:
        return None
    record = _call_record(meta, request, model)
    return {
        "system_instance_id": f"policy:{policy}",
        "time_record": {"event_time": None, "message_time": None},
        "metadata": {"turn": j, "step_id": sid},
        "event_metadata": None,
        "model_name": model if isinstance(model, str) else None,
        "provider": None,
        **{field: _int(_usage_count(usage, names)) for field, names in _TOKEN_FIELDS},
        "cost_usd": None,
        "latency_ms": _number(latency),
        "span_id": None,
        "trace_id": None,
        "call_records": [record] if record is not None else [],
    }


_MISSING_PARTS = {
    "system_prompt": (
        "trace.session_time_steps[*].markov_blanket_messages[system]",
        "no system prompt in the trajectories (a step's info.meta.inference_request has none)",
    ),
    "call_records": (
        "trace.session_time_steps[*].events[lm_call].call_records[*].output_tool_calls",
        "no model request or response in the trajectories (info.meta.inference_request, "
        "raw_response): the LM call events have no call records",
    ),
}


class _Builder:
    """Accumulates the trace's time steps and history lists."""

    __slots__ = ("events", "losses", "messages", "missing", "time_steps")

    def __init__(self, losses: LossCollector) -> None:
        self.time_steps: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.losses = losses
        # Trace parts a producer's trace has that the trajectories cannot give: time steps
        # without them, by part (reported once each, on trace paths).
        self.missing: Counter[str] = Counter()

    def report_missing(self) -> None:
        """Add one `missing` loss entry per trace part some time steps lack."""
        for part, (path, detail) in _MISSING_PARTS.items():
            if self.missing[part]:
                self.losses.entries.append(
                    LossEntry(path, "missing", detail, count=self.missing[part])
                )

    def _prompts(
        self, t: int, j: int, sid: str, request: list[dict[str, Any]], obs: object
    ) -> list[dict[str, Any]]:
        """The step's system and user messages: the model request's, else the observation."""
        # Trace readers (synth-ai's SFT filter) pair each user prompt with the answer after
        # it, so a step without one is invisible to them.
        system = next((m for m in request if m["role"] == "system"), None)
        user = next((m for m in reversed(request) if m["role"] == "user"), None)
        out: list[dict[str, Any]] = []
        if system is not None:
            out.append(_message("system", _json_text(system), j, sid))
        else:
            self.missing["system_prompt"] += 1
        if user is not None:
            out.append(_message("user", _json_text(user), j, sid))
        elif obs is not None:
            out.append(_message("user", _prompt_payload(obs), j, sid, stand_in=True))
            self.losses.add_step(
                t,
                j,
                "obs",
                "stand_in",
                "no prompt text in trajectories: the user message holds the observation",
            )
        return out

    def _unreadable_meta(self, t: int, j: int, meta: Mapping[str, Any]) -> None:
        """Report the `info.meta` values the LM event's typed fields could not take."""
        latency = meta.get("inference_ms")
        if latency is not None and _number(latency) is None:
            self.losses.add_step(
                t, j, "info.meta.inference_ms", "carried", "not a number: latency_ms is null"
            )
        usage = meta.get("usage")
        if not isinstance(usage, Mapping):
            return
        for _field, names in _TOKEN_FIELDS:
            count = _usage_count(usage, names)
            if count is not None and _int(count) is None:
                self.losses.add_step(
                    t,
                    j,
                    f"info.meta.usage.{names[0]}",
                    "carried",
                    "not a 64-bit integer: the LM event's token count is null",
                )

    def _unmade_calls(self, t: int, j: int, lm: dict[str, Any]) -> None:
        """Empty the call record's tool calls of a step that made none (a call the model
        proposed and the env did not run): readers take a time step's calls from the
        first source that has some (FORMAT §5), so the record's would be read as the
        step's, and the way back and the drift check would see calls the step never made.
        The raw response stays in the carried `info`."""
        for record in lm["call_records"]:
            if record["output_tool_calls"]:
                record["output_tool_calls"] = []
                self.losses.add_step(
                    t,
                    j,
                    "info.meta.raw_response",
                    "carried",
                    "its tool calls, which the step did not make, are not in the call record",
                )

    def step(self, t: int, j: int, step: object, after: object, instance: str, policy: str) -> None:
        """Append one step's time step: prompt, LM call, environment event, tool calls."""
        i = len(self.time_steps)
        sid = f"decision_{i}"
        carry: dict[str, Any] = {"trajectory": t, "step": j}
        if isinstance(step, Mapping):
            obs = step.get("obs")
            reward, why = _reward(step.get("reward"))
            if why is not None:
                self.losses.add_step(t, j, "reward", "carried", why)
            done = step.get("done")
            if type(done) is not bool:
                why = _not_bool(step, "done")
                self.losses.add_step(t, j, "done", "carried", f"{why}: terminated = bool(done)")
            truncated = step.get("truncated")
            if type(truncated) is not bool:
                why = _not_bool(step, "truncated")
                self.losses.add_step(t, j, "truncated", "carried", f"{why}: bool(truncated)")
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
            self.losses.add(f"trajectories[{t}].steps[{j}]", "carried", "not an object: kept whole")
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
        info = step.get("info") if isinstance(step, Mapping) else None
        meta = info.get("meta") if isinstance(info, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        request = _chat_messages(meta)
        step_messages = self._prompts(t, j, sid, request, obs)
        if payload is not None:
            step_messages.append(_message("assistant", payload, j, sid, tool_call=True))
        self.messages.extend(step_messages)
        step_events: list[dict[str, Any]] = []
        lm = _lm_event(meta, request, j, sid, policy)
        if lm is not None:
            self._unreadable_meta(t, j, meta)
            if not (isinstance(step, Mapping) and _made_calls(step)):
                self._unmade_calls(t, j, lm)
            step_events.append(lm)
            if not lm["call_records"]:
                self.missing["call_records"] += 1
        step_events.append(event)
        self.events.extend(step_events)
        self.time_steps.append(
            {
                "step_id": sid,
                "step_index": i,
                "timestamp": None,
                "turn_number": j,
                "events": step_events,
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


def _seed(doc: Mapping[str, Any], first: Mapping[str, Any]) -> object:
    # Trajectories have no declared seed; producers that keep one put it here.
    for holder in (doc.get("pipeline_metadata"), first):
        value = holder.get("seed") if isinstance(holder, Mapping) else None
        if value is not None:
            return value
    return None


def _model(trajectories: list[Any]) -> object:
    for traj in trajectories:
        for step in _as_list(traj.get("steps") if isinstance(traj, Mapping) else None):
            info = step.get("info") if isinstance(step, Mapping) else None
            meta = info.get("meta") if isinstance(info, Mapping) else None
            if isinstance(meta, Mapping):
                model = meta.get("model", meta.get("model_name"))
                response = meta.get("raw_response")
                if model is None and isinstance(response, Mapping):
                    model = response.get("model")
                if isinstance(model, str):
                    return model
    return None


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _made_calls(step: Mapping[str, Any]) -> bool:
    # As the drift check reads a step: an empty, null, absent or non-list `tool_calls`
    # is no calls.
    calls = step.get("tool_calls")
    return isinstance(calls, list) and bool(calls)


def trajectories_to_trace(
    doc: Mapping[str, Any], *, created_at: str | None = None
) -> Conversion[dict[str, Any]]:
    """Convert a RolloutResponse's legacy trajectories to a full v3 trace (lossless).

    `created_at` (ISO text, e.g. when the store received the rollout) stands in for the
    creation time when the document holds none.
    """
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
            losses.add(f"trajectories[{t}]", "carried", "not an object: kept whole")
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
            builder.step(t, j, step, after, instance, str(traj.get("policy_id") or "policy"))
        if n and final_obs is None:
            losses.add(
                f"trajectories[{t}].final.observation",
                "carried",
                "absent or null: the last step's system_state_after is null",
            )
        counts[t] = n
        entries.append(_trajectory_entry(traj, n, final_obs if n else None, env_id, policy_id))

    builder.report_missing()
    created: object = _created_at(doc)
    if created is None and created_at is not None:
        created = created_at
        losses.add(
            "trace.created_at", "stand_in", "no creation time in the document: the given one"
        )
    elif created is None:
        losses.add("trace.created_at", "missing", "no creation time in the document: null")
    run_id = doc.get("run_id")
    metadata: dict[str, Any] = {
        "run_id": run_id,
        "env_id": env_id,
        "policy_id": policy_id,
        # The names trace readers look for (synth-ai's filter reads env_name, policy_name,
        # seed and model from here).
        "env_name": env_id,
        "policy_name": policy_id,
    }
    seed = _seed(doc, first)
    if seed is not None:
        metadata["seed"] = seed
    else:
        losses.add("trace.metadata.seed", "missing", "no seed in the document")
    model = _model(trajectories)
    if model is not None:
        metadata["model"] = model
    else:
        losses.add("trace.metadata.model", "missing", "no model name in the trajectories")
    metadata[CARRY_KEY] = {"format": CARRY_FORMAT, "trajectories": entries}
    metadata[PROVENANCE_KEY] = provenance.as_dict()
    trace: dict[str, Any] = {
        "session_id": run_id,
        "created_at": created,
        "session_time_steps": builder.time_steps,
        "event_history": builder.events,
        "markov_blanket_message_history": builder.messages,
        "metadata": metadata,
        "session_metadata": None,
    }
    return Conversion(trace, losses.finish(counts), provenance, "trajectories")
