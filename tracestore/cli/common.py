"""What every verb shares: the --db option, settings, engines, output files, progress, and
error reporting.

`tracestore --help` imports this module, so it stays light: sqlalchemy, pydantic and the
rest are imported inside the functions that need them.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# Typer carries its own copy of click (typer._click): its parser raises these.
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

from tracestore.envvars import env_seconds
from tracestore.errors import InvalidRequest, SchemaOutOfDate, TracestoreError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from tracestore.settings import Settings


class _Console(Console):
    """Rich's console; written to a pipe or a file, a line of text stays one line."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **options: Any) -> None:
        """Print as Rich does; off a terminal, text is not wrapped at 80 columns (a
        summary cut in two lines defeated `grep` and scripts)."""
        if soft_wrap is None and not self.is_terminal:
            soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **options)


# No emoji codes: `NAME:KEY:admin` or a run id holding `:fire:` print as written.
err_console = _Console(stderr=True, emoji=False)
console = _Console(emoji=False)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL (default: TRACESTORE_DATABASE_URL, else sqlite:///./tracestore.db).",
        show_default=False,
    ),
]
# Set to see the traceback of an unexpected error instead of its one-line summary.
DEBUG_ENV = "TRACESTORE_DEBUG"
# The spinner shows only for work that takes longer than this (no flicker on quick
# answers); TRACESTORE_PROGRESS_AFTER sets another delay.
PROGRESS_AFTER_S = 0.5
PROGRESS_AFTER_ENV = "TRACESTORE_PROGRESS_AFTER"


def progress_after() -> float:
    """Seconds before a long command's spinner shows (TRACESTORE_PROGRESS_AFTER, else 0.5;
    `inf`: never)."""
    return env_seconds(PROGRESS_AFTER_ENV, PROGRESS_AFTER_S)


def settings_for(db: str | None) -> Settings:
    """Settings from the environment, with --db taking precedence."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from tracestore.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = "TRACESTORE_" + "_".join(str(p) for p in problem["loc"]).upper()
        raise InvalidRequest(f"{where}: {problem['msg']}") from None
    except SettingsError as exc:
        # A structured setting (JSON) that does not parse: pydantic-settings names the
        # field in its message and keeps the parser's reason as the cause.
        field = re.search(r'field "([^"]+)"', str(exc))
        where = f"TRACESTORE_{field[1].upper()}" if field else "a TRACESTORE_ setting"
        reason = exc.__cause__ or exc
        raise InvalidRequest(f"{where}: not valid JSON ({reason})") from None
    if db:
        settings = settings.model_copy(update={"database_url": db})
    return settings


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one readable line to stderr and exit with `code`."""
    # The message is text, not markup: a run id like '[/x]' must print as it is.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def note(message: str) -> None:
    """Print a one-line notice to stderr."""
    err_console.print(f"[yellow]note:[/] {escape(message)}", highlight=False, soft_wrap=True)


def database_problem(exc: BaseException) -> str | None:
    """One line for a database or URL error from SQLAlchemy; None for anything else."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None:  # sqlalchemy not even imported: not one of its errors
        return None
    if isinstance(exc, sa_exc.NoSuchModuleError | sa_exc.ArgumentError):
        return f"bad database URL: {_first_line(exc)}"
    if isinstance(exc, sa_exc.DBAPIError | sa_exc.OperationalError):
        return f"cannot use the database: {_first_line(exc.orig or exc)}"
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return f"database error: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def os_problem(exc: OSError) -> str:
    """One line for a failed file operation: what, on which path."""
    what = exc.strerror or _first_line(exc)
    return f"{exc.filename}: {what}" if exc.filename else what


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn domain and database errors into one line on stderr and CONTRACT exit codes."""
    try:
        yield
    except SchemaOutOfDate as exc:
        fail(exc.message, code=1)
    except TracestoreError as exc:
        fail(exc.message)
    except Exception as exc:
        message = database_problem(exc)
        if message is None:
            raise
        fail(message)


def store_url(db: str | None, *, must_exist: bool) -> str:
    """The store's URL (--db, else the environment), checked: SQLite or PostgreSQL, and for
    SQLite a file path that is (or, unless `must_exist`, can become) a regular file."""
    text = settings_for(db).database_url
    from sqlalchemy.exc import ArgumentError

    from tracestore.db.engine import normalize_url

    try:
        url = normalize_url(text)
    except (ArgumentError, ValueError):
        # Unparsed, a password cannot be masked: quote the URL only when it holds none.
        shown = repr(text) if "@" not in text else "the database URL"
        raise InvalidRequest(
            f"cannot read {shown} as a database URL: use sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise InvalidRequest(
            f"tracestore stores rollouts in SQLite (sqlite:///PATH) or PostgreSQL "
            f"(postgresql+psycopg://...), not {backend!r}"
        )
    database = url.database or ""
    if (
        backend == "sqlite"
        and database
        and database != ":memory:"
        and not database.startswith("file:")
    ):
        path = Path(database).expanduser()
        if path.exists() and not path.is_file():
            # SQLite would block forever on a FIFO and fail obscurely on a directory.
            raise InvalidRequest(f"{path} is not a SQLite database file")
        if not path.exists():
            if must_exist:
                raise InvalidRequest(f"no SQLite store at {path}")
            if not path.parent.is_dir():
                raise InvalidRequest(f"cannot create {path}: {path.parent} is not a directory")
    return text


