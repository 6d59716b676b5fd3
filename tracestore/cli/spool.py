"""`tracestore spool status|replay PATH`: look at and deliver a client's spool.

Thin verbs over tracestore_client.cli, which the client-only install runs as
`python -m tracestore_client spool ...`: the same output and exit status from both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracestore.cli.common import fail

app = typer.Typer(
    help=(
        "Look at and deliver a client spool: the rollouts a producer kept while the "
        "server could not take them."
    ),
    no_args_is_help=True,
)

SpoolPath = Annotated[
    Path, typer.Argument(metavar="PATH", help="The spool file (the client's spool= path).")
]


@app.command()
def status(
    path: SpoolPath,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """What a spool holds: rollouts waiting, bytes, first/last, rejected (changes nothing)."""
    import orjson

    from tracestore_client.cli import SpoolCommandError, open_spool, status_lines

    try:
        spool_status = open_spool(path).status()
    except SpoolCommandError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(orjson.dumps(spool_status.as_dict()).decode())
        return
    # Plain text, not Rich markup: a run id like '[/x]' prints as it is.
    typer.echo("\n".join(status_lines(spool_status)))


@app.command()
def replay(
    path: SpoolPath,
    url: Annotated[
        str,
        typer.Option(envvar="TRACESTORE_URL", help="The server to deliver to."),
    ] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None,
        typer.Option(envvar="TRACESTORE_API_KEY", help="API key for --url."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log each retry and batch to stderr.")
    ] = False,
) -> None:
    """Deliver a spool to the server now; what is not delivered stays spooled.

    Exit status: 0 when everything was delivered; 2 when the server could not be reached
    or refused the key (the rollouts stay spooled) or refused rollouts for good (they are
    kept in PATH.rejected).
    """
    from tracestore_client.cli import (
        SpoolCommandError,
        open_spool,
        replay_spool,
        route_client_logs,
    )

    route_client_logs(verbose)
    try:
        report = replay_spool(open_spool(path), url, api_key)
    except SpoolCommandError as exc:
        fail(str(exc))
    if report.lines:
        typer.echo("\n".join(report.lines))
    if report.error:
        fail(report.error)


def register(root: typer.Typer) -> None:
    """Add the `spool` verb group to the root command."""
    root.add_typer(app, name="spool")
