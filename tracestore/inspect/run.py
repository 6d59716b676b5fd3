"""One run, as the run page shows it: header, parts, drift, reward per step, a page of steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from tracestore.drift.models import FindingOut, RunDrift
from tracestore.drift.queries import run_drift
from tracestore.errors import InvalidRequest, NotFound
from tracestore.inspect.models import (
    PANELS,
    ChatMessage,
    CidLocation,
    LmCall,
    PartInfo,
    RewardSeries,
    RunHeader,
    RunInspection,
    StepFinding,
    StepRow,
    StepsPage,
    ToolCall,
    TraceStep,
    TrajectoryStep,
)
from tracestore.inspect.sides import (
    DocumentTrace,
    DocumentTrajectories,
    TraceSide,
    TraceSlot,
    TrajectorySide,
    TrajectorySlot,
    TypedTrace,
    TypedTrajectories,
    pair,
)
from tracestore.models import Run, Trajectory
from tracestore.models.traces import Trace
from tracestore.store.documents import load_document_received
from tracestore.store.runs import run_summary
from tracestore.store.served import (
    USABLE_TRACE_KINDS,
    StoredRun,
    serve_trace,
    serve_trajectories,
)
from tracestore.toolcalls import normalize_tool_call
from tracestore.wire.trace import message_value

STEPS_PER_PAGE = 25
MAX_STEPS_PER_PAGE = 500
# No run has more steps; past it an offset would overflow the databases' integers.
MAX_POSITION = 2**31 - 1
# The field of a step each per-step finding kind is about (docs/FORMAT.md §6).
FINDING_FIELDS = {
    "reward_mismatch": "reward",
    "done_mismatch": "done",
    "truncated_mismatch": "truncated",
    "obs_mismatch": "obs",
    "tool_calls_mismatch": "tool_calls",
    "step_count_mismatch": "step",
}
# Where each correlation source is (docs/FORMAT.md §4); `{i}` is the first trajectory
# whose own cid came from there.
CID_PATHS = {
    "top_level": "trace_correlation_id",
    "pipeline_metadata": "pipeline_metadata.trace_correlation_id",
    "trajectory": "trajectories[{i}].trace_correlation_id",
    "inference_url": "trajectories[{i}].inference_url",
    "pipeline_metadata_url": "pipeline_metadata.inference_url",
    "step_inference_url": "trajectories[*].steps[*].info.meta.inference_url",
}


def finding_field(finding: FindingOut) -> str | None:
    """The step field a finding marks, or None for a run-level finding."""
    if finding.position is None:
        return None
    return FINDING_FIELDS.get(finding.kind)


def page_of(step: int, limit: int) -> int:
    """The offset of the page of `limit` steps that holds `step`."""
    return (max(0, step) // limit) * limit


# --- small readers ------------------------------------------------------------------------


def _tool_calls(calls: object) -> list[ToolCall]:
    return [ToolCall(**normalize_tool_call(c)) for c in calls] if isinstance(calls, list) else []


def _text_of(content: object) -> str | None:
    # Chat content: a string, or a list of parts with text (OpenAI and synth-ai shapes).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, Mapping)]
        joined = "\n".join(t for t in texts if isinstance(t, str))
        return joined or None
    return None


def chat_message(message: object) -> ChatMessage:
    """A time step's message read as a chat turn (role, text, tool calls), else its value."""
    m = message if isinstance(message, Mapping) else {}
    kind = m.get("message_type")
    kind = kind if isinstance(kind, str) else None
    value = message_value(m)
    if isinstance(value, Mapping) and ("role" in value or "tool_calls" in value):
        role = value.get("role")
        return ChatMessage(
            role=role if isinstance(role, str) else (kind or "message"),
            message_type=kind,
            text=_text_of(value.get("content")),
            tool_calls=_tool_calls(value.get("tool_calls")),
        )
    if isinstance(value, str):
        return ChatMessage(role=kind or "message", message_type=kind, text=value, tool_calls=[])
    return ChatMessage(
        role=kind or "message", message_type=kind, text=None, tool_calls=[], value=value
    )


