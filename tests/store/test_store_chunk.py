"""Batched writes (store_many): the same rows as one rollout at a time, each standing alone."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
from sqlalchemy import Connection, Engine, text

from tests.conftest import Example, minimal_rollout, row_counts
from tracestore.db.base import Base
from tracestore.db.uow import write_session
from tracestore.ingest.service import prepare, store_prepared
from tracestore.store.rollouts import store_many, store_one

# Surrogate keys and clocks differ between two stores of the same rollouts; the rest must not.
_VOLATILE = {"id", "received_at", "checked_at"}


def _content(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows without surrogate keys, each tied to its run_id where it has one."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table in Base.metadata.sorted_tables:
        if table.name == "legacy_reads":
            continue
        cols = [c.name for c in table.columns if c.name not in _VOLATILE]
        keep = [c for c in cols if not c.endswith("_pk")]
        select_list = ", ".join(f't."{c}"' for c in keep) or "1"
        if "run_pk" in cols:
            sql = (
                f"SELECT r.run_id, {select_list} FROM {table.name} t JOIN runs r ON r.id = t.run_pk"
            )
        else:
            sql = f"SELECT {select_list} FROM {table.name} t"
        out[table.name] = sorted(
            (tuple(map(repr, row)) for row in conn.execute(text(sql))), key=repr
        )
    return out


def test_a_batch_stores_the_rows_one_at_a_time_would(
    connection: Connection, examples: list[Example]
) -> None:
    # Every example: they repeat some run_ids (duplicates, and one conflict), so a batch
    # meets ids stored a moment before, by itself or by an earlier batch.
    prepared = [prepare(ex.raw) for ex in examples]
    expected = [ex.label["expect_status"] for ex in examples]
    assert {"created", "duplicate", "conflict"} <= set(expected)
    with connection.begin_nested() as singly:
        assert [store_one(connection, p).status for p in prepared] == expected
        one_at_a_time = _content(connection)
        singly.rollback()
    assert set(row_counts(connection).values()) == {0}
    # Two batches, as store_prepared splits a long one: the second meets the first's ids.
    half = len(prepared) // 2
    batched = store_many(connection, prepared[:half]) + store_many(connection, prepared[half:])
    assert [r.status for r in batched] == expected
    assert _content(connection) == one_at_a_time


def _doc(run_id: str, reward: float) -> bytes:
    return orjson.dumps(minimal_rollout(run_id, reward))


def test_a_run_id_twice_in_one_batch_is_decided_against_the_first(connection: Connection) -> None:
    raws = [_doc("a", 1.0), _doc("b", 1.0), _doc("a", 2.0), _doc("b", 1.0), _doc("c", 1.0)]
    results = store_many(connection, [prepare(raw) for raw in raws])
    assert [r.status for r in results] == ["created", "created", "conflict", "duplicate", "created"]
    assert connection.execute(text("SELECT count(*) FROM runs")).scalar_one() == 3


def test_a_concurrent_insert_falls_back_to_one_savepoint_each(backend: str, engine: Engine) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite writers are serialized (BEGIN IMMEDIATE): no insert can race")
    first_in = threading.Event()
    release = threading.Event()

    def first() -> None:
        # Stores run "x" and holds its transaction open: the batch below cannot see "x"
        # when it looks, then meets it on the unique index when it writes.
        with write_session(engine) as session:
            store_many(session.connection(), [prepare(_doc("x", 1.0))])
            first_in.set()
            release.wait(30)

    # Prepared before the clock: under load, preparing inside the timed window could
    # outlast the timer, and the batch would then meet "x" committed, with no race.
    batch = [prepare(_doc("y", 1.0)), prepare(_doc("x", 2.0)), prepare(_doc("z", 1.0))]
    holder = threading.Thread(target=first)
    holder.start()
    assert first_in.wait(30)
    threading.Timer(0.5, release.set).start()  # commits while the batch waits on the index
    started = time.monotonic()
    results = store_prepared(engine, batch)
    holder.join(30)
    assert time.monotonic() - started >= 0.4, "the batch did not wait for the other writer"
    assert [r.status for r in results] == ["created", "conflict", "created"]
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, n_steps FROM runs ORDER BY run_id")).all()
    assert [r.run_id for r in rows] == ["x", "y", "z"]
