"""`tracestore drift`: the drift report and migration gates from the command line."""

from __future__ import annotations

import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from tracestore.cli.common import (
    DbOption,
    console,
    err_console,
    fail,
    note,
    open_store,
    output_file,
    reported_errors,
    settings_for,
)
from tracestore.cli.remote import ReadKeyOption, ReadUrlOption, remote_client, server_url
from tracestore.timewindow import DEFAULT_WINDOW_DAYS, MAX_WINDOW_DAYS


class Format(StrEnum):
    """Output formats of `tracestore drift`."""

    table = "table"
    json = "json"
    html = "html"


def parse_when(value: str | None, name: str = "time") -> datetime | None:
    """--since / --until in the one grammar of every verb and route (tracestore.timewindow)."""
    from tracestore.errors import InvalidRequest
    from tracestore.timewindow import parse_optional

    try:
        return parse_optional(value, name=name)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None


def _recompute(
    engine: Any, runs: Any, stale: bool, run_ids: list[str], batch_size: int
) -> list[str]:
    """Recompute with a progress bar and a summary line; the --run ids not in the store."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from tracestore.drift.recompute import recompute

    progress = Progress(
        TextColumn("recomputing drift"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=not err_console.is_terminal,  # piped or logged, the summary says it
    )
    with progress:
        task = progress.add_task("recompute", total=None)
        result = recompute(
            engine,
            runs,
            stale_only=stale,
            run_ids=run_ids,
            batch_size=batch_size,
            on_total=lambda n: progress.update(task, total=n),
            progress=lambda n: progress.advance(task, n),
        )
    err_console.print(
        f"recomputed {result.recomputed} of {result.selected} runs in {result.batches} "
        f"batches; {result.with_drift} with findings",
        highlight=False,
    )
    return result.missing


def drift(
    db: DbOption = None,
    url: ReadUrlOption = None,
    api_key: ReadKeyOption = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            help="table: figures for a terminal; json: everything, for machines; html: the "
            "self-contained report page (charts inline).",
        ),
    ] = Format.table,
    as_json: Annotated[bool, typer.Option("--json", help="The same as --format json.")] = False,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Write the report to this file (default: stdout)."),
    ] = None,
    fail_above: Annotated[
        float | None,
        typer.Option(
            "--fail-above",
            min=0,
            max=1,
            metavar="RATE",
            help="Exit 1 when the drift rate (a fraction: 0.001 = 0.1%) is above RATE; for CI "
            "gates. Without comparable runs there is no rate, and the check passes (a note "
            "on stderr says nothing was checked).",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Runs received at or after this time: an ISO date or time (UTC if no zone) "
            "or a duration back from now: 30m, 12h, 7d, 2w (default: --days ago)."
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Runs received before this time (default: now).")
    ] = None,
    days: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_WINDOW_DAYS,  # as the API's `days`: --url and --db take the same
            help="Without --since: report on the last DAYS days.",
        ),
    ] = DEFAULT_WINDOW_DAYS,
    env: Annotated[
        str | None, typer.Option("--env", help="Only runs with a trajectory of this env_id.")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help="Only runs with a trajectory of this policy_id."),
    ] = None,
    kind: Annotated[
        str | None,
        typer.Option(help="Count only this drift kind (e.g. reward_mismatch) as drift."),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=1,
            help="Phase 2 drift budget (default: TRACESTORE_DRIFT_BUDGET, 0.001).",
        ),
    ] = None,
    recompute: Annotated[
        bool,
        typer.Option(
            "--recompute",
            help="First recompute the stored findings (after the comparison changed, or for "
            "runs stored before drift checks existed) of the runs matched by --env, "
            "--policy, --since, --until and --run (all runs when none is given). One "
            "transaction per batch: safe to interrupt and run again.",
        ),
    ] = False,
    stale: Annotated[
        bool,
        typer.Option(
            "--stale",
            help="With --recompute: only runs never checked or checked by another "
            "comparator or converter version (resumes an interrupted recompute).",
        ),
    ] = False,
    run: Annotated[
        list[str] | None,
        typer.Option(
            "--run",
            metavar="RUN_ID",
            help="With --recompute: only this run (repeat). A run id not in the store is "
            "named and the exit status is 2; the others are still recomputed.",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, help="With --recompute: runs per transaction.")
    ] = 100,
) -> None:
    """The drift report: drift rate, findings by kind and day, worst runs, migration gates.

    Exit status: 0 success; 1 when --fail-above is given and the drift rate is above it;
    2 usage or input error (also a --run id that is not in the store).
    """
    from tracestore.db.uow import read_session
    from tracestore.drift.gates import report_data
    from tracestore.drift.queries import DriftFilter, window
    from tracestore.drift.report import render_html, render_table, report_json
    from tracestore.store.runs import RunFilter

    if (stale or run) and not recompute:
        fail("--stale and --run go with --recompute")
    if as_json:
        fmt = Format.json
    start, end = parse_when(since, "--since"), parse_when(until, "--until")
    remote = server_url(db, url)
    missing: list[str] = []
    if remote is not None:
        if recompute:
            fail("--recompute writes to the store: run it with --db, not --url")
        from tracestore.drift.models import DriftReport

        # The server reads since/until with the same grammar, against its own clock.
        params: dict[str, object] = {"since": since, "until": until, "env_id": env}
        params |= {"policy_id": policy, "kind": kind, "budget": budget, "days": days}
        with remote_client(remote, api_key) as client:
            body = client.drift_report(**{k: str(v) for k, v in params.items() if v is not None})
        report = DriftReport.model_validate(body)
    else:
        with reported_errors():
            if recompute:
                engine = open_store(db)
                missing = _recompute(
                    engine,
                    RunFilter(env_id=env, policy_id=policy, since=start, until=end),
                    stale,
                    run or [],
                    batch_size,
                )
            else:
                engine = open_store(db, create_new_sqlite=False)
            start, end = window(start, end, days)
            runs = RunFilter(env_id=env, policy_id=policy, since=start, until=end)
            with read_session(engine) as session:
                report = report_data(
                    session,
                    DriftFilter(runs, kind=kind),
                    budget=budget if budget is not None else settings_for(db).drift_budget,
                )
            engine.dispose()

    if fmt is Format.table:
        if output is None:
            render_table(report, console)
        else:
            import io

            from rich.console import Console

            buffer = io.StringIO()
            render_table(report, Console(file=buffer, width=120, no_color=True, emoji=False))
            with reported_errors(), output_file(output) as out:
                out.write(buffer.getvalue().encode())
    else:
        text = render_html(report) if fmt is Format.html else report_json(report).decode()
        if output is None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        else:
            with reported_errors(), output_file(output) as out:
                out.write(text.encode())
    if output is not None:
        err_console.print(f"wrote {output}", highlight=False, markup=False)

    if missing:
        # After the report: the runs that exist were recomputed and are reported on.
        fail(f"--run names no stored run: {', '.join(repr(r) for r in missing)}")
    rate = report.summary.drift_rate
    if fail_above is not None and rate is None:
        # The check passes (as --help says), but a CI log must show it checked nothing:
        # a mistyped --env would otherwise pass forever.
        matched = report.summary.runs
        why = (
            f"none of the {matched} runs matching the filters is comparable"
            if matched
            else "no runs match the filters"
        )
        note(f"--fail-above checked nothing: {why}, so there is no drift rate")
    if fail_above is not None and rate is not None and rate > fail_above:
        fail(f"drift rate {rate:.2%} is above {fail_above:.2%}", code=1)


def register(app: typer.Typer) -> None:
    """Add the drift verbs to the console script."""
    app.command(name="drift")(drift)
