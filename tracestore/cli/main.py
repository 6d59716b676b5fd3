"""The `tracestore` console script."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from tracestore import __version__
from tracestore.cli import convert as convert_cli
from tracestore.cli import dataset as dataset_cli
from tracestore.cli import db as db_cli
from tracestore.cli import drift as drift_cli
from tracestore.cli import importer as importer_cli
from tracestore.cli import reports as reports_cli
from tracestore.cli import retention as retention_cli
from tracestore.cli import spool as spool_cli
from tracestore.cli.common import (
    CidOption,
    DbOption,
    EnvOption,
    HasDriftOption,
    HasTrajectoriesOption,
    PolicyOption,
    SinceOption,
    TraceKindOption,
    TracestoreGroup,
    UntilOption,
    console,
    fail,
    open_store,
    reported_errors,
    settings_for,
    stdout_is_terminal,
    store_url,
)
from tracestore.cli.delete import delete
from tracestore.cli.demo import demo
from tracestore.cli.ingest import ingest
from tracestore.cli.remote import (
    ReadKeyOption,
    ReadUrlOption,
    print_runs,
    remote_client,
    server_url,
)

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
app.command(name="delete")(delete)
convert_cli.register(app)
drift_cli.register(app)
importer_cli.register(app)
reports_cli.register(app)
spool_cli.register(app)
retention_cli.register(app, db_cli.app)
dataset_cli.register(app)


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
    port: Annotated[int, typer.Option(help="TCP port (1-65535).", min=1, max=65535)] = 8000,
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
    from tracestore.api.server import check_address, run_server
    from tracestore.db import migrate
    from tracestore.reports.memory import check_memory_limit

    settings = settings_for(db)
    with reported_errors():
        # The workers' reports would find a bad value one by one, at their first report.
        check_memory_limit()
        if migrate_db:
            from tracestore.db.engine import create_engine

            engine = create_engine(store_url(db, must_exist=False))
            migrate.upgrade(engine)
        else:
            engine = open_store(db, create_new_sqlite=True)
        engine.dispose()
    try:
        # Said before the banner: uvicorn would print its start-up lines, then the bind's
        # errno, and exit 3.
        check_address(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    # Workers are separate processes: they read the same settings from the environment.
    os.environ["TRACESTORE_DATABASE_URL"] = settings.database_url
    console.print(
        f"tracestore {__version__} on http://{host}:{port} "
        f"({engine.dialect.name}, {workers} worker{'s' if workers > 1 else ''}); docs at /docs"
    )
    run_server(
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        # Below info the access log is filtered out, but uvicorn would still format its
        # fields for every request.
        access_log=log_level.lower() in ("trace", "debug", "info"),
    )


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The rollout's run_id.")],
    db: DbOption = None,
    url: ReadUrlOption = None,
    api_key: ReadKeyOption = None,
    pretty: Annotated[
        bool | None,
        typer.Option("--pretty/--raw", help="Indent the JSON (default: when on a terminal)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the document exactly as received (as --raw).")
    ] = False,
) -> None:
    """Print a stored rollout exactly as it was received (from --db, or a server at --url)."""
    remote = server_url(db, url)
    if remote is not None:
        if not run_id:  # as the store answers it (the client refuses an empty run_id)
            fail("no rollout with run_id ''")
        with remote_client(remote, api_key) as client:
            raw = client.get_rollout_bytes(run_id)
    else:
        from tracestore.db.uow import read_session
        from tracestore.store.runs import get_document

        with reported_errors():
            engine = open_store(db, create_new_sqlite=False)
            with read_session(engine) as session:
                raw = get_document(session, run_id)
    if not as_json and (pretty if pretty is not None else stdout_is_terminal()):
        import orjson

        console.print_json(orjson.dumps(orjson.loads(raw)).decode())
    else:
        typer.echo(raw.decode())


@app.command()
def cid(
    correlation_id: Annotated[
        str,
        typer.Argument(
            metavar="CID",
            help="A correlation id, or an inference URL (or a log line) holding one: it is "
            "read with ingest's rules (?cid=, ?trace_correlation_id=, ?trace=).",
        ),
    ],
    db: DbOption = None,
    url: ReadUrlOption = None,
    api_key: ReadKeyOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print the runs of a correlation id (canonical or any trajectory's)."""
    from tracestore.correlation import cid_in_text

    # A pasted URL names its cid; anything else is the cid itself.
    wanted = cid_in_text(correlation_id) or correlation_id
    remote = server_url(db, url)
    if remote is not None:
        with remote_client(remote, api_key) as client:
            body = client.find_by_cid(wanted)
        matched, runs = body["matched_correlation_id"], body["runs"]
    else:
        from tracestore.db.uow import read_session
        from tracestore.store.runs import runs_by_correlation

        with reported_errors():
            engine = open_store(db, create_new_sqlite=False)
            with read_session(engine) as session:
                matched, runs = runs_by_correlation(session, wanted)
    if as_json:
        import orjson

        body = {"correlation_id": wanted, "matched_correlation_id": matched, "runs": runs}
        typer.echo(orjson.dumps(body).decode())
        return
    shown = wanted if matched == wanted else f"{wanted} (as {matched})"
    if wanted != correlation_id:
        shown += " (read from the URL)"
    print_runs(f"runs of {shown}", runs)