def _records_transcript(lm_events: tuple[Mapping[str, Any], ...]) -> list[ChatMessage]:
    # Without messages in the time step, the model call's own record is the transcript.
    out: list[ChatMessage] = []
    for event in lm_events:
        records = event.get("call_records")
        for record in records if isinstance(records, list) else []:
            if not isinstance(record, Mapping):
                continue
            turns = [*(record.get("input_messages") or []), *(record.get("output_messages") or [])]
            for turn in turns:
                if not isinstance(turn, Mapping):
                    continue
                role = turn.get("role")
                out.append(
                    ChatMessage(
                        role=role if isinstance(role, str) else "message",
                        message_type="call_record",
                        text=_text_of(turn.get("parts")) or _text_of(turn.get("content")),
                        tool_calls=_tool_calls(turn.get("tool_calls")),
                    )
                )
            if record.get("output_tool_calls"):
                out.append(
                    ChatMessage(
                        role="assistant",
                        message_type="call_record",
                        text=None,
                        tool_calls=_tool_calls(record.get("output_tool_calls")),
                    )
                )
    return out


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def lm_call(event: Mapping[str, Any]) -> LmCall:
    """An LM call event's model, usage, latency and the tool calls its records made."""
    calls: list[Any] = []
    records = event.get("call_records")
    for record in records if isinstance(records, list) else []:
        made = record.get("output_tool_calls") if isinstance(record, Mapping) else None
        calls.extend(made if isinstance(made, list) else [])
    model, provider = event.get("model_name"), event.get("provider")
    return LmCall(
        model=model if isinstance(model, str) else None,
        provider=provider if isinstance(provider, str) else None,
        input_tokens=_int(event.get("input_tokens")),
        output_tokens=_int(event.get("output_tokens")),
        total_tokens=_int(event.get("total_tokens")),
        latency_ms=_float(event.get("latency_ms")),
        cost_usd=_float(event.get("cost_usd")),
        tool_calls=_tool_calls(calls),
    )


def trajectory_step(slot: TrajectorySlot) -> TrajectoryStep:
    """The trajectory side of a step."""
    step = slot.step
    declared = {"obs", "tool_calls", "reward", "done", "truncated", "info"}
    extra = {k: v for k, v in step.items() if k not in declared}
    return TrajectoryStep(
        trajectory_index=slot.trajectory_index,
        step_index=slot.step_index,
        obs=step.get("obs"),
        reward=step.get("reward"),
        done=step.get("done"),
        truncated=step.get("truncated"),
        tool_calls=_tool_calls(step.get("tool_calls")),
        info=step.get("info"),
        extra=extra or None,
    )


def trace_step(slot: TraceSlot) -> TraceStep:
    """The trace side of a step: its environment event, LM calls, transcript, tool calls."""
    env = slot.env
    event = env.event
    before = event.get("system_state_before")
    observation = env.observation()
    source = None
    if before is not None:
        source = "system_state_before"
    elif observation is not None:
        source = "observation message"
    messages = [chat_message(m) for m in env.messages] or _records_transcript(env.lm_events)
    shown = {k: v for k, v in event.items() if k != "event_type"}
    return TraceStep(
        step_id=slot.step_id,
        time_step=slot.time_step,
        timestamp=slot.timestamp,
        reward=event.get("reward"),
        terminated=event.get("terminated"),
        truncated=event.get("truncated"),
        observation=observation,
        observation_source=source,
        state_after=event.get("system_state_after"),
        tool_calls=None if env.tool_calls is None else _tool_calls(env.tool_calls),
        lm_calls=[lm_call(e) for e in env.lm_events],
        messages=messages,
        event=shown,
    )


# --- the run ------------------------------------------------------------------------------


# The panels that read the run's two sides (and convert a part the run lacks).
SIDE_PANELS = ("all", "parts", "rewards", "steps")


def converted_part(
    trace_kind: str | None, n_trajectories: int, panel: str = "all"
) -> Literal["trace", "trajectories"] | None:
    """The part inspecting a run's `panel` converts from the other (parsing the run's
    document), from its run row's columns; None when it reads stored parts only."""
    if panel not in SIDE_PANELS:
        return None
    usable = trace_kind in USABLE_TRACE_KINDS
    if n_trajectories == 0 and usable:
        return "trajectories"
    if n_trajectories > 0 and not usable:
        return "trace"
    return None


