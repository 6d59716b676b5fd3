"""The two sides of a run's steps, read for one page at a time.

A *side* is the trajectory steps (all trajectories, in order) or the trace's environment
events (each once, in time-step order, with their time step's messages, LM events and tool
calls: `wire.trace.EnvStep`). Position *i* of one side faces position *i* of the other, as
the drift comparison aligns them (docs/FORMAT.md §6).

Each side is read one of two ways:

- from the typed tables, when the part is stored: the reward of every step (for the chart)
  and the full rows of one page only, so a 5,000-step run's page costs what a 25-step
  run's does, and its document (tens of MB of JSON) is never parsed;
- from a parsed document, for a part converted on read (a legacy-only run's trace, a
  trace-only run's trajectories): the conversion needs the whole document anyway.

Both build the same `EnvStep`s with the same pure functions (`time_step_tool_calls`,
`time_step_observation`) the converters and the drift comparison use, so the page shows
what drift compared. tests/web/test_inspect.py checks the two readings agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import and_, case, or_, select, type_coerce
from sqlalchemy.orm import Session

from tracestore.ingest.project import EVENT_COLUMNS
from tracestore.models import Step, Trajectory
from tracestore.models.traces import TraceEvent, TraceMessage, TraceTimeStep
from tracestore.wire.datetimes import parse_datetime
from tracestore.wire.trace import (
    EnvStep,
    infer_event_type,
    time_step_tool_calls,
    view_trace,
)


@dataclass(frozen=True, slots=True)
class TrajectorySlot:
    """One trajectory step and where it stands."""

    trajectory_index: int
    step_index: int
    step: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TraceSlot:
    """One environment event with its time step (EnvStep) and that time step's place."""

    env: EnvStep
    step_id: str | None
    time_step: int | None
    timestamp: datetime | None


class TrajectorySide(Protocol):
    """The trajectory steps of a run."""

    def count(self) -> int:
        """How many steps."""
        ...

    def rewards(self) -> list[float | None]:
        """Every step's reward, in order."""
        ...

    def window(self, start: int, stop: int) -> list[TrajectorySlot]:
        """Steps [start, stop)."""
        ...


class TraceSide(Protocol):
    """The environment events of a run's trace."""

    def count(self) -> int:
        """How many environment events."""
        ...

    def rewards(self) -> list[float | None]:
        """Every environment event's reward, in order."""
        ...

    def window(self, start: int, stop: int) -> list[TraceSlot]:
        """Environment events [start, stop) with their time steps."""
        ...


def number(value: object) -> float | None:
    """A reward as a float, or None when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _get(obj: object, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


# --- from a parsed document ---------------------------------------------------------------


class DocumentTrajectories:
    """The trajectory steps of parsed trajectories (stored or converted)."""

    def __init__(self, trajectories: object) -> None:
        self.slots: list[TrajectorySlot] = []
        for t, trajectory in enumerate(trajectories if isinstance(trajectories, list) else []):
            steps = _get(trajectory, "steps")
            for s, step in enumerate(steps if isinstance(steps, list) else []):
                self.slots.append(TrajectorySlot(t, s, step if isinstance(step, Mapping) else {}))

    def count(self) -> int:
        """How many steps."""
        return len(self.slots)

    def rewards(self) -> list[float | None]:
        """Every step's reward, in order."""
        return [number(slot.step.get("reward")) for slot in self.slots]

    def window(self, start: int, stop: int) -> list[TrajectorySlot]:
        """Steps [start, stop)."""
        return self.slots[start:stop]


class DocumentTrace:
    """The environment events of a parsed full (or wrapped) trace."""

    def __init__(self, trace: Mapping[str, Any]) -> None:
        view = view_trace(trace)
        self.steps = view.environment_steps()
        self.time_steps = view.time_steps
        # Each event's time step: where it was placed, else (an item of the history list
        # alone) the step its metadata names, as environment_steps groups them.
        self.placed = {id(p.item): p.step_position for p in view.events}
        self.positions: dict[str, int] = {}
        for position, time_step in enumerate(view.time_steps):
            sid = _get(time_step, "step_id")
            if isinstance(sid, str):
                self.positions.setdefault(sid, position)

    def count(self) -> int:
        """How many environment events."""
        return len(self.steps)

    def rewards(self) -> list[float | None]:
        """Every environment event's reward, in order."""
        return [number(step.event.get("reward")) for step in self.steps]

    def window(self, start: int, stop: int) -> list[TraceSlot]:
        """Environment events [start, stop) with their time steps."""
        out = []
        for env in self.steps[start:stop]:
            named = _get(_get(env.event, "metadata"), "step_id")
            named = named if isinstance(named, str) else None
            position = self.placed.get(id(env.event))
            if position is None and named is not None:
                position = self.positions.get(named)
            time_step = self.time_steps[position] if position is not None else None
            sid = _get(time_step, "step_id")
            out.append(
                TraceSlot(
                    env,
                    sid if isinstance(sid, str) and sid else named,
                    position,
                    parse_datetime(_get(time_step, "timestamp")),
                )
            )
        return out


