"""The write half of ingest: a prepared rollout's rows into the store, and its answer.

Ingest (tracestore.ingest) parses, validates and projects a document outside any
transaction (`Prepared`); this module writes prepared rollouts inside the caller's
transaction: `store_one` in a savepoint of its own, `store_many` with one bulk write per
table for the new ones. A run_id already stored is answered `duplicate` (the same
content: the same bytes, or the same JSON value compared exactly) or `conflict`, writing
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, cast

from sqlalchemy import Connection, Table, insert, select, text
from sqlalchemy.exc import IntegrityError

from tracestore.db.bulk import (
    allocate_ids,
    allocate_ids_many,
    bulk_insert,
    bulk_insert_all,
    open_write,
    undo_write,
)
from tracestore.db.types import pg_safe
from tracestore.errors import Conflict, TracestoreError
from tracestore.jsontext import loads_exact
from tracestore.models import (
    Run,
    RunDocument,
    Step,
    Trace,
    TraceEvent,
    TraceMessage,
    TraceTimeStep,
    Trajectory,
)
from tracestore.store.documents import DOCUMENT_ENCODING, compress_document, decompress_document
from tracestore.store.drift import DriftRows, drift_writes
from tracestore.wire.datetimes import with_instants

Status = Literal["created", "duplicate", "conflict", "invalid"]
_MISSING = object()


@dataclass(slots=True)
class TraceRows:
    """Rows of one trace: the trace row, its time steps, events and messages."""

    trace: dict[str, Any]
    time_steps: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    # time-step position of each event / message (None when in no step), for pk wiring.
    event_steps: list[int | None] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    message_steps: list[int | None] = field(default_factory=list)


@dataclass(slots=True)
class RolloutRows:
    """Every row one rollout becomes."""

    run: dict[str, Any]
    trajectories: list[dict[str, Any]]
    steps: list[list[dict[str, Any]]]  # per trajectory
    traces: list[TraceRows]


@dataclass(slots=True)
class IngestResult:
    """The outcome of ingesting one rollout."""

    run_id: str | None
    status: Status
    correlation_id: str | None = None
    correlation_source: str | None = None
    trace_kind: str | None = None
    n_steps: int = 0
    error: TracestoreError | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The API's body for this outcome (the error shape's fields under `error`)."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "status": self.status,
            "correlation_id": self.correlation_id,
            "correlation_source": self.correlation_source,
            "trace_kind": self.trace_kind,
        }
        if self.error is not None:
            out["error"] = {"code": self.error.code, "message": self.error.message}
            out["error"].update(self.error.details)
        return out


@dataclass(slots=True)
class Prepared:
    """A rollout checked and projected, ready to be written."""

    doc: dict[str, Any]
    raw: bytes
    digest: str
    rows: RolloutRows
    drift: DriftRows  # computed before the transaction (tracestore.drift.rows)


def _differing_parts(stored: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = list(dict.fromkeys([*stored, *new]))
    return [k for k in keys if stored.get(k, _MISSING) != new.get(k, _MISSING)]


def _table(model: Any) -> Table:
    table: Table = model.__table__
    return table


# Core tables and prebuilt statements: ingest is the hot path, and Core executemany skips
# the ORM's per-row bookkeeping (we never need the ORM objects here).
RUNS = _table(Run)
DOCUMENTS = _table(RunDocument)
TRAJECTORIES = _table(Trajectory)
STEPS = _table(Step)
TRACES = _table(Trace)
TIME_STEPS = _table(TraceTimeStep)
EVENTS = _table(TraceEvent)
MESSAGES = _table(TraceMessage)
_FIND_RUN = select(
    RUNS.c.id,
    RUNS.c.content_hash,
    RUNS.c.correlation_id,
    RUNS.c.correlation_source,
    RUNS.c.trace_kind,
)


class _StoredRun(NamedTuple):
    """A stored run as a chunk's look-up finds it (the columns of _FIND_RUN, and run_id)."""

    id: int
    content_hash: str
    correlation_id: str | None
    correlation_source: str | None
    trace_kind: str | None
    run_id: str