class _Document:
    """The run's document, parsed on first use (only a converted part needs it)."""

    def __init__(self, session: Session, run_id: str, stored: StoredRun | None) -> None:
        self.session = session
        self.run_id = run_id
        self.stored = stored  # already loaded (api/held.py: to charge its conversion)
        self._value: tuple[dict[str, Any], datetime] | None = None

    def get(self) -> tuple[dict[str, Any], datetime]:
        if self._value is None:
            if self.stored is not None:
                raw, received_at = self.stored.raw, self.stored.received_at
            else:
                raw, received_at = load_document_received(self.session.connection(), self.run_id)
            self._value = (orjson.loads(raw), received_at)
        return self._value


def _sides(
    session: Session, run: Any, trace_row: Any, document: _Document
) -> tuple[TrajectorySide | None, TraceSide | None, list[PartInfo]]:
    """Each side's reader, and where each part comes from."""
    parts: list[PartInfo] = []
    trajectories: TrajectorySide | None = None
    trace: TraceSide | None = None
    kind = run.trace_kind
    usable = kind in USABLE_TRACE_KINDS and trace_row is not None
    if run.n_trajectories > 0:
        trajectories = TypedTrajectories(session, run.id)
        parts.append(
            PartInfo(
                part="trajectories",
                source="stored",
                detail=f"{run.n_trajectories} trajectories as the producer sent them",
            )
        )
    elif usable:
        served = serve_trajectories(document.get()[0])
        trajectories = DocumentTrajectories(served.data)
        parts.append(
            PartInfo(
                part="trajectories",
                source="converted",
                detail="converted from the trace on read (the run has no trajectories)",
                report=served.conversion.report() if served.conversion else None,
            )
        )
    else:
        parts.append(
            PartInfo(
                part="trajectories",
                source="none",
                detail=f"no trajectories, and no full trace to convert them from "
                f"(the trace is {kind or 'null'})",
            )
        )
    if usable:
        trace = TypedTrace(session, trace_row.id)
        parts.append(
            PartInfo(
                part="trace",
                source="stored",
                detail=f"a {kind} trace as the producer sent it"
                + (" (read through its session_trace)" if kind == "wrapped" else ""),
            )
        )
    elif run.n_trajectories > 0:
        doc, received_at = document.get()
        served = serve_trace(doc, received_at)
        trace = DocumentTrace(served.data)
        stored = f"its own trace is {kind}" if kind else "it has no trace"
        parts.append(
            PartInfo(
                part="trace",
                source="converted",
                detail=f"converted from the trajectories on read ({stored})",
                report=served.conversion.report() if served.conversion else None,
            )
        )
    else:
        parts.append(
            PartInfo(
                part="trace",
                source="none",
                detail=f"no full trace (it is {kind or 'null'}) and no trajectories",
            )
        )
    return trajectories, trace, parts


def _header(session: Session, run: Any, trace_row: Any, summary: dict[str, Any]) -> RunHeader:
    cids = list(
        session.execute(
            select(
                Trajectory.correlation_id, Trajectory.correlation_source, Trajectory.inference_url
            )
            .where(Trajectory.run_pk == run.id)
            .order_by(Trajectory.idx)
        )
    )
    location = None
    if run.correlation_source is not None:
        index = next(
            (i for i, t in enumerate(cids) if t.correlation_source == run.correlation_source), 0
        )
        url = None
        if run.correlation_source == "inference_url" and index < len(cids):
            url = cids[index].inference_url
        elif run.correlation_source == "pipeline_metadata_url" and isinstance(
            run.pipeline_metadata, Mapping
        ):
            found = run.pipeline_metadata.get("inference_url")
            url = found if isinstance(found, str) else None
        path = CID_PATHS.get(run.correlation_source, run.correlation_source)
        location = CidLocation(source=run.correlation_source, path=path.format(i=index), url=url)
    return RunHeader(
        run_id=run.run_id,
        correlation_id=run.correlation_id,
        correlation=location,
        trajectory_cids=[t.correlation_id for t in cids],
        received_at=run.received_at,
        env_ids=summary["env_ids"],
        policy_ids=summary["policy_ids"],
        trace_kind=run.trace_kind,
        session_id=trace_row.session_id if trace_row is not None else None,
        trace_created_at=trace_row.created_at if trace_row is not None else None,
        metrics=run.metrics if isinstance(run.metrics, dict) else {},
        mean_return=run.mean_return,
        n_trajectories=run.n_trajectories,
        n_steps=summary["n_steps"],
        step_source=summary["step_source"],
        n_time_steps=trace_row.n_time_steps if trace_row is not None else 0,
        n_events=run.n_events,
        n_messages=run.n_messages,
        doc_bytes=run.doc_bytes,
        aborted=run.aborted,
        drift_kinds=summary["drift_kinds"],
    )