# --- from the typed tables ----------------------------------------------------------------


def _step_dict(row: Any) -> dict[str, Any]:
    step: dict[str, Any] = dict(row.extra or {})
    step.update(
        obs=row.obs,
        tool_calls=row.tool_calls,
        reward=row.reward,
        done=row.done,
        truncated=row.truncated,
        info=row.info,
    )
    return step


class TypedTrajectories:
    """The trajectory steps of a stored run, read from the `steps` table."""

    def __init__(self, session: Session, run_pk: int) -> None:
        self.session = session
        self.run_pk = run_pk
        self._ordered = (
            select(Trajectory.idx.label("traj_idx"), Step.idx.label("step_idx"))
            .join(Trajectory, Trajectory.id == Step.trajectory_pk)
            .where(Step.run_pk == run_pk)
            .order_by(Trajectory.idx, Step.idx)
        )
        self._rewards: list[float | None] | None = None

    def rewards(self) -> list[float | None]:
        """Every step's reward, in order (one query)."""
        if self._rewards is None:
            # On the Core connection: 5,000 floats do not need the ORM's row handling.
            query = select(Step.reward).join_from(
                Step, Trajectory, Trajectory.id == Step.trajectory_pk
            )
            query = query.where(Step.run_pk == self.run_pk).order_by(Trajectory.idx, Step.idx)
            self._rewards = list(self.session.connection().execute(query).scalars())
        return self._rewards

    def count(self) -> int:
        """How many steps."""
        return len(self.rewards())

    def window(self, start: int, stop: int) -> list[TrajectorySlot]:
        """Steps [start, stop): one query for the page's rows."""
        query = (
            self._ordered.add_columns(
                Step.obs, Step.tool_calls, Step.reward, Step.done, Step.truncated, Step.info
            )
            .add_columns(Step.extra)
            .offset(start)
            .limit(max(0, stop - start))
        )
        return [
            TrajectorySlot(r.traj_idx, r.step_idx, _step_dict(r))
            for r in self.session.execute(query)
        ]


# The event columns ingest projects (ingest/project.py), less the two rebuilt above them
# (`time_record`, and `metadata`, whose ORM attribute is `meta`).
_EVENT_COLUMNS = tuple(c for c in EVENT_COLUMNS if c not in ("time_record", "metadata"))


def event_dict(row: TraceEvent) -> dict[str, Any]:
    """An event as the trace held it, rebuilt from its row (keys it had no value for are
    left out; the inferred type is explicit, so it is read as it was at ingest)."""
    event: dict[str, Any] = {"event_type": row.event_type}
    event.update(row.extra or {})
    if row.time_record is not None:
        event["time_record"] = row.time_record
    if row.meta is not None:
        event["metadata"] = row.meta
    for name in _EVENT_COLUMNS:
        value = getattr(row, name)
        if value is not None:
            event[name] = value
    return event


def message_dict(row: TraceMessage) -> dict[str, Any]:
    """A message as the trace held it, rebuilt from its row."""
    extra = dict(row.extra or {})
    content = extra.pop("content", None)
    if isinstance(content, Mapping) or (content is None and (row.text or row.json_payload)):
        content = {"text": row.text, "json_payload": row.json_payload, **(content or {})}
    elif content is None and row.text is None:
        content = None
    message: dict[str, Any] = {**extra, "content": content, "message_type": row.message_type}
    message["time_record"] = {"event_time": row.event_time, "message_time": row.message_time}
    if row.meta is not None:
        message["metadata"] = row.meta
    return message


def _step_id(meta: object) -> str | None:
    sid = _get(meta, "step_id")
    return sid if isinstance(sid, str) else None