# A chunk's run_ids looked up at once, on the driver (db/bulk.py `open_write`): on
# PostgreSQL as one array (one statement text whatever the chunk's size).
_FIND_RUNS_SQL = f"SELECT {', '.join(_StoredRun._fields)} FROM runs WHERE run_id "
_INSERT_TRACE = insert(TRACES).returning(TRACES.c.id)
# The highest ingest sequence given so far on SQLite, deleted runs' included: else a run
# stored after the newest was deleted would reuse its sequence, one a lake export has
# already passed (SQLite's two-argument max() is a scalar).
MAX_INGEST_SEQ_SQL = (
    "SELECT max(coalesce((SELECT max(ingest_seq) FROM runs), 0), "
    "coalesce((SELECT max(ingest_seq) FROM run_deletions), 0))"
)
MAX_INGEST_SEQ = text(MAX_INGEST_SEQ_SQL)
# PostgreSQL: the look-up, and the keys of the rollouts it does not find, in one statement
# (in the pipeline of db/bulk.py `open_write`), where the keys took a round trip of their
# own after it. One statement: the keys are counted from the very rows the look-up found
# (one snapshot), and `runs` is read once. Each found run is a row (-1, its columns); each
# key a row (its table's place in `_wanted`, the key, NULLs). Counted from the chunk's
# run_ids not found (each id's first rollout, as `_store_many` writes it) and their rows
# per table: a sequence's value is taken for good, and keys taken for a stored run_id would
# give the same posts other keys than on SQLite (tests/reports/test_identical.py).
_KEYED = (RUNS.name, TRAJECTORIES.name, TRACES.name, TIME_STEPS.name)  # as _wanted's
_FIND_AND_KEY_PG = (
    f"WITH found AS MATERIALIZED ({_FIND_RUNS_SQL}= ANY(%(ids)s)), "
    "fresh AS (SELECT DISTINCT ON (u.run_id) u.n1, u.n2, u.n3 "
    "FROM unnest(%(ids)s::text[], %(n1)s::int8[], %(n2)s::int8[], %(n3)s::int8[]) "
    "WITH ORDINALITY AS u(run_id, n1, n2, n3, ord) "
    "WHERE NOT EXISTS (SELECT FROM found WHERE found.run_id = u.run_id) "
    "ORDER BY u.run_id, u.ord), "
    "wanted AS (SELECT count(*) AS n0, coalesce(sum(n1), 0) AS n1, "
    "coalesce(sum(n2), 0) AS n2, coalesce(sum(n3), 0) AS n3 FROM fresh) "
    f"SELECT -1, {', '.join(_StoredRun._fields)} FROM found"
    + "".join(
        f" UNION ALL SELECT {i}, nextval(pg_get_serial_sequence('{table}', 'id')), "
        + ", ".join(["NULL"] * (len(_StoredRun._fields) - 1))
        + f" FROM generate_series(1, (SELECT n{i} FROM wanted))"
        for i, table in enumerate(_KEYED)
    )
)
_RECEIVED = {
    "origin": "received",
    "converter": None,
    "converter_version": None,
    "source_hash": None,
}


def _existing(conn: Connection, prepared: Prepared) -> IngestResult | None:
    run = conn.execute(_FIND_RUN.where(RUNS.c.run_id == prepared.doc["run_id"])).first()
    return None if run is None else _answer_existing(conn, prepared, run)


def _answer_existing(conn: Connection, prepared: Prepared, run: Any) -> IngestResult:
    """`duplicate` or `conflict` for a rollout whose run_id is stored as `run`."""
    rows = prepared.rows.run
    duplicate = IngestResult(
        run_id=prepared.doc["run_id"],
        status="duplicate",
        correlation_id=run.correlation_id,
        correlation_source=run.correlation_source,
        trace_kind=run.trace_kind,
        n_steps=rows["n_steps"],
    )
    if run.content_hash == prepared.digest:
        return duplicate
    doc_row = conn.execute(
        select(DOCUMENTS.c.body, DOCUMENTS.c.encoding).where(DOCUMENTS.c.run_pk == run.id)
    ).one()
    # Compared exactly: through floats, 30-digit integers that differ in the last digit
    # (or 1e-400 and 0) would look equal and other content would pass as a duplicate.
    stored = loads_exact(decompress_document(doc_row.body, doc_row.encoding))
    posted = loads_exact(prepared.raw)
    parts = _differing_parts(stored, posted)
    if parts:
        # One instant written in another of its forms (an ISO string where the task app
        # wrote a Python repr, SPEC §2), in a datetime member, is the same rollout posted
        # again; anywhere else such text is compared as text.
        parts = _differing_parts(
            {k: with_instants(stored[k], k) for k in parts if k in stored},
            {k: with_instants(posted[k], k) for k in parts if k in posted},
        )
    if not parts:
        return duplicate  # the same JSON value, spelled differently
    error = Conflict(
        f"run_id {prepared.doc['run_id']!r} was already stored with other content; "
        f"differing top-level parts: {', '.join(parts)}",
        run_id=prepared.doc["run_id"],
        differing_parts=parts,
    )
    return IngestResult(
        run_id=prepared.doc["run_id"],
        status="conflict",
        correlation_id=rows["correlation_id"],
        correlation_source=rows["correlation_source"],
        trace_kind=rows["trace_kind"],
        error=error,
    )


