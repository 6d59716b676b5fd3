"""Run look-ups: a document by run_id, summaries by filters and by correlation id."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    BindParameter,
    Select,
    bindparam,
    cast,
    literal_column,
    null,
    select,
    union,
    union_all,
)
from sqlalchemy.orm import Session

from tracestore.correlation import lookup_forms
from tracestore.db.types import pg_safe
from tracestore.errors import InvalidRequest, NotFound
from tracestore.models import Run, RunDocument, Trajectory
from tracestore.models.drift import DriftFinding
from tracestore.store.documents import decompress_document, load_document
from tracestore.store.drift import drift_kinds_for, has_drift_clause, kinds_by_run
from tracestore.timewindow import check_order
from tracestore.wire.trace import TRACE_KINDS

# A run stored without a trace has a null trace_kind: the filter spells it `null`, as the
# rollout's summary shows it.
NO_TRACE = "null"
FILTER_TRACE_KINDS = (*TRACE_KINDS, NO_TRACE)

MAX_LIMIT = 1000
# Keys are 64-bit on both databases: a cursor naming a larger one is not one we issued
# (and binding it would fail in the driver).
KEY_LIMIT = 2**63
SUMMARY_COLUMNS = (
    Run.id,
    Run.run_id,
    Run.correlation_id,
    Run.correlation_source,
    Run.received_at,
    Run.trace_kind,
    Run.n_trajectories,
    Run.n_steps,
    Run.n_events,
    Run.n_messages,
    Run.mean_return,
    Run.aborted,
    Run.doc_bytes,
    Run.env_id,
    Run.policy_id,
    Run.n_trace_steps,
)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Filters of GET /v1/rollouts (every one optional)."""

    correlation_id: str | None = None
    env_id: str | None = None
    policy_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    trace_kind: str | None = None
    has_trajectories: bool | None = None
    has_drift: bool | None = None

    def __post_init__(self) -> None:
        # A mistyped kind (`FULL`, `bogus`) selected no run without a word: an empty list,
        # an empty dataset refused as such, a report over nothing.
        if self.trace_kind is not None and self.trace_kind not in FILTER_TRACE_KINDS:
            raise InvalidRequest(
                f"trace_kind is one of {', '.join(FILTER_TRACE_KINDS)}, not {self.trace_kind!r}",
                trace_kind=self.trace_kind,
            )
        # Refused as the reports refuse it: the list, datasets and the inspector gave
        # nothing without a word.
        check_order(self.since, self.until)


# The look-ups' statements are built once and executed with parameters on the session's
# Core connection: building the expression and the ORM execution layer cost more than
# the indexed SELECT itself (bench/README.md).
_IDS_OF_RUNS = (
    select(Trajectory.run_pk, Trajectory.env_id, Trajectory.policy_id)
    .where(Trajectory.run_pk.in_(bindparam("pks", expanding=True)))
    .order_by(Trajectory.run_pk, Trajectory.idx)
)


def get_document(session: Session, run_id: str) -> bytes:
    """The rollout exactly as received (raw JSON bytes); NotFound when absent."""
    return load_document(session.connection(), run_id)


_DOCUMENT_AND_TRAJECTORIES = (
    select(RunDocument.body, RunDocument.encoding, Run.n_trajectories)
    .join(Run, Run.id == RunDocument.run_pk)
    .where(Run.run_id == bindparam("run_id"))
)


def get_document_read(session: Session, run_id: str) -> tuple[bytes, bool]:
    """The rollout as received and whether it has trajectories (reading it whole is then
    a legacy read: `drift.reads.has_trajectories`), in one statement; NotFound when
    absent."""
    row = session.connection().execute(_DOCUMENT_AND_TRAJECTORIES, {"run_id": run_id}).first()
    if row is None:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    return decompress_document(row.body, row.encoding), bool(row.n_trajectories)


