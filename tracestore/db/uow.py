"""Unit of work: one transaction per request, batch item or CLI command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tracestore.db.engine import write_engine


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
