"""Read verbs over the API: `--url` (or TRACESTORE_URL) instead of `--db`, and their tables.

`show`, `cid`, `runs` and `drift` read either the database (`--db`, the default) or a
running server (`--url URL`; TRACESTORE_URL when neither --db nor TRACESTORE_DATABASE_URL
is given), through the Python client, so a person with only the server's address (and a
key) reads what is stored.
Tables never cut an id: when the columns do not fit the terminal, each row becomes a
block of `name value` lines (like psql's expanded display) that the terminal wraps.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tracestore.cli.common import console, err_console, fail

if TYPE_CHECKING:
    from tracestore.client import TracestoreClient

URL_ENV = "TRACESTORE_URL"
DATABASE_ENV = "TRACESTORE_DATABASE_URL"

ReadUrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help=f"Read from a running server at this base URL instead of --db (default: {URL_ENV} "
        f"when neither --db nor {DATABASE_ENV} names a store).",
        show_default=False,
    ),
]
ReadKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", envvar="TRACESTORE_API_KEY", help="API key for --url."),
]


def server_url(db: str | None, url: str | None) -> str | None:
    """The server to read from, or None for the database: --url, else TRACESTORE_URL unless
    --db or TRACESTORE_DATABASE_URL names a store. Both options at once is a usage error."""
    if url and db:
        fail("give --db or --url, not both")
    if url:
        return url
    # The contract's default for --db is TRACESTORE_DATABASE_URL: a store named there is
    # the one meant (a task-app host may export TRACESTORE_URL for its client as well).
    if db:
        return None
    if os.environ.get(DATABASE_ENV):
        if os.environ.get(URL_ENV):
            # Said, so a user who meant the server sees why the store answered.
            err_console.print(
                f"note: {DATABASE_ENV} names the store, so {URL_ENV} is not used (give "
                "--url to go through the server)",
                highlight=False,
                markup=False,
            )
        return None
    return os.environ.get(URL_ENV) or None


@contextmanager
def remote_client(url: str, api_key: str | None) -> Iterator[TracestoreClient]:
    """A client on the server; its refusals and an unreachable server become one line."""
    import httpx

    from tracestore.client import TracestoreClient, TracestoreHTTPError
    from tracestore_client.cli import route_client_logs

    # The error line says what happened; the client's retry warnings would repeat it.
    route_client_logs(verbose=False)
    try:
        with TracestoreClient(url, api_key=api_key, max_retries=2, timeout=120) as client:
            yield client
    except TracestoreHTTPError as exc:
        error = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
        message = error.get("message") if isinstance(error, dict) else None
        fail(f"{message or exc} ({url} answered {exc.status})")
    except (OSError, httpx.TransportError) as exc:
        fail(f"cannot reach {url}: {exc}")


# --- tables that never cut an id ----------------------------------------------------------


def _width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.splitlines()), default=0)


def print_rows(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: frozenset[str] = frozenset(),
    width: int | None = None,
) -> None:
    """Print rows as a table when it fits the terminal (or the output is not a terminal),
    else as one block per row; every cell is printed whole."""
    from rich.table import Table
    from rich.text import Text

    to_terminal = console.is_terminal
    if width is None and (to_terminal or os.environ.get("COLUMNS")):
        # A terminal's width; COLUMNS set by hand asks for that width anywhere.
        width = shutil.get_terminal_size().columns
    natural = [max([_width(c), *(_width(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    # Rich's default box: a border, then per column two spaces of padding and a border.
    if width is None or sum(natural) + 1 + 3 * len(columns) <= width:
        table = Table(title=Text(title) if title else None, title_justify="left")
        for name in columns:
            table.add_column(
                Text(name), justify="right" if name in numeric else "left", no_wrap=True
            )
        for cells in rows:
            table.add_row(*(Text(c) for c in cells))
        out = console if to_terminal else _plain()
        out.print(table)
        return
    if title:
        console.print(Text(title, style="bold"))
    label = max(_width(c) for c in columns)
    for number, cells in enumerate(rows, start=1):
        console.print(Text(f"-[ {number} ]-", style="dim"))
        for name, cell in zip(columns, cells, strict=True):
            # Soft wrap: the terminal folds a long id, and copying it gives it whole.
            console.print(Text(f"{name.ljust(label)}  {cell}"), soft_wrap=True)


def _plain() -> Any:
    # Piped or redirected: the table at its natural width, without colour.
    from rich.console import Console

    return Console(width=10_000, no_color=True, highlight=False, emoji=False)


def summary_cells(run: dict[str, Any]) -> list[str]:
    """A run summary's cells for RUN_COLUMNS (from the API's JSON or the store's dict)."""
    from datetime import datetime

    received = run.get("received_at")
    if isinstance(received, str):  # the API's JSON
        received = datetime.fromisoformat(received)
    when = received.isoformat(timespec="seconds") if isinstance(received, datetime) else "-"
    mean = run.get("mean_return")
    return [
        run["run_id"],
        when,
        run.get("correlation_id") or "-",
        run.get("correlation_source") or "-",
        run.get("trace_kind") or "-",
        str(run.get("n_steps", "")),
        ",".join(run.get("env_ids") or []) or "-",
        ",".join(run.get("policy_ids") or []) or "-",
        "-" if mean is None else f"{mean:g}",
        ",".join(run.get("drift_kinds") or []) or "-",
    ]


RUN_COLUMNS = (
    "run_id",
    "received_at",
    "cid",
    "source",
    "trace",
    "steps",
    "envs",
    "policies",
    "mean_return",
    "drift",
)
NUMERIC = frozenset({"steps", "mean_return"})


def print_runs(title: str | None, runs: Sequence[dict[str, Any]]) -> None:
    """Run summaries as a table (or blocks), ids whole."""
    print_rows(title, RUN_COLUMNS, [summary_cells(r) for r in runs], NUMERIC)
    if not runs:
        console.print("(no runs)")