def _trace_children(
    out: dict[Table, list[dict[str, Any]]],
    trace: TraceRows,
    trace_pk: int,
    run_pk: int,
    step_pks: Iterator[int],
) -> None:
    """Append a trace's time-step, event and message rows to `out`, keys wired."""
    by_position: dict[Any, int] = {}
    for ts in trace.time_steps:
        by_position[ts["position"]] = pk = next(step_pks)
        out[TIME_STEPS].append(dict(ts, id=pk, trace_pk=trace_pk))
    out[EVENTS].extend(
        dict(e, trace_pk=trace_pk, run_pk=run_pk, time_step_pk=by_position.get(at))
        for e, at in zip(trace.events, trace.event_steps, strict=True)
    )
    out[MESSAGES].extend(
        dict(m, trace_pk=trace_pk, run_pk=run_pk, time_step_pk=by_position.get(at))
        for m, at in zip(trace.messages, trace.message_steps, strict=True)
    )


def write_trace(
    conn: Connection, run_pk: int, trace: TraceRows, provenance: dict[str, Any] | None = None
) -> int:
    """Insert one trace's rows (trace, time steps, events, messages); returns its key.

    `provenance` (origin, converter, converter_version, source_hash) marks a trace that
    tracestore converted rather than received.
    """
    trace_row = dict(trace.trace, run_pk=run_pk, **(provenance or _RECEIVED))
    # Through SQLAlchemy (one row): a unique violation on the run-level trace index must
    # surface as IntegrityError for backfill's savepoint.
    trace_pk: int = conn.execute(_INSERT_TRACE, trace_row).scalar_one()
    out: dict[Table, list[dict[str, Any]]] = {TIME_STEPS: [], EVENTS: [], MESSAGES: []}
    step_pks = iter(allocate_ids(conn, TIME_STEPS, len(trace.time_steps)))
    _trace_children(out, trace, trace_pk, run_pk, step_pks)
    for table, table_rows in out.items():  # time steps before the rows that point at them
        bulk_insert(conn, table, table_rows)
    return trace_pk


def store_one(conn: Connection, prepared: Prepared) -> IngestResult:
    """Store a prepared rollout in the caller's transaction, in a savepoint of its own.

    Returns `duplicate` or `conflict` (writing nothing) when the run_id is already stored.
    """
    taken: Exception | None = None
    for _attempt in range(3):
        existing = _existing(conn, prepared)
        if existing is not None:
            return existing
        try:
            # The savepoint makes the rollout all-or-nothing inside a larger transaction.
            with conn.begin_nested():
                write_many(conn, [prepared], datetime.now(UTC))
        except IntegrityError as exc:
            # A concurrent transaction stored the same run_id between our check and our
            # insert; only our savepoint was undone. Check again: duplicate or conflict.
            taken = exc
            continue
        return _created(prepared)
    raise RuntimeError("run_id kept colliding with concurrent inserts") from taken


def _created(prepared: Prepared) -> IngestResult:
    run = prepared.rows.run
    return IngestResult(
        run_id=run["run_id"],
        status="created",
        correlation_id=run["correlation_id"],
        correlation_source=run["correlation_source"],
        trace_kind=run["trace_kind"],
        n_steps=run["n_steps"],
    )


