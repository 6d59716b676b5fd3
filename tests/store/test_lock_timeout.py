"""A statement waits for a PostgreSQL lock at most PG_LOCK_TIMEOUT_S (db/engine.py), as
SQLite's writers queue at most their busy timeout: a post behind a table lock (a
migration, a LOCK TABLE, a stuck transaction) fails and is retried instead of holding its
client forever. SQLite's side is tests/store/test_writer_queue.py's."""

from __future__ import annotations

import time

import orjson
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from tests.conftest import Database, minimal_rollout
from tracestore.db.engine import PG_LOCK_TIMEOUT_S, create_engine
from tracestore.ingest.service import ingest_bytes


def _pg_only(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's lock timeout (SQLite's busy timeout is the writer queue's)")


def _shown(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW lock_timeout")).scalar_one())


def test_every_connection_has_the_lock_timeout(database: Database, engine: Engine) -> None:
    _pg_only(engine)
    own = create_engine(database.url)
    try:
        assert _shown(own) == f"{int(PG_LOCK_TIMEOUT_S)}s"
    finally:
        own.dispose()
    # A value set elsewhere wins: the URL's options (as PGOPTIONS), 0 turning it off.
    for given, shown in (("0", "0"), ("250", "250ms")):
        url = make_url(database.url).update_query_dict({"options": f"-c lock_timeout={given}"})
        other = create_engine(url)
        try:
            assert _shown(other) == shown
        finally:
            other.dispose()


def test_an_ingest_behind_a_table_lock_fails_after_the_timeout(
    database: Database, engine: Engine
) -> None:
    _pg_only(engine)
    url = make_url(database.url).update_query_dict({"options": "-c lock_timeout=300"})
    short = create_engine(url)
    raw = orjson.dumps(minimal_rollout("locked-out"))
    try:
        with engine.connect() as holder:
            holder.exec_driver_sql("BEGIN")
            holder.exec_driver_sql("LOCK TABLE runs IN EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(OperationalError, match="lock timeout"):
                ingest_bytes(short, raw)
            waited = time.monotonic() - started
            holder.exec_driver_sql("ROLLBACK")
        assert 0.3 <= waited < 10, waited
        # Nothing was stored: once the lock is gone the same ingest is created.
        assert ingest_bytes(short, raw).status == "created"
    finally:
        short.dispose()
