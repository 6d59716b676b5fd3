"""Look-ups by correlation id and run_id: one statement each, no BEGIN/ROLLBACK on PostgreSQL.

The answers are checked against the list route's own statements (`list_runs` filtered by
the same id), which the look-up used to run one by one; the statements a look-up sends
are read from the wire (libpq's trace of the connection, tests/pgwire.py) on PostgreSQL, and from
SQLAlchemy's cursor events on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import orjson
import pytest
from sqlalchemy import Connection, Engine, event, select
from sqlalchemy.orm import Session

from tests.conftest import Database, Example, minimal_rollout, store_raw
from tests.pgwire import messages, traced, transaction_statements
from tracestore.api.overload import read_session, reading
from tracestore.correlation import lookup_forms
from tracestore.db.engine import create_engine
from tracestore.drift.reads import has_trajectories
from tracestore.errors import NotFound
from tracestore.ingest.service import ingest_many
from tracestore.models import Run, Trajectory
from tracestore.store.runs import (
    RunFilter,
    get_document,
    get_document_read,
    list_runs,
    runs_by_correlation,
)


def _traj(env: str | None, policy: str | None, cid: str | None = None) -> dict[str, Any]:
    t: dict[str, Any] = minimal_rollout("x")["trajectories"][0]
    t["env_id"], t["policy_id"] = env, policy
    if cid is not None:
        t["trace_correlation_id"] = cid
    return t


# Runs that exercise every rule of a look-up: a cid that is canonical for one run and a
# trajectory's for another, several trajectories (repeated and missing env / policy ids),
# a run matched both ways, and an id holding '/' next to the id it names.
CRAFTED = [
    minimal_rollout(
        "multi-1",
        trace_correlation_id="shared",
        trajectories=[
            _traj("e2", "p1", "shared"),
            _traj("e1", None, "tc-2"),
            _traj("e2", "p1"),
            _traj(None, "p0"),
        ],
    ),
    minimal_rollout("multi-2", trajectories=[_traj("e3", "p3", "shared")]),
    minimal_rollout("slash-a", trace_correlation_id="trace_q/v1/chat/completions"),
    minimal_rollout("slash-b", trace_correlation_id="trace_q"),
    minimal_rollout("slash-c", trajectories=[_traj("e", "p", "trace_q")]),
]
ASKED = [
    "shared",
    "tc-2",
    "trace_q",
    "trace_q/v1/chat/completions",  # stored as such: only slash-a
    "trace_q/v1/other",  # names trace_q: slash-b and slash-c
    "nope",
    "nope/v1/chat",
    "/v1/chat",
    " ",
]


def _expected(session: Session, cid: str) -> tuple[str, list[dict[str, Any]]] | None:
    """The answer as the list route's statements give it: the first form with runs."""
    for form in lookup_forms(cid):
        items, _ = list_runs(session, RunFilter(correlation_id=form), limit=1000)
        if items:
            return form, items
    return None


def _stored_cids(session: Session) -> list[str]:
    conn = session.connection()
    found = set(conn.execute(select(Run.correlation_id)).scalars())
    found |= set(conn.execute(select(Trajectory.correlation_id)).scalars())
    return sorted(c for c in found if c is not None)


def _check(session: Session, cids: list[str]) -> int:
    answered = 0
    for cid in cids:
        expected = _expected(session, cid)
        if expected is None:
            with pytest.raises(NotFound):
                runs_by_correlation(session, cid)
            continue
        assert runs_by_correlation(session, cid) == expected, cid
        answered += 1
    return answered


def test_cid_look_up_answers_as_the_list_statements_do(
    connection: Connection, session: Session
) -> None:
    for doc in CRAFTED:
        assert store_raw(connection, orjson.dumps(doc)).status == "created"
    assert _check(session, ASKED) == 5
    matched, runs = runs_by_correlation(session, "shared")
    assert matched == "shared"
    # Newest first; a run matched by its canonical cid and a trajectory's comes once.
    assert [r["run_id"] for r in runs] == ["multi-2", "multi-1"]
    # Trajectory order, each id once, missing ones left out.
    assert (runs[1]["env_ids"], runs[1]["policy_ids"]) == (["e2", "e1"], ["p1", "p0"])
    assert runs_by_correlation(session, "trace_q/v1/other")[0] == "trace_q"
    assert [
        r["run_id"] for r in runs_by_correlation(session, "trace_q/v1/chat/completions")[1]
    ] == ["slash-a"]


