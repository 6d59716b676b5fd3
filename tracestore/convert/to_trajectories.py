"""A v3 trace → legacy trajectories (SPEC §5).

`trace_to_trajectories(doc_or_trace)` takes a RolloutResponse (its `trace` is converted and
the rest is the envelope) or a bare trace (pass `envelope=` for the cid and inference URL).

Traces we made (`trajectories_to_trace`, recognised by a valid `tracestore_legacy` carry in
the trace metadata whose `n_steps` add up to the environment events) are reversed exactly:
the result equals the original `trajectories`, with no provenance key added (method `carry`).

Any other full or wrapped trace (method `trace`) gives one trajectory:

- steps: the environment events, each once, in time-step order (`TraceView`); obs =
  `system_state_before` (absent → `{}`, lost), reward (null → 0.0), done = `terminated`,
  truncated (null → false);
- tool calls: the first SPEC §5 source with a non-empty list, as the drift comparison reads
  them (`TraceView.environment_steps`), kept in the dialect the trace holds them;
  none → `[]`;
- info: the event's `metadata.info` when present (hand-built producers keep the step's info
  there), else null and listed as lost;
- `env_id` / `policy_id`: trace metadata (else `env_name` / `policy_name`, else `""`);
  `inference_url`: the envelope's `pipeline_metadata.inference_url`, else its first
  trajectory's, else `""`; `trace_correlation_id`: the envelope's canonical cid
  (`resolve_correlation`), when there is one; `final`: `{"observation": <last event's
  system_state_after>}`, else null; `length`: the number of steps; `decision_samples`: null
  (lost); `tracestore_provenance`: the conversion's provenance.
- Undeclared step keys (`logprob`, `value`, ...) are not in a trace and cannot come back.

Summary, db_row, empty, unknown and null traces, and traces without environment events, give
no trajectories and one loss entry at `trace` saying why (method `none`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracestore.convert.carry import (
    CARRY_FORMAT,
    STEP_KEYS,
    TRAJECTORY_KEYS,
    assemble,
    derived_final,
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
from tracestore.correlation import resolve_correlation
from tracestore.jsontext import member as _get
from tracestore.toolcalls import trajectory_tool_call
from tracestore.wire.trace import EnvStep, classify_trace, view_trace

CONVERTER_NAME = "trace_to_trajectories"


def _split(
    doc_or_trace: Mapping[str, Any], envelope: Mapping[str, Any] | None
) -> tuple[object, Mapping[str, Any] | None]:
    # A RolloutResponse has a `trace` key; a SessionTrace (full or wrapped) never does.
    if (
        isinstance(doc_or_trace, Mapping)
        and "trace" in doc_or_trace
        and ("run_id" in doc_or_trace or "trajectories" in doc_or_trace)
    ):
        return doc_or_trace.get("trace"), envelope if envelope is not None else doc_or_trace
    return doc_or_trace, envelope


def _carry_entries(carry: object, n_events: int) -> list[Mapping[str, Any]] | None:
    # Our own carry, when it is well formed and still describes this trace's events.
    if not isinstance(carry, Mapping) or carry.get("format") != CARRY_FORMAT:
        return None
    entries = carry.get("trajectories")
    if not isinstance(entries, list):
        return None
    total = 0
    for entry in entries:
        n = _get(entry, "n_steps")
        if type(n) is not int or n < 0 or ("raw" in entry and n != 0):
            return None
        total += n
    return entries if total == n_events else None


def _restore(
    entries: list[Mapping[str, Any]], steps: list[EnvStep], meta: Mapping[str, Any]
) -> list[Any]:
    out: list[Any] = []
    pos = 0
    for entry in entries:
        if "raw" in entry:
            out.append(entry["raw"])
            continue
        n: int = entry["n_steps"]
        restored: list[Any] = []
        for env_step in steps[pos : pos + n]:
            event = env_step.event
            carry = _get(event.get("metadata"), CARRY_KEY)
            if not isinstance(carry, Mapping):
                carry = {}
            if "raw" in carry:
                restored.append(carry["raw"])
                continue
            derived = {
                "obs": event.get("system_state_before"),
                "tool_calls": env_step.tool_calls if env_step.tool_calls is not None else [],
                "reward": event.get("reward"),
                "done": event.get("terminated"),
                "truncated": event.get("truncated"),
                "info": None,
            }
            restored.append(assemble(derived, carry, STEP_KEYS))
        last_after = steps[pos + n - 1].event.get("system_state_after") if n else None
        pos += n
        header = {
            "env_id": meta.get("env_id"),
            "policy_id": meta.get("policy_id"),
            "steps": restored,
            "final": derived_final(last_after),
            "length": n,
            "inference_url": None,
            "decision_samples": None,
        }
        out.append(assemble(header, entry, TRAJECTORY_KEYS))
    return out


def _name(meta: Mapping[str, Any], key: str, fallback: str, losses: LossCollector) -> str:
    value = meta.get(key)
    if isinstance(value, str):
        return value
    other = meta.get(fallback)
    if isinstance(other, str):
        losses.add(f"trajectories[0].{key}", "default", f"not in trace metadata: its {fallback}")
        return other
    losses.add(f"trajectories[0].{key}", "lost", "not in trace metadata: empty string")
    return ""


def _inference_url(envelope: Mapping[str, Any] | None, losses: LossCollector) -> str:
    url = _get(_get(envelope, "pipeline_metadata"), "inference_url")
    if not isinstance(url, str):
        trajectories = _get(envelope, "trajectories")
        if isinstance(trajectories, list) and trajectories:
            url = _get(trajectories[0], "inference_url")
    if isinstance(url, str):
        return url
    losses.add("trajectories[0].inference_url", "lost", "not in the envelope: empty string")
    return ""


def _number(value: object) -> float | None:
    # A float as read (a RoundedFloat stays one, to be reported); an integer as a float
    # when a double holds it, else whole (a trace's `1` is a trajectory's `1.0`).
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return whole_or_float(value)
        except OverflowError:
            return None
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(lm_event: Mapping[str, Any]) -> dict[str, int]:
    # The LM event's token counts under the names a producer's step info uses; a call
    # record's own usage stands in when the event has none.
    counts = {
        "prompt_tokens": _int(lm_event.get("input_tokens")),
        "completion_tokens": _int(lm_event.get("output_tokens")),
        "total_tokens": _int(lm_event.get("total_tokens")),
    }
    if all(v is None for v in counts.values()):
        records = lm_event.get("call_records")
        usage = _get(records[0], "usage") if isinstance(records, list) and records else None
        if isinstance(usage, Mapping):
            counts = {
                "prompt_tokens": _int(usage.get("input_tokens", usage.get("prompt_tokens"))),
                "completion_tokens": _int(
                    usage.get("output_tokens", usage.get("completion_tokens"))
                ),
                "total_tokens": _int(usage.get("total_tokens")),
            }
    return {k: v for k, v in counts.items() if v is not None}


def _step_info(env_step: EnvStep, j: int, url: str, losses: LossCollector) -> dict[str, Any]:
    """A step's `info`: what a producer's step holds that the trace has (SPEC §5)."""
    event = env_step.event
    event_meta = event.get("metadata")
    kept = event_meta.get("info") if isinstance(event_meta, Mapping) else None
    # Hand-built producers keep the step's info in the event metadata: it is the base.
    info: dict[str, Any] = dict(kept) if isinstance(kept, Mapping) else {}
    if not isinstance(kept, Mapping):
        losses.add_step(
            0,
            j,
            "info",
            "lost",
            "only info.meta (inference URL, turn, usage, timing) is in a trace",
        )
    old_meta = info.get("meta")
    meta: dict[str, Any] = dict(old_meta) if isinstance(old_meta, Mapping) else {}
    if url:
        meta.setdefault("inference_url", url)
    turn = _int(_get(event_meta, "turn"))
    meta.setdefault("turn_index", turn if turn is not None else j)
    lm = env_step.lm_events[0] if env_step.lm_events else None
    if lm is not None:
        latency = _number(lm.get("latency_ms"))
        if latency is not None:
            whole = type(latency) is float and latency.is_integer()
            meta.setdefault("inference_ms", int(latency) if whole else latency)
        usage = _usage(lm)
        if usage:
            meta.setdefault("usage", usage)
    if "usage" not in meta:
        losses.add_step(0, j, "info.meta.usage", "lost", "no LM call event with token counts")
    info["meta"] = meta
    return info


def _core_step(env_step: EnvStep) -> dict[str, Any]:
    """A step's obs, tool calls, reward, done and truncated, as the conversion gives them."""
    event = env_step.event
    obs = env_step.observation()
    reward = _number(event.get("reward"))
    return {
        "obs": obs if obs is not None else {},
        # One shape whatever dialect the trace holds: a trainer reads
        # tool_calls[k]["arguments"][...] as an object.
        "tool_calls": [trajectory_tool_call(c) for c in env_step.tool_calls or ()],
        "reward": reward if reward is not None else 0.0,
        "done": bool(event.get("terminated")),
        "truncated": bool(event.get("truncated")),
    }


