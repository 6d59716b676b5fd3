"""What every verb shares: the --db option, settings, engines, and error reporting."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from tracestore.errors import SchemaOutOfDate, TracestoreError
from tracestore.settings import Settings

err_console = Console(stderr=True)
console = Console()

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL (default: TRACESTORE_DATABASE_URL, else sqlite:///./tracestore.db).",
        show_default=False,
    ),
]


def settings_for(db: str | None) -> Settings:
    """Settings from the environment, with --db taking precedence."""
    settings = Settings()
    if db:
        settings = settings.model_copy(update={"database_url": db})
    return settings


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one readable line to stderr and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn domain and connection errors into one line on stderr and CONTRACT exit codes."""
    try:
        yield
    except SchemaOutOfDate as exc:
        fail(exc.message, code=1)
    except TracestoreError as exc:
        fail(exc.message)
    except OperationalError as exc:
        fail(f"cannot use the database: {str(exc.orig or exc).strip().splitlines()[0]}")


def open_store(db: str | None, *, create_new_sqlite: bool = True) -> Engine:
    """An engine on the store, its schema checked (a new SQLite file is created and migrated)."""
    from tracestore.db import migrate
    from tracestore.db.engine import create_engine

    engine = create_engine(settings_for(db).database_url)
    migrate.ensure_schema(engine, create_new=create_new_sqlite and engine.dialect.name == "sqlite")
    return engine


def stdout_is_terminal() -> bool:
    """True when stdout is a terminal (pretty output), False when piped (plain JSON)."""
    return sys.stdout.isatty()


Verb = Callable[..., None]
