"""What goes over PostgreSQL's wire: libpq's trace of the connections a pool hands out."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import IO, Any

from sqlalchemy import Engine, event


@contextmanager
def traced(engine: Engine) -> Iterator[list[str]]:
    """The messages on every connection `engine`'s pool hands out while the block runs
    (libpq's trace, lines like `F<TAB>len<TAB>Query<TAB> "BEGIN"`), once the block ends.

    Tracing starts at checkout, after the pool's liveness ping: what is traced is what the
    code under test sends."""
    from psycopg import pq

    lines: list[str] = []
    connections: list[tuple[Any, IO[str]]] = []
    with ExitStack() as files:

        def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            out = files.enter_context(tempfile.TemporaryFile("w+"))
            dbapi_connection.pgconn.trace(out.fileno())
            dbapi_connection.pgconn.set_trace_flags(
                pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE
            )
            connections.append((dbapi_connection, out))

        event.listen(engine.pool, "checkout", checkout)
        try:
            yield lines
        finally:
            event.remove(engine.pool, "checkout", checkout)
            for conn, out in connections:
                conn.pgconn.untrace()
                out.seek(0)
                lines.extend(out.read().splitlines())


def messages(lines: list[str], side: str, kind: str) -> list[str]:
    """The payloads of the `kind` messages (Query, CommandComplete, ReadyForQuery, ...) that
    `side` sent: F the client (frontend), B the server (backend)."""
    return [
        line.split("\t", 3)[3].strip() if line.count("\t") >= 3 else ""
        for line in lines
        if line.startswith(side + "\t") and line.split("\t")[2] == kind
    ]


# The first words of statements that open or end a transaction.
TRANSACTION_WORDS = ("BEGIN", "START", "COMMIT", "ROLLBACK", "END", "SAVEPOINT", "RELEASE")


def transaction_statements(lines: list[str]) -> list[str]:
    """The simple-protocol queries in `lines` that open or end a transaction."""
    queries = messages(lines, "F", "Query")
    return [q for q in queries if q.strip('"').split()[:1] in [[w] for w in TRANSACTION_WORDS]]