def core_steps(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each step's obs, tool_calls, reward, done and truncated as `trace_to_trajectories`
    gives them for a bare trace, without the rest of the conversion (info, the loss report,
    provenance): what the phase-1 reproduction check compares, at a fraction of the cost.
    """
    if classify_trace(trace) not in ("full", "wrapped"):
        return []
    view = view_trace(trace)
    meta = view.session.get("metadata")
    if isinstance(meta, Mapping) and CARRY_KEY in meta:
        # A trace we made: the carry decides what comes back; take the whole conversion.
        out: list[dict[str, Any]] = []
        for trajectory in trace_to_trajectories(trace).data:
            steps = _get(trajectory, "steps")
            out.extend(steps if isinstance(steps, list) else [])
        return out
    return [_core_step(s) for s in view.environment_steps()]


def _from_trace(
    steps: list[EnvStep],
    meta: Mapping[str, Any],
    envelope: Mapping[str, Any] | None,
    provenance: Provenance,
    losses: LossCollector,
) -> list[dict[str, Any]]:
    inference_url = _inference_url(envelope, losses)
    out_steps: list[dict[str, Any]] = []
    for j, env_step in enumerate(steps):
        event = env_step.event
        if env_step.observation() is None:
            losses.add_step(
                0, j, "obs", "lost", "no system_state_before or observation message: {}"
            )
        if env_step.tool_calls is None:
            losses.add_step(0, j, "tool_calls", "default", "no tool calls in the trace: []")
        if _number(event.get("reward")) is None:
            losses.add_step(0, j, "reward", "default", "no numeric reward: 0.0")
        if type(event.get("terminated")) is not bool:
            losses.add_step(0, j, "done", "default", "terminated not a bool: bool(terminated)")
        if type(event.get("truncated")) is not bool:
            losses.add_step(0, j, "truncated", "default", "not a bool: bool(truncated)")
        step = _core_step(env_step)
        step["info"] = _step_info(env_step, j, inference_url, losses)
        out_steps.append(step)
    last_after = steps[-1].event.get("system_state_after")
    if last_after is None:
        losses.add("trajectories[0].final", "lost", "no system_state_after on the last event: null")
    env_id = _name(meta, "env_id", "env_name", losses)
    policy_id = _name(meta, "policy_id", "policy_name", losses)
    losses.add("trajectories[0].decision_samples", "lost", "not in the trace: null")
    trajectory: dict[str, Any] = {
        "env_id": env_id,
        "policy_id": policy_id,
        "steps": out_steps,
        "final": derived_final(last_after),
        "length": len(out_steps),
        "inference_url": inference_url,
        "decision_samples": None,
    }
    cid = resolve_correlation(envelope).correlation_id if envelope is not None else None
    if cid is not None:
        trajectory["trace_correlation_id"] = cid
    trajectory[PROVENANCE_KEY] = provenance.as_dict()
    return [trajectory]


def trace_to_trajectories(
    doc_or_trace: Mapping[str, Any], *, envelope: Mapping[str, Any] | None = None
) -> Conversion[list[Any]]:
    """Convert a trace (or a RolloutResponse's trace) to legacy trajectories."""
    provenance = Provenance(CONVERTER_NAME, CONVERTER_VERSION, source_sha256(doc_or_trace))
    trace, envelope = _split(doc_or_trace, envelope)
    kind = classify_trace(trace)
    if kind not in ("full", "wrapped") or not isinstance(trace, Mapping):
        why = "trace is null" if kind is None else f"a {kind} trace has no per-step events"
        return Conversion([], [LossEntry("trace", "lost", why)], provenance, "none")
    view = view_trace(trace)
    steps = view.environment_steps()
    meta = view.session.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    losses = LossCollector()
    if CARRY_KEY in meta:
        entries = _carry_entries(meta[CARRY_KEY], len(steps))
        if entries is not None:
            return Conversion(_restore(entries, steps, meta), [], provenance, "carry")
        losses.add(
            f"trace.metadata.{CARRY_KEY}",
            "lost",
            "carry ignored: malformed or does not match the environment events",
        )
    if not steps:
        losses.add("trace", "lost", "no environment events")
        return Conversion([], losses.finish({}), provenance, "none")
    trajectories = _from_trace(steps, meta, envelope, provenance, losses)
    return Conversion(trajectories, losses.finish({0: len(steps)}), provenance, "trace")
