"""A database lock held past the wait is a 503 with Retry-After, not a 500; nothing is written."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import orjson
import psycopg
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tests.conftest import Database, LiveServer, minimal_rollout, row_counts
from tracestore.settings import Settings

LOCK_WAIT_S = 0.3


def _rollout(run_id: str) -> bytes:
    return orjson.dumps(minimal_rollout(run_id))


def _short_wait_url(database: Database) -> str:
    # The server waits LOCK_WAIT_S for a lock instead of the default (30 s on SQLite).
    if database.backend == "sqlite":
        return f"{database.url}?timeout={LOCK_WAIT_S}"
    return f"{database.url}?options=-c%20lock_timeout%3D{int(LOCK_WAIT_S * 1000)}"


@contextmanager
def _write_lock_held(database: Database) -> Iterator[None]:
    """Another client holds the lock every ingest needs, outside tracestore."""
    url = make_url(database.url)
    if database.backend == "sqlite":
        conn = sqlite3.connect(str(url.database), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")  # SQLite's one write lock
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as pg:
        pg.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        yield
        pg.rollback()


def test_a_lock_held_past_the_wait_is_503_with_retry_after(
    database: Database, engine: Engine
) -> None:
    raw = _rollout("run-busy")
    settings = Settings(database_url=_short_wait_url(database))
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        with _write_lock_held(database):
            refused = http.post("/v1/rollouts", content=raw)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "database_unavailable"
        assert row_counts(engine)["runs"] == 0
        # The retry the 503 asks for succeeds once the lock is gone.
        retried = http.post("/v1/rollouts", content=raw)
        assert retried.status_code == 201, retried.text
        assert http.get("/v1/rollouts/run-busy").content == raw
