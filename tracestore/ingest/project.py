"""Projection of a validated RolloutResponse into table rows (pure: no database).

Rows are plain dicts keyed by column name, ready for executemany. Parent keys
(run_pk, trajectory_pk, trace_pk, time_step_pk) are filled in by the writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracestore.correlation import Resolution
from tracestore.errors import InvalidRollout
from tracestore.jsontext import json_type
from tracestore.store.rollouts import RolloutRows, TraceRows
from tracestore.wire.datetimes import parse_datetime
from tracestore.wire.trace import Placed, classify_trace, infer_event_type, view_trace

_INT64 = 2**63

STEP_KEYS = frozenset(("obs", "tool_calls", "reward", "done", "truncated", "info"))
TRAJECTORY_KEYS = frozenset(
    (
        "env_id",
        "policy_id",
        "steps",
        "length",
        "inference_url",
        "final",
        "decision_samples",
        "trace",
    )
)
SESSION_KEYS = frozenset(
    (
        "session_id",
        "created_at",
        "session_time_steps",
        "event_history",
        "markov_blanket_message_history",
        "metadata",
        "session_metadata",
    )
)
TIME_STEP_KEYS = frozenset(
    (
        "step_id",
        "step_index",
        "turn_number",
        "timestamp",
        "completed_at",
        "events",
        "markov_blanket_messages",
        "step_metadata",
    )
)
EVENT_COLUMNS = (
    "system_instance_id",
    "time_record",
    "reward",
    "terminated",
    "truncated",
    "actions",
    "system_state_before",
    "system_state_after",
    "model_name",
    "provider",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cost_usd",
    "latency_ms",
    "span_id",
    "trace_id",
    "call_records",
    "metadata",
    "event_metadata",
)
EVENT_KEYS = frozenset((*EVENT_COLUMNS, "event_type"))
MESSAGE_KEYS = frozenset(("content", "message_type", "time_record", "metadata"))


def _extra(obj: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any] | None:
    if obj.keys() <= known:  # the usual case, at C speed
        return None
    extra = {k: v for k, v in obj.items() if k not in known}
    return extra or None


class _Typer:
    """Typed reads from trace JSON that name the failing path in their error.

    A path is given as a prefix (a string, or a `_Where` built only when something fails)
    and a suffix: on the hot path, where every value has its type, no path is ever built.
    """

    def __init__(self) -> None:
        self.errors: list[dict[str, str]] = []

    def fail(self, path: object, expected: str, value: object, suffix: str = "") -> None:
        self.errors.append(
            {
                "path": f"{path}{suffix}",
                "message": f"expected {expected}, got {json_type(value)}",
            }
        )

    def num(self, value: object, path: object, suffix: str = "") -> float | None:
        if value is None:
            return None
        kind = type(value)
        if kind is float:
            return value  # type: ignore[return-value]  # exactly a float
        if kind is int:
            return float(value)  # type: ignore[arg-type]  # exactly an int
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, "a number or null", value, suffix)
            return None
        return float(value)

    def int(self, value: object, path: object, suffix: str = "") -> int | None:
        if value is None:
            return None
        if type(value) is int and -_INT64 <= value < _INT64:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
            self.fail(path, "an integer (64-bit) or null", value, suffix)
            return None
        return value

    def bool(self, value: object, path: object, suffix: str = "") -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        if type(value) is int and value in (0, 1):
            # SQLite has no boolean: synth-ai's own read-back of its trace database
            # (trace_utils.load_session_trace) gives `terminated` and `truncated` as 0/1.
            # The typed column reads them as false/true; the document keeps the 0/1.
            return value == 1
        self.fail(path, "true, false or null", value, suffix)
        return None

    def str(self, value: object, path: object, suffix: str = "") -> str | None:
        if value is None or type(value) is str:
            return value  # None or exactly a str
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return repr(value)  # ids written as numbers by hand-built producers
        self.fail(path, "a string or null", value, suffix)
        return None


def _mapping(value: object) -> bool:
    # dict first: parsed JSON is dicts, and the Mapping ABC check is several times slower.
    return type(value) is dict or isinstance(value, Mapping)


def _event_row(placed: Placed, position: int, t: _Typer, path: object) -> dict[str, Any]:
    e = placed.item
    if not _mapping(e):
        t.fail(path, "an object", e)
        e = {}
    get = e.get
    time_record = get("time_record")
    return {
        "position": position,
        "position_in_step": placed.position_in_step,
        "history_position": placed.history_position,
        "event_type": infer_event_type(e),
        "system_instance_id": t.str(get("system_instance_id"), path, ".system_instance_id"),
        "event_time": t.num(
            time_record.get("event_time") if _mapping(time_record) else None,
            path,
            ".time_record.event_time",
        ),
        "time_record": time_record,
        "reward": t.num(get("reward"), path, ".reward"),
        "terminated": t.bool(get("terminated"), path, ".terminated"),
        "truncated": t.bool(get("truncated"), path, ".truncated"),
        "actions": get("actions"),
        "system_state_before": get("system_state_before"),
        "system_state_after": get("system_state_after"),
        "model_name": t.str(get("model_name"), path, ".model_name"),
        "provider": t.str(get("provider"), path, ".provider"),
        "input_tokens": t.int(get("input_tokens"), path, ".input_tokens"),
        "output_tokens": t.int(get("output_tokens"), path, ".output_tokens"),
        "total_tokens": t.int(get("total_tokens"), path, ".total_tokens"),
        "cost_usd": t.num(get("cost_usd"), path, ".cost_usd"),
        "latency_ms": t.num(get("latency_ms"), path, ".latency_ms"),
        "span_id": t.str(get("span_id"), path, ".span_id"),
        "trace_id": t.str(get("trace_id"), path, ".trace_id"),
        "call_records": get("call_records"),
        "metadata": get("metadata"),
        "event_metadata": get("event_metadata"),
        "extra": _extra(e, EVENT_KEYS),
    }


def _message_row(placed: Placed, position: int, t: _Typer, path: object) -> dict[str, Any]:
    m = placed.item
    if not _mapping(m):
        t.fail(path, "an object", m)
        m = {}
    content = m.get("content")
    text: str | None = None
    payload: str | None = None
    extra = _extra(m, MESSAGE_KEYS) or {}
    if _mapping(content):
        text = t.str(content.get("text"), path, ".content.text")
        payload = t.str(content.get("json_payload"), path, ".content.json_payload")
        other = {k: v for k, v in content.items() if k not in ("text", "json_payload")}
        if other:
            extra["content"] = other
    elif isinstance(content, str):
        text = content
    elif content is not None:
        extra["content"] = content
    time_record = m.get("time_record")
    tr = time_record if _mapping(time_record) else {}
    return {
        "position": position,
        "position_in_step": placed.position_in_step,
        "history_position": placed.history_position,
        "message_type": t.str(m.get("message_type"), path, ".message_type"),
        "text": text,
        "json_payload": payload,
        "event_time": t.num(tr.get("event_time"), path, ".time_record.event_time"),
        "message_time": t.num(tr.get("message_time"), path, ".time_record.message_time"),
        "metadata": m.get("metadata"),
        "extra": extra or None,
    }


_SESSION_LISTS = ("session_time_steps", "event_history", "markov_blanket_message_history")
_STEP_LISTS = ("events", "markov_blanket_messages")


def project_trace(
    trace: Mapping[str, Any], trajectory_idx: int | None, t: _Typer, path: str
) -> TraceRows:
    """Rows of one trace of any kind (only full and wrapped traces have steps and events)."""
    kind = classify_trace(trace) or "unknown"
    view = view_trace(trace) if kind in ("full", "wrapped") else None
    session: Mapping[str, Any] = view.session if view is not None else trace
    sess_path = f"{path}.session_trace" if kind == "wrapped" else path
    known = (
        SESSION_KEYS if view is not None else frozenset(("session_id", "created_at", "metadata"))
    )
    rows = TraceRows(
        trace={
            "trajectory_idx": trajectory_idx,
            "kind": kind,
            "session_id": t.str(session.get("session_id"), f"{sess_path}.session_id"),
            "created_at": parse_datetime(session.get("created_at")),
            "metadata": session.get("metadata"),
            "session_metadata": session.get("session_metadata"),
            "wrapper": view.wrapper if view is not None else None,
            "extra": _extra(session, known),
            "n_time_steps": 0,
            "n_events": 0,
            "n_messages": 0,
        }
    )
    if view is None:
        return rows
    # The view reads a list that is not one as no items: a full trace of `"event_history":
    # 5` was stored as full, with nothing in it, and served as the producer's.
    for key in _SESSION_LISTS:
        value = session.get(key)
        if value is not None and type(value) is not list:
            t.fail(f"{sess_path}.{key}", "an array or null", value)
    for s, step in enumerate(view.time_steps):
        sp = _StepWhere(sess_path, s)
        if not _mapping(step):
            t.fail(sp, "an object", step)
            continue
        for key in _STEP_LISTS:
            value = step.get(key)
            if value is not None and type(value) is not list:
                t.fail(sp, "an array or null", value, f".{key}")
        rows.time_steps.append(
            {
                "position": s,
                "step_id": t.str(step.get("step_id"), sp, ".step_id"),
                "step_index": t.int(step.get("step_index"), sp, ".step_index"),
                "turn_number": t.int(step.get("turn_number"), sp, ".turn_number"),
                "timestamp": parse_datetime(step.get("timestamp")),
                "completed_at": parse_datetime(step.get("completed_at")),
                "step_metadata": step.get("step_metadata"),
                "extra": _extra(step, TIME_STEP_KEYS),
            }
        )
    for i, placed in enumerate(view.events):
        rows.events.append(_event_row(placed, i, t, _Where(sess_path, placed, "events")))
        rows.event_steps.append(placed.step_position)
    for i, placed in enumerate(view.messages):
        rows.messages.append(_message_row(placed, i, t, _Where(sess_path, placed, "messages")))
        rows.message_steps.append(placed.step_position)
    rows.trace["n_time_steps"] = len(rows.time_steps)
    rows.trace["n_events"] = len(rows.events)
    rows.trace["n_messages"] = len(rows.messages)
    return rows


def project_trace_document(trace: Mapping[str, Any], path: str = "trace") -> TraceRows:
    """Rows of a run-level trace on its own (e.g. one converted from trajectories)."""
    t = _Typer()
    rows = project_trace(trace, None, t, path)
    if t.errors:
        first = t.errors[0]
        raise InvalidRollout(
            f"the trace has a value of the wrong type: {first['path']}: {first['message']}",
            errors=t.errors[:50],
        )
    return rows


class _StepWhere:
    """Where a time step is, written out only when an error names it."""

    __slots__ = ("position", "sess_path")

    def __init__(self, sess_path: str, position: int) -> None:
        self.sess_path, self.position = sess_path, position

    def __str__(self) -> str:
        return f"{self.sess_path}.session_time_steps[{self.position}]"


class _Where:
    """Where an event or message is, written out only when an error names it."""

    __slots__ = ("placed", "sess_path", "what")

    def __init__(self, sess_path: str, placed: Placed, what: str) -> None:
        self.sess_path, self.placed, self.what = sess_path, placed, what

    def __str__(self) -> str:
        return _where(self.sess_path, self.placed, self.what)


def _where(sess_path: str, placed: Placed, what: str) -> str:
    if placed.step_position is not None:
        inner = "events" if what == "events" else "markov_blanket_messages"
        step = f"{sess_path}.session_time_steps[{placed.step_position}]"
        return f"{step}.{inner}[{placed.position_in_step}]"
    history = "event_history" if what == "events" else "markov_blanket_message_history"
    return f"{sess_path}.{history}[{placed.history_position}]"


def project_rollout(doc: Mapping[str, Any], resolution: Resolution) -> RolloutRows:
    """All rows of a RolloutResponse already validated by wire.rollout.RolloutIn."""
    t = _Typer()
    metrics: Mapping[str, Any] = doc["metrics"]
    trajectories: list[Mapping[str, Any]] = doc["trajectories"]
    traj_rows: list[dict[str, Any]] = []
    step_rows: list[list[dict[str, Any]]] = []
    traces: list[TraceRows] = []
    for i, traj in enumerate(trajectories):
        own_cid, own_source = resolution.trajectory_cids[i]
        steps: list[Mapping[str, Any]] = traj["steps"]
        traj_rows.append(
            {
                "idx": i,
                "env_id": traj.get("env_id"),
                "policy_id": traj.get("policy_id"),
                "length": traj.get("length"),
                "inference_url": traj.get("inference_url"),
                "correlation_id": own_cid,
                "correlation_source": own_source,
                "final": traj.get("final"),
                "decision_samples": traj.get("decision_samples"),
                "n_steps": len(steps),
                "extra": _extra(traj, TRAJECTORY_KEYS),
            }
        )
        step_rows.append(
            [
                {
                    "idx": j,
                    "obs": step.get("obs"),
                    "tool_calls": step.get("tool_calls"),
                    "reward": None if step.get("reward") is None else float(step["reward"]),
                    "done": step.get("done"),
                    "truncated": step.get("truncated"),
                    "info": step.get("info"),
                    "extra": _extra(step, STEP_KEYS),
                }
                for j, step in enumerate(steps)
            ]
        )
        inner = traj.get("trace")
        if isinstance(inner, Mapping):
            traces.append(project_trace(inner, i, t, f"trajectories[{i}].trace"))
    trace = doc.get("trace")
    kind: str | None = None
    if isinstance(trace, Mapping):
        rows = project_trace(trace, None, t, "trace")
        kind = rows.trace["kind"]
        traces.insert(0, rows)
    if t.errors:
        raise InvalidRollout(
            f"the trace has {len(t.errors)} value(s) of the wrong type; first: "
            f"{t.errors[0]['path']}: {t.errors[0]['message']}",
            errors=t.errors[:50],
        )
    _check_indexed(doc, traj_rows, traces, resolution, t)
    if t.errors:
        raise InvalidRollout(
            f"an identifier is too long: {t.errors[0]['path']}: {t.errors[0]['message']}",
            errors=t.errors[:50],
        )
    top = traces[0] if traces and traces[0].trace["trajectory_idx"] is None else None
    first = traj_rows[0] if traj_rows else {}
    meta = top.trace["metadata"] if top else None
    run = {
        "run_id": doc["run_id"],
        "correlation_id": resolution.correlation_id,
        "correlation_source": resolution.source,
        "trace_kind": kind,
        "n_trajectories": len(trajectories),
        "n_steps": sum(len(s) for s in step_rows),
        "n_events": top.trace["n_events"] if top else 0,
        "n_messages": top.trace["n_messages"] if top else 0,
        "mean_return": float(metrics["mean_return"]),
        "num_steps": metrics.get("num_steps"),
        "num_episodes": metrics.get("num_episodes"),
        "outcome_score": _opt_float(metrics.get("outcome_score")),
        "events_score": _opt_float(metrics.get("events_score")),
        "metrics": metrics,
        "aborted": bool(doc.get("aborted", False)),
        "ops_executed": doc.get("ops_executed", 0),
        "branches": doc.get("branches"),
        "pipeline_metadata": doc.get("pipeline_metadata"),
        # As reports/views.sql reads a run's env and policy, and its steps when it has
        # no trajectory steps (the environment events of its run-level trace). A trace
        # names them `env_id` / `policy_id`, else (synth-ai's own traces, which its filter
        # reads so) `env_name` / `policy_name`, as the trace -> trajectories converter
        # reads them (which also passes over an `env_id` that is not a string).
        "env_id": _either(first.get("env_id"), _trace_name(meta, "env_id", "env_name")),
        "policy_id": _either(first.get("policy_id"), _trace_name(meta, "policy_id", "policy_name")),
        "n_trace_steps": _environment_events(top),
    }
    return RolloutRows(run=run, trajectories=traj_rows, steps=step_rows, traces=traces)


# Indexed text columns: PostgreSQL's btree refuses entries over ~2.7 KB, so identifiers
# are bounded (in UTF-8 bytes) and a longer one is a clear 422, not a database error.
MAX_ID_BYTES = 1024


def _either(first: str | None, second: str | None) -> str | None:
    return first if first is not None else second  # SQL's coalesce: "" counts


def _environment_events(trace: TraceRows | None) -> int:
    if trace is None:
        return 0
    return sum(1 for event in trace.events if event["event_type"] == "environment")


def _named_id(metadata: object, key: str) -> str | None:
    """The id a trace's metadata names under `key`: a string of at most MAX_ID_BYTES.

    Anything else is not an identifier: it stays in the trace's metadata, unindexed,
    rather than refusing a rollout over its metadata.
    """
    if not isinstance(metadata, Mapping):
        return None
    value = metadata.get(key)
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        return None
    return value


def _trace_name(metadata: object, key: str, fallback: str) -> str | None:
    """The id a trace's metadata names under `key`, else under `fallback` (when `key` is
    absent or null: a present value that is no id is not replaced)."""
    if isinstance(metadata, Mapping) and metadata.get(key) is None:
        return _named_id(metadata, fallback)
    return _named_id(metadata, key)


def _check_indexed(
    doc: Mapping[str, Any],
    trajectories: list[dict[str, Any]],
    traces: list[TraceRows],
    resolution: Resolution,
    t: _Typer,
) -> None:
    def check(value: object, path: str) -> None:
        if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
            t.errors.append({"path": path, "message": f"longer than {MAX_ID_BYTES} bytes"})

    check(doc.get("run_id"), "run_id")
    for loc in resolution.locations:
        check(loc.cid, loc.path)
    for i, row in enumerate(trajectories):
        check(row["env_id"], f"trajectories[{i}].env_id")
        check(row["policy_id"], f"trajectories[{i}].policy_id")
    for trace in traces:
        check(trace.trace["session_id"], "trace.session_id")
        for event in trace.events:
            check(event["model_name"], "trace event model_name")
            check(event["event_type"], "trace event event_type")


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
