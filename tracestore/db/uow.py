"""Unit of work: one transaction per request, batch item or CLI command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from tracestore.db.engine import BEGIN_MODE, write_engine


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    """A session for reads; rolled back at the end (it never writes)."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
        finally:
            session.rollback()


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A session whose work commits at the end, or rolls back whole on any error."""
    with Session(write_engine(engine), expire_on_commit=False) as session, session.begin():
        yield session


@contextmanager
def write_connection(engine: Engine) -> Iterator[Connection]:
    """As write_session, on a Core connection: for the ingest paths, which write through
    Core and the driver only (no ORM session to build per transaction)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            # This connection only: BEGIN IMMEDIATE (db/engine.py), without the option
            # engine write_engine makes, whose joined event dispatch costs on every call.
            conn.execution_options(**{BEGIN_MODE: "IMMEDIATE"})
        with conn.begin():
            yield conn