def _steps_page(
    trajectories: TrajectorySide | None,
    trace: TraceSide | None,
    findings: list[FindingOut],
    offset: int,
    limit: int,
) -> StepsPage:
    total = max(
        trajectories.count() if trajectories is not None else 0,
        trace.count() if trace is not None else 0,
    )
    stop = min(total, offset + limit)
    traj_slots = trajectories.window(offset, stop) if trajectories is not None else []
    trace_slots = trace.window(offset, stop) if trace is not None else []
    marked: dict[int, list[StepFinding]] = {}
    for f in findings:
        field = finding_field(f)
        if field is not None and f.position is not None and offset <= f.position < stop:
            marked.setdefault(f.position, []).append(
                StepFinding(
                    kind=f.kind,
                    field=field,
                    expected=f.expected,
                    actual=f.actual,
                    message=f.message,
                )
            )
    items = [
        StepRow(
            position=position,
            trajectory=trajectory_step(t) if t is not None else None,
            trace=trace_step(s) if s is not None else None,
            findings=marked.get(position, []),
            fields=sorted({f.field for f in marked.get(position, [])}),
        )
        for position, t, s in pair(traj_slots, trace_slots, offset, stop)
    ]
    return StepsPage(offset=offset, limit=limit, total=total, items=items)


def inspect_run(
    session: Session,
    run_id: str,
    *,
    panel: str = "all",
    offset: int = 0,
    limit: int = STEPS_PER_PAGE,
    step: int | None = None,
    document: StoredRun | None = None,
) -> RunInspection:
    """The run page's panels (`panel`: one of PANELS), with steps [offset, offset+limit);
    `step` picks the page that holds it instead. NotFound when no such run. `document`:
    the run's stored document, when the caller loaded it already (`converted_part`)."""
    if panel not in PANELS:
        raise InvalidRequest(f"unknown panel {panel!r}; panels: {', '.join(PANELS)}", panel=panel)
    if not 1 <= limit <= MAX_STEPS_PER_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_STEPS_PER_PAGE}", limit=limit)
    for name, value in (("offset", offset), ("step", step)):
        if value is not None and not 0 <= value <= MAX_POSITION:
            raise InvalidRequest(f"{name} is between 0 and {MAX_POSITION}", **{name: value})
    if step is not None:
        offset = page_of(step, limit)
    run = session.execute(select(Run).where(Run.run_id == run_id)).scalar_one_or_none()
    if run is None:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    trace_row = session.execute(
        select(Trace).where(Trace.run_pk == run.id, Trace.trajectory_idx.is_(None))
    ).scalar_one_or_none()
    wants: Callable[[str], bool] = lambda name: panel in ("all", name)  # noqa: E731
    out = RunInspection(run_id=run_id)
    if wants("header"):
        out.header = _header(session, run, trace_row, run_summary(session, run_id))
    drift: RunDrift | None = None
    if wants("drift") or wants("rewards") or wants("steps"):
        drift = run_drift(session, run_id)
        if wants("drift"):
            out.drift = drift
    if panel in SIDE_PANELS:
        trajectories, trace, parts = _sides(
            session, run, trace_row, _Document(session, run_id, document)
        )
        if wants("parts"):
            out.parts = parts
        findings = drift.findings if drift is not None else []
        if wants("rewards"):
            out.rewards = RewardSeries(
                trajectory=trajectories.rewards() if trajectories is not None else [],
                trace=trace.rewards() if trace is not None else [],
                drift_positions=sorted(
                    {f.position for f in findings if f.position is not None and finding_field(f)}
                ),
            )
        if wants("steps"):
            out.steps = _steps_page(trajectories, trace, findings, offset, limit)
    return out


def first_finding_position(drift: RunDrift) -> int | None:
    """The position of the run's first step with a finding, or None."""
    positions = [f.position for f in drift.findings if finding_field(f) is not None]
    return min((p for p in positions if p is not None), default=None)
