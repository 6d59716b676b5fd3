"""Alembic environment: URL from tracestore settings, batch mode, injectable connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from tracestore.db.base import Base
from tracestore.db.engine import create_migration_engine
from tracestore.settings import Settings

config = context.config
# Autogenerate compares against the live models; revisions themselves never import them.
import tracestore.models  # noqa: E402,F401  (registers every table on Base.metadata)

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode rewrites the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run on an injected connection (tests, tracestore.db.migrate) or on our own engine."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or Settings().database_url
    engine = create_migration_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    url = config.get_main_option("sqlalchemy.url") or Settings().database_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