def encode_cursor(last_pk: int) -> str:
    """An opaque keyset cursor after the run with primary key `last_pk`."""
    return base64.urlsafe_b64encode(orjson.dumps({"v": 1, "before": last_pk})).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The primary key a cursor points after; InvalidRequest for anything else."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        before = data["before"]
        if data.get("v") != 1 or type(before) is not int or not 0 <= before < KEY_LIMIT:
            raise ValueError
        return before
    except (ValueError, KeyError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise InvalidRequest("cursor is not one this service issued", cursor=cursor) from None


def runs_of_cid(cid: str | BindParameter[str]) -> Any:
    """Keys of the runs whose canonical or per-trajectory cid is `cid`.

    A UNION of two index look-ups: written as `a OR b IN (...)`, PostgreSQL cannot use
    either index and scans every run.
    """
    return union(
        select(Run.id).where(Run.correlation_id == cid),
        select(Trajectory.run_pk).where(Trajectory.correlation_id == cid),
    )


def filtered(query: Select[*tuple[Any, ...]], f: RunFilter) -> Select[*tuple[Any, ...]]:
    if f.correlation_id is not None:
        query = query.where(Run.id.in_(runs_of_cid(f.correlation_id)))
    # A run's own env / policy (its first trajectory's, else its trace's: runs without
    # trajectories have only that) or any trajectory's: a UNION of index look-ups, as above.
    if f.env_id is not None:
        query = query.where(
            Run.id.in_(
                union(
                    select(Run.id).where(Run.env_id == f.env_id),
                    select(Trajectory.run_pk).where(Trajectory.env_id == f.env_id),
                )
            )
        )
    if f.policy_id is not None:
        query = query.where(
            Run.id.in_(
                union(
                    select(Run.id).where(Run.policy_id == f.policy_id),
                    select(Trajectory.run_pk).where(Trajectory.policy_id == f.policy_id),
                )
            )
        )
    if f.since is not None:
        query = query.where(Run.received_at >= f.since)
    if f.until is not None:
        query = query.where(Run.received_at < f.until)
    if f.trace_kind == NO_TRACE:
        query = query.where(Run.trace_kind.is_(None))
    elif f.trace_kind is not None:
        query = query.where(Run.trace_kind == f.trace_kind)
    if f.has_trajectories is not None:
        query = query.where(
            Run.n_trajectories > 0 if f.has_trajectories else Run.n_trajectories == 0
        )
    if f.has_drift is not None:
        query = query.where(has_drift_clause(f.has_drift))
    return query


def _step_source(row: Any) -> str:
    """Where a run's decision steps come from, as reports/views.sql decides it."""
    if row.n_steps == 0 and row.trace_kind in ("full", "wrapped"):
        return "trace"
    return "trajectory"


def _summaries(session: Session, rows: list[Any]) -> list[dict[str, Any]]:
    pks = [r.id for r in rows]
    kinds = drift_kinds_for(session, pks)
    ids = list(session.connection().execute(_IDS_OF_RUNS, {"pks": pks})) if pks else []
    return _summaries_of(rows, ids, kinds)


def _summaries_of(
    rows: list[Any], ids: list[Any], kinds: dict[int, list[str]]
) -> list[dict[str, Any]]:
    """The summaries of `rows` (SUMMARY_COLUMNS), given their trajectories' env and policy
    ids (`(run_pk, env_id, policy_id)` in trajectory order) and their drift kinds."""
    envs: dict[int, list[str]] = {}
    policies: dict[int, list[str]] = {}
    for run_pk, env_id, policy_id in ids:
        if env_id is not None and env_id not in envs.setdefault(run_pk, []):
            envs[run_pk].append(env_id)
        if policy_id is not None and policy_id not in policies.setdefault(run_pk, []):
            policies[run_pk].append(policy_id)
    for r in rows:
        # The run's own (a trace-only run's come from its trace), after its trajectories'.
        if r.env_id is not None and r.env_id not in envs.setdefault(r.id, []):
            envs[r.id].append(r.env_id)
        if r.policy_id is not None and r.policy_id not in policies.setdefault(r.id, []):
            policies[r.id].append(r.policy_id)
    return [
        {
            "run_id": r.run_id,
            "correlation_id": r.correlation_id,
            "correlation_source": r.correlation_source,
            "received_at": r.received_at,
            "trace_kind": r.trace_kind,
            "n_trajectories": r.n_trajectories,
            # Decision steps: trajectory steps, or for a run without any, the environment
            # events of its trace (as the reports count them).
            "n_steps": r.n_steps or r.n_trace_steps,
            "step_source": _step_source(r),
            "n_events": r.n_events,
            "n_messages": r.n_messages,
            "env_ids": envs.get(r.id, []),
            "policy_ids": policies.get(r.id, []),
            "mean_return": r.mean_return,
            "aborted": r.aborted,
            "doc_bytes": r.doc_bytes,
            "drift_kinds": kinds.get(r.id, []),
        }
        for r in rows
    ]


def list_runs(
    session: Session, f: RunFilter, limit: int = 100, cursor: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Run summaries, newest first, one keyset page; returns (items, next_cursor)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}", limit=limit)
    # Newest first by primary key: it increases with arrival, is unique (a total order
    # for keyset paging) and is the clustered key on SQLite.
    query = filtered(select(*SUMMARY_COLUMNS), f).order_by(Run.id.desc()).limit(limit + 1)
    if cursor is not None:
        query = query.where(Run.id < decode_cursor(cursor))
    rows = list(session.execute(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return _summaries(session, rows), (encode_cursor(rows[-1].id) if more else None)


def _cid_lookup(n_forms: int) -> Any:
    """The whole look-up by correlation id as one statement, for `n_forms` forms (bound as
    form0, form1, ...).

    `matched` holds (stored cid, run key) for every form looked up: the runs whose
    canonical or per-trajectory cid it is (a UNION of index look-ups, as runs_of_cid).
    Three parts follow, told apart by `part` and sorted for the caller: 0, the summary
    columns of each matched run (with the cid that matched it; newest first); 1, the env
    and policy ids of their trajectories (in trajectory order); 2, their distinct drift
    kinds. One statement is one round trip and, on both databases, one snapshot. The
    forms are plain parameters, one statement per count: an expanding IN would be
    rendered anew at every execution (0.3 ms, more than the query takes).
    """
    forms = [bindparam(f"form{i}", type_=Run.correlation_id.type) for i in range(n_forms)]

    def named(column: Any) -> Any:
        return column == forms[0] if n_forms == 1 else column.in_(forms)

    matched = union(
        select(Run.correlation_id.label("cid"), Run.id.label("pk")).where(
            named(Run.correlation_id)
        ),
        select(Trajectory.correlation_id.label("cid"), Trajectory.run_pk.label("pk")).where(
            named(Trajectory.correlation_id)
        ),
    ).cte("matched")
    keys = select(matched.c.pk).scalar_subquery()
    # Typed NULLs: PostgreSQL must know every column's type in each part.
    pad = {c.key: cast(null(), c.type) for c in SUMMARY_COLUMNS}
    summary = [c.label(c.key) for c in SUMMARY_COLUMNS]

    def row(part: int, cid: Any, idx: Any, kind: Any, **columns: Any) -> list[Any]:
        values = {**pad, **columns}
        return [
            literal_column(str(part)).label("part"),
            cid.label("cid"),
            *(values[c.key].label(c.key) for c in SUMMARY_COLUMNS),
            idx.label("idx"),
            kind.label("kind"),
        ]

    runs = select(
        literal_column("0").label("part"),
        matched.c.cid,
        *summary,
        cast(null(), Trajectory.idx.type).label("idx"),
        cast(null(), DriftFinding.kind.type).label("kind"),
    ).join_from(matched, Run, Run.id == matched.c.pk)
    trajectories = select(
        *row(
            1,
            cast(null(), Run.correlation_id.type),
            Trajectory.idx,
            cast(null(), DriftFinding.kind.type),
            id=Trajectory.run_pk,
            env_id=Trajectory.env_id,
            policy_id=Trajectory.policy_id,
        )
    ).where(Trajectory.run_pk.in_(keys))
    kinds = (
        select(
            *row(
                2,
                cast(null(), Run.correlation_id.type),
                cast(null(), Trajectory.idx.type),
                DriftFinding.kind,
                id=DriftFinding.run_pk,
            )
        )
        .where(DriftFinding.run_pk.in_(keys))
        .distinct()
    )
    everything = union_all(runs, trajectories, kinds)
    columns = everything.selected_columns
    return everything.order_by(columns.part, columns.id.desc(), columns.idx)


# lookup_forms gives one id, or two (the id and the one it names before a '/'): built
# once; any other count when first asked for.
_BY_CID_FORMS = {n: _cid_lookup(n) for n in (1, 2)}


def runs_by_correlation(session: Session, cid: str) -> tuple[str, list[dict[str, Any]]]:
    """The stored id that `cid` matched and its runs: those whose canonical or
    per-trajectory cid it is (NotFound when none).

    `cid` itself is tried first, then the id a URL value written as synth-ai's extractor
    reads it names (`correlation.lookup_forms`): the first form that has runs is the
    answer. Every form is looked up in the same statement (`_cid_lookup`).
    """
    forms = lookup_forms(cid)
    statement = _BY_CID_FORMS.get(len(forms))
    if statement is None:
        statement = _BY_CID_FORMS.setdefault(len(forms), _cid_lookup(len(forms)))
    parameters = {f"form{i}": form for i, form in enumerate(forms)}
    rows = session.connection().execute(statement, parameters).all()
    runs_of: dict[str, list[Any]] = {}
    for r in rows:
        if r.part == 0:
            runs_of.setdefault(r.cid, []).append(r)
    # On PostgreSQL the typed columns hold a NUL as U+2400 (db/types.py): a cid with a NUL
    # comes back so, and was not found under its own text.
    stored_form = pg_safe if session.get_bind().dialect.name == "postgresql" else str
    for form in forms:
        runs = runs_of.get(stored_form(form))
        if runs:
            # The other parts hold the runs of every form: keep this form's.
            pks = {r.id for r in runs}
            ids = [(r.id, r.env_id, r.policy_id) for r in rows if r.part == 1 and r.id in pks]
            kinds = kinds_by_run((r.id, r.kind) for r in rows if r.part == 2 and r.id in pks)
            return form, _summaries_of(runs, ids, kinds)
    raise NotFound(f"no rollout has correlation id {cid!r}", correlation_id=cid)


def run_summary(session: Session, run_id: str) -> dict[str, Any]:
    """The summary of one run, as the list gives it (NotFound when absent)."""
    rows = list(session.execute(select(*SUMMARY_COLUMNS).where(Run.run_id == run_id)))
    if not rows:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    return _summaries(session, rows)[0]