def test_cid_look_up_of_every_example_id(
    connection: Connection, session: Session, examples: list[Example]
) -> None:
    # The examples hold drift (kinds in a run's summary), trace-only and legacy-only runs,
    # shared cids and retries.
    for ex in examples:
        store_raw(connection, ex.raw)
    cids = _stored_cids(session)
    asked = cids + [f"{c}/v1/chat/completions" for c in cids] + ["trace_absent"]
    assert _check(session, asked) == 2 * len(cids)
    kinds = [r["drift_kinds"] for c in cids for r in runs_by_correlation(session, c)[1]]
    assert any(kinds), "the examples should hold runs with drift"


def test_document_read_is_the_document_and_whether_it_has_trajectories(
    connection: Connection, session: Session, examples: list[Example]
) -> None:
    for ex in examples:
        store_raw(connection, ex.raw)
    run_ids = sorted({ex.doc["run_id"] for ex in examples})
    flags = set()
    for run_id in run_ids:
        body, legacy = get_document_read(session, run_id)
        assert body == get_document(session, run_id)
        assert legacy is has_trajectories(session, run_id)
        flags.add(legacy)
    assert flags == {True, False}
    with pytest.raises(NotFound):
        get_document_read(session, "run-absent")


# --- what goes over the wire ----------------------------------------------------------


def _store(engine: Engine) -> None:
    results = ingest_many(engine, [orjson.dumps(doc) for doc in CRAFTED])
    assert {r.status for r in results} == {"created"}


@pytest.fixture
def one_connection(database: Database, engine: Engine) -> Iterator[Engine]:
    """An engine of one pooled connection on the (emptied) store, as a lane reads it."""
    store = create_engine(database.url, connections=1)
    try:
        yield reading(store)
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("cid", "found"),
    [("shared", ["multi-2", "multi-1"]), ("absent/v1/chat/completions", None)],  # 1, 2 forms
)
def test_a_cid_look_up_is_one_statement_and_no_transaction_on_postgresql(
    backend: str, one_connection: Engine, engine: Engine, cid: str, found: list[str] | None
) -> None:
    if backend != "postgresql":
        pytest.skip("the wire protocol of PostgreSQL")
    _store(engine)
    for _ in range(8):  # past psycopg's prepare threshold: the steady state
        with read_session(one_connection) as session, suppress(NotFound):
            runs_by_correlation(session, cid)
    with traced(one_connection) as lines, read_session(one_connection) as session:
        if found is None:
            with pytest.raises(NotFound):
                runs_by_correlation(session, cid)
        else:
            assert [r["run_id"] for r in runs_by_correlation(session, cid)[1]] == found
    assert not transaction_statements(lines), lines
    # One statement, and the server never had a transaction open: every ReadyForQuery
    # says idle.
    assert len(messages(lines, "B", "CommandComplete")) == 1, lines
    assert set(messages(lines, "B", "ReadyForQuery")) == {"I"}, lines


def test_a_cid_look_up_is_one_statement_on_sqlite(
    backend: str, one_connection: Engine, engine: Engine
) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite's own statements")
    _store(engine)
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    event.listen(one_connection, "before_cursor_execute", record)
    try:
        with read_session(one_connection) as session:
            runs_by_correlation(session, "trace_q/v1/other")
    finally:
        event.remove(one_connection, "before_cursor_execute", record)
    # SQLite keeps its deferred transaction (a local call, no round trip): one snapshot.
    assert [s for s in sent if not s.startswith("BEGIN")] == [sent[-1]]
    assert sent[-1].lstrip().startswith("WITH")
