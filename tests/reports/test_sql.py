"""Ad-hoc SQL: the tables and views by name, clear errors, and never a write to the store."""

from __future__ import annotations

import orjson
import pytest
from sqlalchemy import inspect, text

from tests.conftest import row_counts
from tests.reports.conftest import Store
from tracestore.errors import InvalidRequest
from tracestore.reports import output
from tracestore.reports.connection import model_tables
from tracestore.reports.runner import run_sql

FRIENDLY = ("run_facts", "episode_facts", "step_facts", "event_facts", "tool_call_facts")


def test_tables_and_views_are_there_by_name(store: Store) -> None:
    with store.engine.connect() as conn:
        counts = {
            name: conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one()
            for name in model_tables()
        }
    for name in model_tables():
        got = run_sql(store.live, f"SELECT count(*) AS n FROM {name}")
        assert output.rows(got.table) == [{"n": counts[name]}], name
    for view in FRIENDLY:
        assert run_sql(store.live, f"SELECT count(*) FROM {view}").table.num_rows == 1
    runs = run_sql(store.live, "SELECT count(*) AS n FROM run_facts")
    assert output.rows(runs.table) == [{"n": counts["runs"]}]
    # The raw documents are not part of analytics.
    with pytest.raises(InvalidRequest, match="run_documents"):
        run_sql(store.live, "SELECT * FROM run_documents")


def test_types_are_normalized(store: Store) -> None:
    got = run_sql(
        store.live,
        "SELECT typeof(received_at) AS ts, typeof(metrics) AS js, typeof(aborted) AS b "
        "FROM runs LIMIT 1",
    )
    assert output.rows(got.table) == [
        {"ts": "TIMESTAMP WITH TIME ZONE", "js": "JSON", "b": "BOOLEAN"}
    ]
    first = run_sql(store.live, "SELECT min(received_at) AS t FROM runs")
    assert output.rows(first.table) == [{"t": "2025-11-18T06:00:00+00:00"}]
    # JSON operators work alike on SQLite text and PostgreSQL jsonb.
    got = run_sql(
        store.live,
        "SELECT count(*) AS n FROM runs WHERE json_extract(metrics, '$.num_steps') IS NOT NULL",
    )
    assert output.rows(got.table)[0]["n"] > 0


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELEC 1", "bad SQL: Parser Error"),
        ("SELECT * FROM no_such_table", "query failed: Catalog Error"),
        ("SELECT 1; SELECT 2", "one SQL statement"),
        ("   ", "empty query"),
        ("PRAGMA version", "only plain SELECT"),
    ],
)
def test_bad_sql_is_a_clear_one_line_error(store: Store, query: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as caught:
        run_sql(store.live, query)
    assert "\n" not in caught.value.message


WRITES = [
    "INSERT INTO runs (run_id) VALUES ('x')",
    "DELETE FROM steps",
    "UPDATE store.runs SET aborted = true",
    "DROP TABLE store.steps",
    "CREATE TABLE store.pwned (x INTEGER)",
    "ATTACH '/tmp/other.db' AS other",
    "COPY runs TO '/tmp/tracestore-leak.csv'",
    "SET enable_external_access = true",
    "INSTALL httpfs",
    # The postgres extension's own function can switch its transaction to read-write.
    "SELECT * FROM postgres_execute('store', "
    "'SET TRANSACTION READ WRITE; CREATE TABLE pwned (x int)')",
    "SELECT * FROM sqlite_query('store', 'DELETE FROM steps')",
    "SELECT * FROM query('DELETE FROM steps')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "WITH x AS (SELECT 1) SELECT * FROM postgres_query('store', 'SELECT 1')",
]


@pytest.mark.parametrize("query", WRITES)
def test_nothing_writes_or_escapes(store: Store, query: str) -> None:
    before = row_counts(store.engine)
    with pytest.raises(InvalidRequest):
        run_sql(store.live, query)
    assert row_counts(store.engine) == before
    assert "pwned" not in inspect(store.engine).get_table_names()


def test_a_snapshot_answers_the_same_sql(store: Store) -> None:
    query = "SELECT env_id, count(*) AS steps FROM step_facts GROUP BY ALL ORDER BY ALL"
    assert run_sql(store.frozen, query).table.equals(run_sql(store.live, query).table)


def test_json_says_which_columns_held_infinities(store: Store) -> None:
    # JSON has no infinity or NaN: they are written as null, and were without a word.
    got = run_sql(
        store.live,
        "SELECT 'inf'::DOUBLE AS up, [1.0, '-inf'::DOUBLE, 'nan'::DOUBLE] AS xs, "
        "{'r': 'nan'::DOUBLE} AS s, 1.5 AS fine, NULL::DOUBLE AS nothing",
    )
    doc = orjson.loads(output.to_json(got))
    assert doc["rows"] == [
        {"up": None, "xs": [1.0, None, None], "s": {"r": None}, "fine": 1.5, "nothing": None}
    ]
    notices = doc["notices"]
    assert len(notices) == 3, notices
    assert "'up': 1 value infinite or NaN" in notices[0]
    assert "'xs': 2 values" in notices[1]
    assert "'s': 1 value" in notices[2]
    assert output.to_csv(got).splitlines()[1].startswith("inf,")
    finite = run_sql(store.live, "SELECT 1.5::DOUBLE AS x")
    assert orjson.loads(output.to_json(finite))["notices"] == []