def open_store(db: str | None, *, create_new_sqlite: bool = True) -> Engine:
    """An engine on the store, its schema checked (a new SQLite file is created and migrated)."""
    from tracestore.db import migrate
    from tracestore.db.engine import create_engine

    engine = create_engine(store_url(db, must_exist=not create_new_sqlite))
    migrate.ensure_schema(engine, create_new=create_new_sqlite and engine.dialect.name == "sqlite")
    return engine


def stdout_is_terminal() -> bool:
    """True when stdout is a terminal (pretty output), False when piped (plain JSON)."""
    return sys.stdout.isatty()


@contextmanager
def output_file(path: Path) -> Iterator[IO[bytes]]:
    """`path` opened for writing bytes; a FIFO once its reader is there (never a hang)."""
    from tracestore.ingest.files import is_fifo, open_fifo_for_writing

    if is_fifo(path):
        with open_fifo_for_writing(path) as out:
            yield out
    else:
        with path.open("wb") as out:
            yield out


@contextmanager
def working(description: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while the block runs, shown only on a
    terminal and only once the work has taken `progress_after()`."""
    # Read first: a bad value is refused whether or not stderr is a terminal.
    delay = progress_after()
    if not err_console.is_terminal or delay > threading.TIMEOUT_MAX:  # past it: never
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    progress.add_task(escape(description), total=None)
    lock = threading.Lock()
    state = {"started": False, "done": False}

    def start() -> None:
        with lock:
            if not state["done"]:
                progress.start()
                state["started"] = True

    timer = threading.Timer(delay, start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                progress.stop()


# --- the console script's group: one line per error, never a traceback --------------------


def _unexpected(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return os_problem(exc)
    if isinstance(exc, EOFError):
        return f"unexpected end of input: {_first_line(exc)}"
    message = database_problem(exc)
    if message is not None:
        return message
    return (
        f"internal error: {type(exc).__name__}: {_first_line(exc)} "
        f"(set {DEBUG_ENV}=1 to see the traceback)"
    )


class TracestoreGroup(TyperGroup):
    """The command group: usage errors and unexpected failures become one line on stderr.

    CONTRACT: errors go to stderr in one readable line; exit 2 for usage and input errors
    (an unexpected failure too: it is no check that failed), 1 only for a failed check.
    """

    def invoke(self, ctx: Any) -> Any:
        """Run the verb; anything it did not report itself ends as one line."""
        try:
            # An error meant for the user that the verb did not report itself (a bad
            # TRACESTORE_* setting read by `serve`, say): as every verb reports it.
            with reported_errors():
                return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, BrokenPipeError):
            # Exits, usage errors and a closed stdout (`| head`): Typer handles them.
            raise
        except Exception as exc:
            if os.environ.get(DEBUG_ENV):
                raise
            fail(_unexpected(exc))

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Parse and run; a usage error is one line naming the --help to read."""
        reflow_help(self)
        run = functools.partial(
            super().main, args, prog_name, complete_var, windows_expand_args=windows_expand_args
        )
        if not standalone_mode:
            return run(standalone_mode=False, **extra)
        try:
            code = run(standalone_mode=False, **extra)
        except NoArgsIsHelpError:
            # `tracestore` alone (or a group alone): building this error printed the help.
            sys.exit(2)
        except UsageError as exc:
            ctx = exc.ctx
            where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            err_console.print(
                f"[bold red]error:[/] {escape(exc.format_message() + where)}",
                highlight=False,
                soft_wrap=True,
            )
            sys.exit(2)
        except typer.TyperException as exc:
            line = escape(exc.format_message())
            err_console.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            # End of input where a prompt wanted more.
            err_console.print("[bold red]error:[/] aborted", highlight=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def reflow_help(command: Any) -> None:
    """Join the single line breaks of `command`'s help paragraphs, and its verbs'.

    Typer (0.29) keeps them in every paragraph after the first, so a docstring wrapped at
    88 columns came out ragged on an 80-column terminal ("row of" / "a run has").
    Paragraphs stay apart; a paragraph marked with click's `\\b` keeps its lines.
    """
    if command.help:
        command.help = "\n\n".join(
            p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
            for p in inspect.cleandoc(command.help).split("\n\n")
        )
    for sub in getattr(command, "commands", {}).values():
        reflow_help(sub)


Verb = Callable[..., None]


# --- the run list's filters, shared by `runs` and `dataset create` -------------------------

EnvOption = Annotated[str | None, typer.Option("--env", help="Runs of this env_id.")]
PolicyOption = Annotated[str | None, typer.Option("--policy", help="Runs of this policy_id.")]
CidOption = Annotated[str | None, typer.Option("--cid", help="Runs of this correlation id.")]
SinceOption = Annotated[
    str | None,
    typer.Option(
        help="Runs received at or after this time: an ISO date or time (UTC if no zone) "
        "or a duration back from now: 30m, 12h, 7d, 2w."
    ),
]
UntilOption = Annotated[str | None, typer.Option(help="Runs received before this time.")]
TraceKindOption = Annotated[
    str | None,
    typer.Option(
        help="full, wrapped, summary, db_row, empty, unknown, or null (runs sent without a trace)."
    ),
]
HasTrajectoriesOption = Annotated[
    bool | None,
    typer.Option(
        "--has-trajectories/--no-trajectories",
        help="Only runs with (or without) trajectories.",
        show_default=False,
    ),
]
HasDriftOption = Annotated[
    bool | None,
    typer.Option(
        "--has-drift/--no-drift", help="Only runs with (or without) drift.", show_default=False
    ),
]
