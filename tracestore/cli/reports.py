"""`tracestore report`, `sql`, `export`: DuckDB analytics from the command line."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tracestore.cli.common import (
    DbOption,
    fail,
    note,
    open_store,
    output_file,
    reported_errors,
    store_url,
    working,
)
from tracestore.reports.filters import WHEN_HELP

if TYPE_CHECKING:
    from rich.table import Table

    from tracestore.reports.catalog import Report
    from tracestore.reports.connection import Analytics
    from tracestore.reports.runner import Result

_NUMERIC = frozenset(
    {"BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT", "DOUBLE", "FLOAT", "DECIMAL"}
)
# On a terminal, a column narrower than this is hard to read: when the columns cannot all
# have it (or their full width), rows are shown one field per line instead.
READABLE_COLUMN = 16


class Format(StrEnum):
    """Output formats of `report` and `sql`."""

    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


_WHEN = WHEN_HELP
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since", help=f"Only runs received at or after this: {_WHEN}.", show_default=False
    ),
]
UntilOption = Annotated[
    str | None,
    typer.Option("--until", help=f"Only runs received before this: {_WHEN}.", show_default=False),
]
EnvOption = Annotated[
    str | None,
    typer.Option(
        "--env",
        help="Only this environment (a trajectory's env_id; for a run, its first "
        "trajectory's, else its trace metadata's).",
        show_default=False,
    ),
]
FormatOption = Annotated[
    Format,
    typer.Option(
        "--format",
        "-f",
        help="table (for people), csv, json (one document with columns, types and rows), "
        "or parquet (needs -o).",
        case_sensitive=False,
    ),
]
OutputOption = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", help="Write to this file instead of stdout.", show_default=False
    ),
]
FromOption = Annotated[
    Path | None,
    typer.Option(
        "--from",
        help="Read what 'tracestore export' wrote (a Parquet snapshot or a Delta lake: "
        "detected) instead of the store (--db).",
        show_default=False,
        file_okay=False,
    ),
]
StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="With --from a Delta lake that several stores export to: the store to read "
        "(its store_id).",
        show_default=False,
    ),
]


DatasetOption = Annotated[
    str | None,
    typer.Option(
        "--dataset",
        help="Only the runs of this dataset ('tracestore dataset create'), from the live store.",
        show_default=False,
    ),
]


@contextmanager
def _dataset_snapshot(db: str | None, dataset: str) -> Iterator[Path]:
    """A temporary Parquet snapshot of exactly the dataset's runs (removed afterwards)."""
    import tempfile

    from tracestore.reports.export import export_dataset

    url = _live_url(db)
    with tempfile.TemporaryDirectory(prefix="tracestore-dataset-") as tmp:
        out = Path(tmp) / dataset
        export_dataset(url, out, dataset)
        yield out


@contextmanager
def _snapshot(snapshot: Path, store: str | None) -> Iterator[Analytics]:
    """DuckDB over a Parquet snapshot or a Delta lake (--from), closed at the end."""
    from tracestore.reports.connection import open_snapshot
    from tracestore.reports.live import extension_dir_from_env

    with open_snapshot(snapshot, store=store, extension_dir=extension_dir_from_env()) as analytics:
        yield analytics


def _live_url(db: str | None) -> str:
    """The store's URL, checked to exist and to have a current schema."""
    from tracestore.db.engine import normalize_url
    from tracestore.reports.connection import attach_target

    url = store_url(db, must_exist=True)
    # Checked before open_store, which would create an empty file for a wrong path.
    attach_target(normalize_url(url))
    open_store(db, create_new_sqlite=False).dispose()
    return url


def _results(
    db: str | None,
    snapshot: Path | None,
    store: str | None,
    on_snapshot: Callable[[Analytics], Result],
    on_live: Callable[[str], Result],
) -> Result:
    """Run on the snapshot (--from) or the live store (--db, read in a safe process)."""
    if snapshot is not None:
        if db is not None:
            fail("give --db or --from, not both")
        with _snapshot(snapshot, store) as analytics:
            return on_snapshot(analytics)
    if store is not None:
        fail("--store picks a store of a lake read with --from")
    return on_live(_live_url(db))