class TypedTrace:
    """The environment events of a stored full or wrapped trace, read from its rows."""

    def __init__(self, session: Session, trace_pk: int) -> None:
        self.session = session
        self.trace_pk = trace_pk
        self._env: list[Any] | None = None
        # time step pk -> (position, step_id); step_id -> first position.
        self._time_steps: dict[int, tuple[int, str | None]] | None = None
        self._positions: dict[str, int] = {}

    def _environment(self) -> list[Any]:
        if self._env is None:
            # Metadata is read only where it decides the group: events in no time step.
            loose_meta = type_coerce(
                case((TraceEvent.time_step_pk.is_(None), TraceEvent.meta)), TraceEvent.meta.type
            )
            query = (
                select(
                    TraceEvent.id,
                    TraceEvent.time_step_pk,
                    TraceEvent.reward,
                    loose_meta.label("meta"),
                )
                .where(TraceEvent.trace_pk == self.trace_pk)
                .where(TraceEvent.event_type == "environment")
                .order_by(TraceEvent.position)
            )
            self._env = list(self.session.connection().execute(query))
        return self._env

    def _steps(self) -> dict[int, tuple[int, str | None]]:
        if self._time_steps is None:
            query = (
                select(TraceTimeStep.id, TraceTimeStep.position, TraceTimeStep.step_id)
                .where(TraceTimeStep.trace_pk == self.trace_pk)
                .order_by(TraceTimeStep.position)
            )
            steps: dict[int, tuple[int, str | None]] = {}
            for row in self.session.connection().execute(query):
                steps[row.id] = (row.position, row.step_id)
                if row.step_id is not None:
                    self._positions.setdefault(row.step_id, row.position)
            self._time_steps = steps
        return self._time_steps

    def count(self) -> int:
        """How many environment events."""
        return len(self._environment())

    def rewards(self) -> list[float | None]:
        """Every environment event's reward, in order."""
        return [row.reward for row in self._environment()]

    def _group(self, time_step_pk: int | None, meta: object) -> object:
        # As TraceView.environment_steps groups items: by their time step when placed in
        # one, else by the step id their metadata names (a known step's position, or the
        # unknown id itself, which history-only items then share).
        steps = self._steps()
        if time_step_pk is not None:
            return steps[time_step_pk][0]
        sid = _step_id(meta)
        return self._positions.get(sid, sid) if sid is not None else None

    def window(self, start: int, stop: int) -> list[TraceSlot]:
        """Environment events [start, stop) with every item of their time steps."""
        wanted = self._environment()[start:stop]
        if not wanted:
            return []
        steps = self._steps()
        by_position = {position: pk for pk, (position, _sid) in steps.items()}
        groups = [self._group(row.time_step_pk, row.meta) for row in wanted]
        pks = {by_position[g] for g in groups if isinstance(g, int) and g in by_position}
        loose = {g for g in groups if isinstance(g, str)}
        # The page's time steps, and the items placed in no time step (history only), which
        # join a group by their metadata's step id: usually none.
        placed_in = or_(TraceEvent.time_step_pk.in_(pks), TraceEvent.time_step_pk.is_(None))
        events = self.session.scalars(
            select(TraceEvent)
            .where(and_(TraceEvent.trace_pk == self.trace_pk, placed_in))
            .order_by(TraceEvent.position)
        ).all()
        message_placed_in = or_(
            TraceMessage.time_step_pk.in_(pks), TraceMessage.time_step_pk.is_(None)
        )
        messages = self.session.scalars(
            select(TraceMessage)
            .where(and_(TraceMessage.trace_pk == self.trace_pk, message_placed_in))
            .order_by(TraceMessage.position)
        ).all()
        timestamps: dict[int, datetime | None] = dict(
            self.session.execute(
                select(TraceTimeStep.id, TraceTimeStep.timestamp).where(TraceTimeStep.id.in_(pks))
            ).all()
        )
        wanted_groups = {g for g in groups if g is not None} | loose
        group_events: dict[object, list[tuple[dict[str, Any], bool, int]]] = {}
        by_id: dict[int, dict[str, Any]] = {}
        for row in events:
            item = event_dict(row)
            by_id[row.id] = item
            key = self._group(row.time_step_pk, row.meta)
            if key in wanted_groups:
                group_events.setdefault(key, []).append(
                    (item, infer_event_type(item) == "environment", row.id)
                )
        group_messages: dict[object, list[dict[str, Any]]] = {}
        for message_row in messages:
            key = self._group(message_row.time_step_pk, message_row.meta)
            if key in wanted_groups:
                group_messages.setdefault(key, []).append(message_dict(message_row))
        out: list[TraceSlot] = []
        for row, key in zip(wanted, groups, strict=True):
            event = by_id.get(row.id)
            if event is None:  # placed in a time step the query above read
                event = event_dict(self.session.get_one(TraceEvent, row.id))
            sid = _step_id(event.get("metadata"))
            step_pk = row.time_step_pk
            if step_pk is None and isinstance(key, int):
                step_pk = by_position.get(key)
            time_step = steps.get(step_pk) if step_pk is not None else None
            if key is None:
                env = EnvStep(event, time_step_tool_calls((), (event,)))
            else:
                others = [
                    e for e, is_env, pk in group_events.get(key, ()) if pk == row.id or not is_env
                ]
                found = tuple(group_messages.get(key, ()))
                lm_events = tuple(
                    e
                    for e, _is_env, pk in group_events.get(key, ())
                    if pk != row.id and infer_event_type(e) == "lm_call"
                )
                env = EnvStep(event, time_step_tool_calls(found, others), found, lm_events)
            out.append(
                TraceSlot(
                    env,
                    time_step[1] if time_step is not None and time_step[1] else sid,
                    time_step[0] if time_step is not None else None,
                    timestamps.get(step_pk) if step_pk is not None else None,
                )
            )
        return out


def pair(
    trajectories: Sequence[TrajectorySlot], trace: Sequence[TraceSlot], start: int, stop: int
) -> list[tuple[int, TrajectorySlot | None, TraceSlot | None]]:
    """(position, trajectory slot, trace slot) for positions [start, stop) of two windows
    that both start at `start` (a side shorter than the page has None past its end)."""
    return [
        (
            position,
            trajectories[position - start] if position - start < len(trajectories) else None,
            trace[position - start] if position - start < len(trace) else None,
        )
        for position in range(start, stop)
    ]
