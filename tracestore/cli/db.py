"""`tracestore db ...`: Alembic migrations from the installed package."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tracestore.cli.common import DbOption, console, fail, reported_errors, store_url

if TYPE_CHECKING:
    from sqlalchemy import Engine

app = typer.Typer(help="Database schema migrations (Alembic), run from the installed package.")


def _engine(db: str | None, *, create: bool = False) -> Engine:
    """An engine on the store; only `upgrade` may create a new SQLite file."""
    from tracestore.db.engine import create_engine

    return create_engine(store_url(db, must_exist=not create))


@app.command()
def upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    db: DbOption = None,
) -> None:
    """Upgrade the schema to REVISION (default: head). Creates a new SQLite file."""
    from tracestore.db import migrate

    with reported_errors():
        migrate.check_revision(revision)  # before a new SQLite file is made for it
        engine = _engine(db, create=True)
        before = migrate.current_revision(engine)
        migrate.upgrade(engine, revision)
        after = migrate.current_revision(engine)
        console.print(f"schema: {before or '(empty)'} -> {after}")


@app.command()
def downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision ('base' removes every table).")],
    db: DbOption = None,
) -> None:
    """Downgrade the schema to REVISION."""
    from tracestore.db import migrate

    with reported_errors():
        migrate.check_revision(revision)
        engine = _engine(db)
        before = migrate.current_revision(engine)
        migrate.downgrade(engine, revision)
        after = migrate.current_revision(engine)
        console.print(f"schema: {before or '(empty)'} -> {after or '(base)'}")


@app.command()
def current(db: DbOption = None) -> None:
    """Print the database's schema revision and the one this code expects."""
    from tracestore.db import migrate

    with reported_errors():
        engine = _engine(db)
        rev = migrate.current_revision(engine)
        console.print(f"database: {rev or '(empty)'}  code expects: {migrate.head_revision()}")


@app.command()
def check(db: DbOption = None) -> None:
    """Exit 0 when the schema is at head and matches the models, 1 otherwise."""
    import tracestore.models  # noqa: F401  (registers the tables on Base.metadata)
    from tracestore.db import migrate
    from tracestore.db.base import Base

    with reported_errors():
        engine = _engine(db)
        rev = migrate.check_schema(engine)
        diffs = migrate.schema_differences(engine, Base.metadata)
        if diffs:
            fail(f"schema at {rev} differs from the models: {diffs[0]}", code=1)
        console.print(f"ok: schema at {rev}, matching the models")
