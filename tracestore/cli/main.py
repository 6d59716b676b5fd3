"""The `tracestore` console script."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from tracestore import __version__
from tracestore.cli import convert as convert_cli
from tracestore.cli import db as db_cli
from tracestore.cli import drift as drift_cli
from tracestore.cli import importer as importer_cli
from tracestore.cli import reports as reports_cli
from tracestore.cli import spool as spool_cli
from tracestore.cli.common import (
    DbOption,
    TracestoreGroup,
    console,
    open_store,
    reported_errors,
    settings_for,
    stdout_is_terminal,
    store_url,
)
from tracestore.cli.demo import demo
from tracestore.cli.ingest import ingest

app = typer.Typer(
    name="tracestore",
    help=(
        "tracestore: a lossless store for RL rollouts (legacy trajectories and v3 traces), "
        "keyed by run id and trace correlation id.\n\n"
        "Exit status: 0 success, 1 a check failed (e.g. stale schema), 2 usage or input error."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Every error is one line on stderr, never a traceback (CONTRACT).
    cls=TracestoreGroup,
)
app.add_typer(db_cli.app, name="db")
app.command(name="ingest")(ingest)
app.command(name="demo")(demo)
convert_cli.register(app)
drift_cli.register(app)
importer_cli.register(app)
reports_cli.register(app)
spool_cli.register(app)


def _version(value: bool) -> None:
    if value:
        console.print(f"tracestore {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """tracestore command line."""


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
    db: DbOption = None,
    migrate_db: Annotated[
        bool,
        typer.Option(
            "--migrate/--no-migrate",
            help="Upgrade the schema to head before serving (a new SQLite file always is).",
        ),
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run the HTTP API (a new SQLite database file is created and migrated first)."""
    import uvicorn

    from tracestore.db import migrate

    settings = settings_for(db)
    with reported_errors():
        if migrate_db:
            from tracestore.db.engine import create_engine

            engine = create_engine(store_url(db, must_exist=False))
            migrate.upgrade(engine)
        else:
            engine = open_store(db, create_new_sqlite=True)
        engine.dispose()
    # Workers are separate processes: they read the same settings from the environment.
    os.environ["TRACESTORE_DATABASE_URL"] = settings.database_url
    console.print(
        f"tracestore {__version__} on http://{host}:{port} "
        f"({engine.dialect.name}, {workers} worker{'s' if workers > 1 else ''}); docs at /docs"
    )
    uvicorn.run(
        "tracestore.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
    )


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The rollout's run_id.")],
    db: DbOption = None,
    pretty: Annotated[
        bool | None,
        typer.Option("--pretty/--raw", help="Indent the JSON (default: when on a terminal)."),
    ] = None,
) -> None:
    """Print a stored rollout exactly as it was received."""
    from tracestore.db.uow import read_session
    from tracestore.store.runs import get_document

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with read_session(engine) as session:
            raw = get_document(session, run_id)
    if pretty if pretty is not None else stdout_is_terminal():
        import orjson

        console.print_json(orjson.dumps(orjson.loads(raw)).decode())
    else:
        typer.echo(raw.decode())


@app.command()
def cid(
    correlation_id: Annotated[str, typer.Argument(metavar="CID", help="A correlation id.")],
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print the runs of a correlation id (canonical or any trajectory's)."""
    from tracestore.db.uow import read_session
    from tracestore.store.runs import runs_by_correlation

    with reported_errors():
        engine = open_store(db, create_new_sqlite=False)
        with read_session(engine) as session:
            matched, runs = runs_by_correlation(session, correlation_id)
    if as_json:
        import orjson

        body = {"correlation_id": correlation_id, "matched_correlation_id": matched, "runs": runs}
        typer.echo(orjson.dumps(body).decode())
        return
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    # Titles and cells are markup to Rich: ids like '[/x]' are shown as text.
    shown = correlation_id if matched == correlation_id else f"{correlation_id} (as {matched})"
    table = Table(title=f"runs of {escape(shown)}")
    for column in ("run_id", "source", "received_at", "trace", "steps", "envs", "mean_return"):
        table.add_column(column)
    for r in runs:
        table.add_row(
            Text(r["run_id"]),
            r["correlation_source"] or "-",
            r["received_at"].isoformat(timespec="seconds"),
            r["trace_kind"] or "-",
            str(r["n_steps"]),
            Text(",".join(r["env_ids"]) or "-"),
            "-" if r["mean_return"] is None else f"{r['mean_return']:g}",
        )
    console.print(table)