@app.command()
def runs(
    env: EnvOption = None,
    policy: PolicyOption = None,
    correlation_id: CidOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    trace_kind: TraceKindOption = None,
    has_trajectories: HasTrajectoriesOption = None,
    has_drift: HasDriftOption = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Runs per page.")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="Start after this cursor (printed under a page).")
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every matching run, following the cursor.")
    ] = False,
    db: DbOption = None,
    url: ReadUrlOption = None,
    api_key: ReadKeyOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print `{items, next_cursor}` as JSON.")
    ] = False,
) -> None:
    """List runs, newest first, with the filters of GET /v1/rollouts (one page, or --all)."""
    from tracestore.cli.drift import parse_when

    # Checked here too, so a typo is one line whatever answers (the server uses the same
    # grammar).
    start, end = parse_when(since, "--since"), parse_when(until, "--until")
    items: list[dict[str, Any]] = []
    next_cursor = cursor
    remote = server_url(db, url)
    if remote is not None:
        from tracestore.client import RunFilters

        wanted = RunFilters(
            correlation_id=correlation_id,
            env_id=env,
            policy_id=policy,
            since=since,
            until=until,
            trace_kind=trace_kind,
            has_trajectories=has_trajectories,
            has_drift=has_drift,
        )
        with remote_client(remote, api_key) as client:
            while True:
                page = client.list_runs(wanted, limit=limit, cursor=next_cursor)
                items += page["items"]
                next_cursor = page.get("next_cursor")
                if not every or next_cursor is None:
                    break
    else:
        from tracestore.db.uow import read_session
        from tracestore.store.runs import RunFilter, list_runs

        with reported_errors():
            engine = open_store(db, create_new_sqlite=False)
            f = RunFilter(
                correlation_id=correlation_id,
                env_id=env,
                policy_id=policy,
                since=start,
                until=end,
                trace_kind=trace_kind,
                has_trajectories=has_trajectories,
                has_drift=has_drift,
            )
            with read_session(engine) as session:
                while True:
                    found, next_cursor = list_runs(session, f, limit=limit, cursor=next_cursor)
                    items += found
                    if not every or next_cursor is None:
                        break
    if as_json:
        from tracestore.api.schemas import RunList

        # Through the API's own model: the same JSON whichever side answered.
        listed = RunList.model_validate({"items": items, "next_cursor": next_cursor})
        typer.echo(listed.model_dump_json())
        return
    print_runs(None, items)
    if next_cursor is not None:
        console.print(f"more: --cursor {next_cursor}  (or --all)", highlight=False, markup=False)
