"""The pool's liveness ping on PostgreSQL: skipped for a connection given back moments ago
whose socket is quiet, sent for any other, and a connection the server ended is replaced."""

from __future__ import annotations

import select
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import pq
from sqlalchemy import Engine, text

from tests.conftest import Database
from tests.pgwire import messages, transaction_statements
from tracestore.db.engine import QuietPing, create_engine


@pytest.fixture
def one_connection(backend: str, database: Database) -> Iterator[Engine]:
    if backend != "postgresql":
        pytest.skip("the ping of PostgreSQL connections")
    engine = create_engine(database.url, connections=1)
    try:
        yield engine
    finally:
        engine.dispose()


def _quiet_ping(engine: Engine) -> QuietPing:
    ping: Any = engine.dialect.do_ping
    assert isinstance(ping.__self__, QuietPing)
    return ping.__self__


def _backend(engine: Engine) -> tuple[int, int]:
    """The pooled connection's server process id and its socket."""
    with engine.connect() as conn:
        driver: Any = conn.connection.driver_connection
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()), driver.fileno()


def _sent_at_checkout(engine: Engine) -> list[str]:
    """What the client sends on the pooled connection for one checkout and `SELECT 1`."""
    with engine.connect() as conn:
        driver: Any = conn.connection.driver_connection
    with tempfile.TemporaryFile("w+") as out:
        driver.pgconn.trace(out.fileno())
        driver.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar_one() == 1
        finally:
            driver.pgconn.untrace()
        out.seek(0)
        lines = out.read().splitlines()
    statements = messages(lines, "F", "Query") + messages(lines, "F", "Parse")
    return [s for s in statements if s not in transaction_statements(lines)]


def test_a_connection_given_back_moments_ago_is_not_pinged(one_connection: Engine) -> None:
    quiet = _quiet_ping(one_connection)
    before = quiet.skipped
    sent = _sent_at_checkout(one_connection)
    assert sent == ['"SELECT 1"']
    assert quiet.skipped == before + 1


def test_a_connection_idle_longer_is_pinged(one_connection: Engine) -> None:
    quiet = _quiet_ping(one_connection)
    quiet.fresh_for = 0.0  # every connection counts as idle too long
    before = quiet.skipped
    sent = _sent_at_checkout(one_connection)
    assert sent == ['";"', '"SELECT 1"']  # the ping, then the statement
    assert quiet.skipped == before


def test_a_connection_the_server_ended_is_replaced(
    one_connection: Engine, database: Database
) -> None:
    quiet = _quiet_ping(one_connection)
    old, socket = _backend(one_connection)
    admin = create_engine(database.url)
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": old}).scalar()
    finally:
        admin.dispose()
    # The server's goodbye reaches the pooled connection's socket within moments.
    deadline = time.monotonic() + 5
    while not select.select([socket], [], [], 0.05)[0] and time.monotonic() < deadline:
        pass
    before = quiet.skipped
    # Given back well within fresh_for, but not quiet: pinged, found dead and replaced.
    assert _backend(one_connection)[0] != old
    assert quiet.skipped == before