def _ingest_seqs(conn: Connection, n: int) -> list[int]:
    """The runs' ingest sequence (issue 15), where it is assigned at write time.

    Targeted edit for the lake export (tracestore/reports/watermark.py reads it). On
    SQLite: max + 1 onwards, which is commit-ordered because this transaction holds the
    single write lock until it commits (as allocate_ids relies on for keys). On
    PostgreSQL nothing here: the column's default is the writing transaction's id.
    """
    if conn.dialect.name != "sqlite" or n == 0:
        return []
    start = conn.execute(MAX_INGEST_SEQ).scalar_one()
    return list(range(start + 1, start + 1 + n))


def _wanted(items: Sequence[Prepared]) -> list[tuple[Table, int]]:
    """The keys `items` take, per table (runs, trajectories, traces, time steps)."""
    return [
        (RUNS, len(items)),
        (TRAJECTORIES, sum(len(p.rows.trajectories) for p in items)),
        (TRACES, sum(len(p.rows.traces) for p in items)),
        (TIME_STEPS, sum(len(t.time_steps) for p in items for t in p.rows.traces)),
    ]


def write_many(
    conn: Connection,
    items: Sequence[Prepared],
    received_at: datetime,
    keys: Sequence[Sequence[int]] | None = None,
    seq_start: int | None = None,
) -> None:
    """Insert every row of several new rollouts: one bulk write per table for all of them.

    Keys are allocated up front for the whole set, so a table is written once per batch
    instead of once per rollout (on PostgreSQL, where the small tables share one round
    trip: db/bulk.py). `keys` (per table of `_wanted`, at least as many as `items` take)
    and `seq_start` (SQLite's last ingest sequence) when the caller allocated them
    (db/bulk.py `open_write`, on SQLite).
    """
    if keys is None:
        keys = allocate_ids_many(conn, _wanted(items))
        seqs = _ingest_seqs(conn, len(items))
    else:
        seqs = [] if seq_start is None else list(range(seq_start + 1, seq_start + 1 + len(items)))
    run_pks, traj_keys, trace_keys, ts_keys = keys
    run_pks = run_pks[: len(items)]
    traj_pks, trace_pks, ts_pks = iter(traj_keys), iter(trace_keys), iter(ts_keys)
    out: dict[Table, list[dict[str, Any]]] = {
        t: [] for t in (RUNS, DOCUMENTS, TRAJECTORIES, STEPS, TRACES, TIME_STEPS, EVENTS, MESSAGES)
    }
    for i, (prepared, run_pk) in enumerate(zip(items, run_pks, strict=True)):
        rows = prepared.rows
        run_row = dict(
            rows.run,
            id=run_pk,
            received_at=received_at,
            content_hash=prepared.digest,
            doc_bytes=len(prepared.raw),
        )
        if seqs:
            run_row["ingest_seq"] = seqs[i]
        out[RUNS].append(run_row)
        out[DOCUMENTS].append(
            {
                "run_pk": run_pk,
                "encoding": DOCUMENT_ENCODING,
                "body": compress_document(prepared.raw),
            }
        )
        for traj, steps in zip(rows.trajectories, rows.steps, strict=True):
            traj_pk = next(traj_pks)
            out[TRAJECTORIES].append(dict(traj, id=traj_pk, run_pk=run_pk))
            out[STEPS].extend(dict(s, run_pk=run_pk, trajectory_pk=traj_pk) for s in steps)
        for trace in rows.traces:
            trace_pk = next(trace_pks)
            out[TRACES].append(dict(trace.trace, id=trace_pk, run_pk=run_pk, **_RECEIVED))
            _trace_children(out, trace, trace_pk, run_pk, ts_pks)
    # Parents before children: the foreign keys are checked row by row. The drift rows
    # with them: on PostgreSQL the small tables go in one round trip (db/bulk.py).
    drift = drift_writes([(pk, p.drift) for pk, p in zip(run_pks, items, strict=True)])
    bulk_insert_all(conn, [*out.items(), *drift])


def store_many(conn: Connection, chunk: Sequence[Prepared]) -> list[IngestResult]:
    """Store several prepared rollouts in the caller's transaction, each standing alone.

    Fast path: the run_ids are looked up at once and the new rollouts written together
    (write_many) after one savepoint (db/bulk.py `open_write`: on PostgreSQL the look-up
    and the savepoint are one round trip). If that fails on a constraint (another
    transaction stored one of the run_ids meanwhile), the savepoint is undone and each
    rollout goes through store_one, in a savepoint of its own. A run_id twice in one
    chunk: the later ones also take that path, so they see the first one's row. Any other
    error is raised (the caller's transaction holds what was written before it).
    """
    # Not isolating, every error is raised: the outcomes are all results.
    return cast("list[IngestResult]", _store_many(conn, chunk, isolate=False))