def _emit(result: Result, fmt: Format, output: Path | None) -> None:
    from tracestore.reports import output as out

    for notice in result.notices:
        note(notice)
    if fmt is Format.parquet:
        if output is None:
            fail("--format parquet writes a file: give -o FILE")
        data = out.to_parquet(result)
    elif fmt is Format.json:
        data = out.to_json(result)
    elif fmt is Format.csv:
        data = out.to_csv(result).encode()
    else:
        data = _table_text(result, to_terminal=output is None and sys.stdout.isatty())
    if output is not None:
        with output_file(output) as sink:
            sink.write(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def _table_text(result: Result, *, to_terminal: bool, width: int | None = None) -> bytes:
    """The result as text for people: a table; on a terminal too narrow for its columns,
    long cells fold onto more lines, and when even that leaves a column unreadable, one
    record per block with a line per field (like psql's expanded display)."""
    import io
    import shutil

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from tracestore.reports import output as out

    title = escape(result.report.name) if result.report is not None else None
    rows = out.text_cells(result)
    numeric = [t.split("(")[0] in _NUMERIC for t in result.types]
    columns = result.columns
    natural = [
        max([_text_width(name), *(_text_width(r[i]) for r in rows)])
        for i, name in enumerate(columns)
    ]
    width = width or (shutil.get_terminal_size().columns if to_terminal else None)
    # Rich's default box: a border, then per column two spaces of padding and a border.
    chrome = 1 + 3 * len(columns)
    table = Table(title=title, title_justify="left")
    if width is None or sum(natural) + chrome <= width:
        for name, right in zip(columns, numeric, strict=True):
            table.add_column(Text(name), justify="right" if right else "left")
        for cells in rows:
            table.add_row(*(Text(c) for c in cells))
    elif sum(min(n, READABLE_COLUMN) for n in natural) + chrome <= width:
        # Rich narrows the widest columns first; fold keeps every character of a cell.
        for name, right, n in zip(columns, numeric, natural, strict=True):
            table.add_column(
                Text(name),
                justify="right" if right else "left",
                overflow="fold",
                min_width=min(n, READABLE_COLUMN),
            )
        for cells in rows:
            table.add_row(*(Text(c) for c in cells))
    else:
        table = _records(title, columns, rows)
    buffer = io.StringIO()
    # On a terminal: its width and colours. Piped or to a file: the table's natural
    # width, plain text.
    console = Console(
        file=buffer,
        width=width or 10_000,
        force_terminal=to_terminal,
        no_color=not to_terminal,
        highlight=False,
        emoji=False,
    )
    console.print(table)
    if result.table.num_rows == 0:
        console.print("(no rows)")
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).encode() + b"\n"


def _text_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.splitlines()), default=0)


