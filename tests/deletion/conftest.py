"""Shared helpers of the deletion tests: stores with rollouts of every kind, orphan checks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, Table, text

from tests.conftest import Example
from tracestore.db.base import Base
from tracestore.ingest.service import ingest_many


def ingest_examples(engine: Engine, examples: list[Example]) -> list[str]:
    """Store the examples; returns the run_ids created (every kind of rollout)."""
    results = list(ingest_many(engine, [e.raw for e in examples]))
    return [r.run_id for r in results if r.status == "created" and r.run_id is not None]


def _parents(table: Table) -> list[tuple[str, str, str]]:
    return [(fk.parent.name, fk.column.table.name, fk.column.name) for fk in table.foreign_keys]


def orphans(engine: Engine) -> dict[str, int]:
    """Rows of every table with a foreign key whose parent row is gone (none expected).

    Built from the models' foreign keys, so a table added later is checked too.
    """
    found: dict[str, int] = {}
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            for column, parent, parent_column in _parents(table):
                n = conn.execute(
                    text(
                        f"SELECT count(*) FROM {table.name} c WHERE c.{column} IS NOT NULL "
                        f"AND NOT EXISTS (SELECT 1 FROM {parent} p "
                        f"WHERE p.{parent_column} = c.{column})"
                    )
                ).scalar_one()
                if n:
                    found[f"{table.name}.{column}"] = n
    return found


def rows_of_run(engine: Engine, run_id: str) -> dict[str, int]:
    """Rows that belong to `run_id` in every table that references a run (by run_pk,
    or through a trace or trajectory)."""
    with engine.connect() as conn:
        pk = conn.execute(text("SELECT id FROM runs WHERE run_id = :r"), {"r": run_id}).scalar()
        if pk is None:
            return {}
        counts: dict[str, int] = {"runs": 1}
        for table in Base.metadata.sorted_tables:
            if "run_pk" in table.c:
                counts[table.name] = conn.execute(
                    text(f"SELECT count(*) FROM {table.name} WHERE run_pk = :pk"), {"pk": pk}
                ).scalar_one()
        counts["trace_time_steps"] = conn.execute(
            text(
                "SELECT count(*) FROM trace_time_steps WHERE trace_pk IN "
                "(SELECT id FROM traces WHERE run_pk = :pk)"
            ),
            {"pk": pk},
        ).scalar_one()
        return counts


@contextmanager
def delete_fault(engine: Engine, table: str) -> Iterator[None]:
    """While open, deleting any row of `table` fails inside the database (a trigger)."""
    name = "tracestore_test_delete_fault"
    if engine.dialect.name == "postgresql":
        create = [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"RAISE EXCEPTION 'injected fault deleting from {table}'; END $$",
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {name}()",
        ]
        drop = [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"]
    else:
        create = [
            f"CREATE TRIGGER {name} BEFORE DELETE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'injected fault deleting from {table}'); END"
        ]
        drop = [f"DROP TRIGGER IF EXISTS {name}"]
    with engine.begin() as conn:
        for statement in create:
            conn.exec_driver_sql(statement)
    try:
        yield
    finally:
        with engine.begin() as conn:
            for statement in drop:
                conn.exec_driver_sql(statement)