def store_each(conn: Connection, chunk: Sequence[Prepared]) -> list[IngestResult | Exception]:
    """As store_many, but whatever fails is one rollout's own: when the fast path fails
    for any reason, each rollout is stored alone in a savepoint of its own, and one whose
    write fails gets its error as its outcome while the others are stored. What group
    commit needs (ingest/group.py). A lost connection is no rollout's own: it raises."""
    return _store_many(conn, chunk, isolate=True)


def _store_many(
    conn: Connection, chunk: Sequence[Prepared], *, isolate: bool
) -> list[IngestResult | Exception]:
    ids = [p.doc["run_id"] for p in chunk]
    # The look-up and the savepoint of the write together (one round trip on PostgreSQL);
    # on SQLite the keys too, for the whole chunk (a stored run_id's go unused).
    wanted: list[tuple[Table, int]] = []  # PostgreSQL's keys come with the look-up
    postgresql = conn.dialect.name == "postgresql"
    # On PostgreSQL the ids as stored and as the look-up compares them (NUL-safe).
    safe = [pg_safe(i) for i in ids] if postgresql else ids
    if postgresql:
        reads: list[tuple[str, Any]] = [
            (
                _FIND_AND_KEY_PG,
                {
                    "ids": safe,
                    "n1": [len(p.rows.trajectories) for p in chunk],
                    "n2": [len(p.rows.traces) for p in chunk],
                    "n3": [sum(len(t.time_steps) for t in p.rows.traces) for p in chunk],
                },
            )
        ]
    else:
        marks = ", ".join("?" * len(ids))
        reads = [(f"{_FIND_RUNS_SQL}IN ({marks})", ids), (MAX_INGEST_SEQ_SQL, ())]
        wanted = _wanted(chunk)
    rows, keys = open_write(conn, reads, wanted)
    seq_start = None
    if postgresql:
        found = {}
        keys = [[] for _ in _KEYED]
        for kind, *row in rows[0]:
            if kind < 0:
                found[row[-1]] = _StoredRun(*row)
            else:
                keys[kind].append(row[0])
    else:
        found = {r[-1]: _StoredRun(*r) for r in rows[0]}
        seq_start = rows[1][0][0]
    results: list[IngestResult | None] = [None] * len(chunk)
    fresh: dict[str, int] = {}
    # As the keys' statement counted them: a key for each id it did not find.
    for i, (run_id, prepared) in enumerate(zip(safe, chunk, strict=True)):
        if run_id in found:
            if not isolate:
                results[i] = _answer_existing(conn, prepared, found[run_id])
            # Isolating, a stored run_id is answered alone below, in a savepoint: reading
            # and comparing its document may fail (the run deleted meanwhile, say), and
            # that failure is this rollout's alone.
        elif run_id not in fresh:
            fresh[run_id] = i
    if fresh:
        try:
            # SQLite's keys were allocated for the chunk in its order: the fresh ones are
            # written with the first of them (write_many takes what it needs).
            items = [chunk[i] for i in fresh.values()]
            write_many(conn, items, datetime.now(UTC), keys, seq_start)
        except IntegrityError:
            undo_write(conn)  # the slow path below decides each one
        except Exception:
            if not isolate or conn.invalidated:
                # A lost connection is every rollout's failure, not one's: the caller
                # answers it as SQLAlchemy's error (503), nothing of the group committed.
                raise
            # Undone, and nothing else was written: each one alone below.
            undo_write(conn)
        else:
            for i in fresh.values():
                results[i] = _created(chunk[i])
    out: list[IngestResult | Exception] = []
    for result, prepared in zip(results, chunk, strict=True):
        if result is not None:
            out.append(result)
        elif not isolate:
            out.append(store_one(conn, prepared))
        else:
            try:
                # Its own savepoint around store_one's: a failing read (not only a write)
                # leaves the transaction usable for the others.
                with conn.begin_nested():
                    out.append(store_one(conn, prepared))
            except Exception as exc:
                if conn.invalidated:
                    raise  # the connection was lost: as above, the whole group's failure
                out.append(exc)
    return out