def _records(title: str | None, columns: list[str], rows: list[list[str]]) -> Table:
    """One block per row: its number, then a line per column (name, value folded)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE, show_header=False)
    table.add_column("column", no_wrap=True, style="bold")
    table.add_column("value", overflow="fold")
    for number, cells in enumerate(rows, start=1):
        table.add_row(Text(f"-[ row {number} ]-", style="dim"), "")
        for i, (name, cell) in enumerate(zip(columns, cells, strict=True)):
            table.add_row(Text(name), Text(cell), end_section=i == len(columns) - 1)
    return table


def report(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="The report to run (see --list).", show_default=False),
    ] = None,
    list_reports: Annotated[
        bool, typer.Option("--list", help="List the reports with a one-line description.")
    ] = False,
    since: SinceOption = None,
    until: UntilOption = None,
    env: EnvOption = None,
    fmt: FormatOption = Format.table,
    output: OutputOption = None,
    db: DbOption = None,
    snapshot: FromOption = None,
    store: StoreOption = None,
    dataset: DatasetOption = None,
) -> None:
    """Run a named DuckDB report over the store (or a snapshot): 'tracestore report --list'.

    Reports are SQL files shipped in tracestore/reports/sql/; they read the store in place
    (SQLite or PostgreSQL, read-only) and give the same figures on a snapshot (--from).
    """
    from tracestore.reports.catalog import get_report
    from tracestore.reports.catalog import list_reports as all_reports

    with reported_errors():
        if list_reports:
            if name is not None:
                fail("give a report NAME or --list, not both")
            _list(all_reports(), fmt)
            return
        if name is None:
            fail("give a report NAME (see 'tracestore report --list')")
        from tracestore.reports.filters import Filters
        from tracestore.reports.runner import run_report

        chosen = get_report(name)
        filters = Filters.parse(since, until, env)
        if fmt is Format.parquet and output is None:
            fail("--format parquet writes a file: give -o FILE")
        from tracestore.reports import live

        if dataset is not None:
            if snapshot is not None or store is not None:
                fail("--dataset reads the live store: no --from or --store")
            with (
                working(f"report {chosen.name} on dataset {dataset}"),
                _dataset_snapshot(db, dataset) as path,
                _snapshot(path, None) as analytics,
            ):
                result = run_report(analytics, chosen, filters)
            _emit(result, fmt, output)
            return
        with working(f"report {chosen.name}"):
            result = _results(
                db,
                snapshot,
                store,
                lambda analytics: run_report(analytics, chosen, filters),
                lambda url: live.report(url, chosen.name, filters),
            )
        _emit(result, fmt, output)


def _list(items: list[Report], fmt: Format) -> None:
    if fmt is Format.json:
        import orjson

        body = [
            {"name": r.name, "description": r.description, "parameters": list(r.parameters)}
            for r in items
        ]
        sys.stdout.buffer.write(orjson.dumps({"reports": body}, option=orjson.OPT_INDENT_2))
        sys.stdout.write("\n")
        return
    width = max((len(r.name) for r in items), default=0)
    for r in items:
        typer.echo(f"{r.name.ljust(width)}  {r.description}")


def sql(
    query: Annotated[
        str,
        typer.Argument(
            metavar="QUERY",
            help="One SELECT over the store's tables (runs, trajectories, steps, traces, "
            "trace_time_steps, trace_events, trace_messages, drift_checks, drift_findings, "
            "legacy_reads) and views (run_facts, episode_facts, step_facts, event_facts, "
            "tool_call_facts); '-' reads it from stdin.",
            show_default=False,
        ),
    ],
    fmt: FormatOption = Format.table,
    output: OutputOption = None,
    db: DbOption = None,
    snapshot: FromOption = None,
    store: StoreOption = None,
) -> None:
    """Run an ad-hoc DuckDB SELECT over the store (read-only) or a snapshot.

    Only one SELECT runs; anything that could write (INSERT, COPY, ATTACH, SET, the
    postgres_*/sqlite_* functions) is refused. Types are normalized: timestamps are
    TIMESTAMPTZ in UTC, JSON columns are DuckDB JSON (use ->> and json_* functions).
    """
    from tracestore.reports.runner import run_sql

    text = sys.stdin.read() if query == "-" else query
    with reported_errors():
        if fmt is Format.parquet and output is None:
            fail("--format parquet writes a file: give -o FILE")
        from tracestore.reports import live

        with working("query"):
            result = _results(
                db,
                snapshot,
                store,
                lambda analytics: run_sql(analytics, text),
                lambda url: live.query(url, text),
            )
        _emit(result, fmt, output)


class ExportFormat(StrEnum):
    """What `export` writes."""

    parquet = "parquet"
    delta = "delta"


def export(
    directory: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="Parquet: a new or empty directory (or, with --incremental, this store's "
            "snapshot to add to). Delta: the lake's directory.",
            file_okay=False,
            show_default=False,
        ),
    ],
    since: SinceOption = None,
    until: UntilOption = None,
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            "-f",
            help="parquet (a snapshot with a manifest) or delta (Delta Lake tables that "
            "several stores and repeated exports share).",
            case_sensitive=False,
        ),
    ] = ExportFormat.parquet,
    incremental: Annotated[
        bool,
        typer.Option(
            "--incremental",
            "--since-last",
            help="Only the runs past the last export into DIR (recorded there); the first "
            "one exports everything. Rerunning is harmless.",
        ),
    ] = False,
    db: DbOption = None,
    dataset: DatasetOption = None,
) -> None:
    """Export the store's tables as Parquet or Delta Lake, partitioned by day.

    DIR/<table>/day=YYYY-MM-DD/*.parquet (the UTC day the run was received; every row of
    a run has its run's day). Every row carries store_id, run_id and ingest_seq. Which
    runs go is cut on ingest_seq, in commit order: with --incremental a nightly job
    takes every run exactly once while ingest goes on. A Delta export replaces the rows
    of the runs it carries (never duplicates them); with --since/--until it replaces
    whole days. Run reports on either with --from DIR; Spark, Trino and DuckDB read them
    directly (docs/ANALYTICS.md, docs/SCALING.md). Raw documents are not exported.
    """
    from tracestore.db import migrate
    from tracestore.reports import live
    from tracestore.reports.filters import Filters

    with reported_errors(), working(f"exporting to {directory}"):
        filters = Filters.parse(since, until, None)
        url = _live_url(db)
        engine = open_store(db, create_new_sqlite=False)
        try:
            revision = migrate.current_revision(engine)
        finally:
            engine.dispose()
        if dataset is not None:
            # A new Parquet snapshot of exactly the dataset's runs (its manifest names it).
            if incremental or fmt is not ExportFormat.parquet or since or until:
                fail("--dataset exports a new Parquet snapshot: no --incremental, delta or window")
            from tracestore.reports.export import export_dataset

            summary = export_dataset(url, directory, dataset, schema_revision=revision)
        else:
            summary = live.export(
                url,
                directory,
                filters,
                fmt=fmt.value,
                incremental=incremental,
                schema_revision=revision,
            )
    for notice in summary.notices:
        note(notice)
    typer.echo(summary.line())


def register(app: typer.Typer) -> None:
    """Add the analytics verbs to the console script."""
    app.command(name="report")(report)
    app.command(name="sql")(sql)
    app.command(name="export")(export)
