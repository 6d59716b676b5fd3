"""Store contents that trip DuckDB's scanners, read correctly all the same."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests.conftest import Database, _PgDatabases, new_database
from tracestore.cli.main import app
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes
from tracestore.reports import output
from tracestore.reports.catalog import list_reports
from tracestore.reports.connection import open_live
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report, run_sql
from tracestore.reports.snapshot import verify_snapshot

# `obs` is any JSON value (SPEC section 1); on SQLite a JSON column has NUMERIC affinity,
# so the JSON text `3` is stored as the integer 3, which the sqlite scanner refuses.
BANDIT = {
    "run_id": "bandit-1",
    "trajectories": [
        {
            "env_id": "bandit",
            "policy_id": "p",
            "steps": [
                {"obs": 3, "reward": 1.0, "done": False},
                {"obs": 0.30000000000000004, "reward": 0.0, "done": False},
                {"obs": "text", "reward": 0.5, "done": True},
            ],
        }
    ],
    "metrics": {"episode_returns": [1.5], "mean_return": 1.5, "num_steps": 3},
}


@pytest.fixture
def bandit_url(
    backend: str, tmp_path_factory: pytest.TempPathFactory, pg_databases: _PgDatabases | None
) -> str:
    """A store of its own holding BANDIT. Not the run's shared store: DuckDB opening a
    SQLite file in this process (in_this_process below) drops this process's locks on it,
    after which another process closing it deletes the WAL under the shared store's
    later users (reports/live.py, issue 18)."""
    db = new_database(backend, "bare-numbers", tmp_path_factory, pg_databases)
    engine = create_engine(db.url)
    try:
        migrate.upgrade(engine)
        ingest_bytes(engine, orjson.dumps(BANDIT))
    finally:
        engine.dispose()
    return db.url


def test_bare_json_numbers_are_read_exactly(bandit_url: str) -> None:
    engine = create_engine(bandit_url)
    with open_live(engine, in_this_process=True) as analytics:
        got = run_sql(analytics, "SELECT CAST(obs AS VARCHAR) AS obs FROM steps ORDER BY idx")
        values = [orjson.loads(r["obs"]) for r in output.rows(got.table)]
        assert values == [3, 0.30000000000000004, "text"]
        for report in list_reports():
            run_report(analytics, report, Filters())
        rewards = output.rows(
            run_report(
                analytics, next(r for r in list_reports() if r.name == "rewards"), Filters()
            ).table
        )
        assert rewards[0]["steps"] == 3
        assert rewards[0]["total_reward"] == 1.5
        if engine.dialect.name == "sqlite":
            assert any(
                "steps: JSON values stored as SQLite numbers" in n for n in analytics.notices
            )
        else:
            assert analytics.notices == []
    engine.dispose()


def test_export_reads_bare_json_numbers_exactly(
    backend: str, bandit_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Issue 13: `report` and `sql` coped with this store, `export` crashed with DuckDB's
    # TypeMismatchException (and a traceback).
    target = tmp_path_factory.mktemp("export") / "snap"
    done = CliRunner().invoke(app, ["export", str(target), "--db", bandit_url])
    assert done.exit_code == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert verify_snapshot(target) == []
    steps = pq.read_table(target / "steps").sort_by("idx").column("obs").to_pylist()
    assert [orjson.loads(v) for v in steps] == [3, 0.30000000000000004, "text"]
    if backend == "sqlite":
        assert "steps: JSON values stored as SQLite numbers" in done.stderr


# Trace names that are no id (ingest leaves runs.env_id unset): the reports say the same.
NAMES = [
    ({"env_name": "crafter", "policy_name": "crafter-react"}, "crafter", "crafter-react"),
    ({"env_name": 7, "policy_name": {"a": 1}}, None, None),
    ({"env_name": "x" * 1025, "policy_name": True}, None, None),
    ({"env_name": "é" * 512, "policy_name": "é" * 513}, "é" * 512, None),  # 1,024 / 1,026 B
    # An id that is no id is not replaced by the name; a null one is.
    ({"env_id": 7, "env_name": "crafter", "policy_id": None, "policy_name": "p"}, None, "p"),
    ({"env_id": "x" * 1025, "policy_id": {"a": 1}, "policy_name": "p"}, None, None),
    ({"env_id": "e", "env_name": "crafter", "policy_id": "", "policy_name": "p"}, "e", ""),
]


def test_run_facts_take_a_trace_name_as_ingest_does(fresh_db: Database) -> None:
    engine = create_engine(fresh_db.url)
    try:
        for i, (metadata, _, _) in enumerate(NAMES):
            trace = {"session_id": f"s{i}", "session_time_steps": [], "metadata": metadata}
            doc = {**BANDIT, "run_id": f"named-{i}", "trajectories": [], "trace": trace}
            ingest_bytes(engine, orjson.dumps(doc))
        with engine.connect() as conn:
            stored = {
                r.run_id: (r.env_id, r.policy_id)
                for r in conn.execute(text("SELECT run_id, env_id, policy_id FROM runs"))
            }
        with open_live(engine, in_this_process=True) as analytics:
            facts = output.rows(
                run_sql(analytics, "SELECT run_id, env_id, policy_id FROM run_facts").table
            )
    finally:
        engine.dispose()
    expected = {f"named-{i}": (env, policy) for i, (_, env, policy) in enumerate(NAMES)}
    assert stored == expected
    assert {r["run_id"]: (r["env_id"], r["policy_id"]) for r in facts} == expected
