"""`tracestore drift`: the drift report and migration gates from the command line."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tracestore.cli.common import (
    DbOption,
    console,
    err_console,
    fail,
    open_store,
    reported_errors,
    settings_for,
)

_RELATIVE = re.compile(r"^(\d+)([dh])$")


class Format(StrEnum):
    """Output formats of `tracestore drift`."""

    table = "table"
    json = "json"
    html = "html"


def parse_when(value: str | None) -> datetime | None:
    """An ISO 8601 date or time (UTC when it has no zone), or `Nd` / `Nh` ago."""
    if value is None:
        return None
    relative = _RELATIVE.match(value.strip())
    if relative:
        n, unit = int(relative.group(1)), relative.group(2)
        return datetime.now(UTC) - (timedelta(days=n) if unit == "d" else timedelta(hours=n))
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 date/time (2026-12-01, 2026-12-01T12:00Z) "
            "nor a relative time (7d, 12h)"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def _recompute(engine: Any, runs: Any, stale: bool, run_ids: list[str], batch_size: int) -> None:
    from tracestore.drift.service import recompute

    progress = Progress(
        TextColumn("recomputing drift"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
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


def drift(
    db: DbOption = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            help="table: figures for a terminal; json: everything, for machines; html: the "
            "self-contained report page (charts inline).",
        ),
    ] = Format.table,
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
            "gates. Without comparable runs there is no rate, and the check passes.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Runs received at or after this time: ISO 8601 (UTC if no zone) or 7d / 12h "
            "ago (default: --days ago)."
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Runs received before this time (default: now).")
    ] = None,
    days: Annotated[
        int, typer.Option(min=1, help="Without --since: report on the last DAYS days.")
    ] = 30,
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
        typer.Option("--run", metavar="RUN_ID", help="With --recompute: only this run (repeat)."),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, help="With --recompute: runs per transaction.")
    ] = 100,
) -> None:
    """The drift report: drift rate, findings by kind and day, worst runs, migration gates.

    Exit status: 0 success; 1 when --fail-above is given and the drift rate is above it;
    2 usage or input error.
    """
    from tracestore.db.uow import read_session
    from tracestore.drift.report import render_html, render_table, report_json
    from tracestore.drift.service import DriftFilter, report_data, window
    from tracestore.store.runs import RunFilter

    if (stale or run) and not recompute:
        fail("--stale and --run go with --recompute")
    start, end = parse_when(since), parse_when(until)
    with reported_errors():
        if recompute:
            engine = open_store(db)
            _recompute(
                engine,
                RunFilter(env_id=env, policy_id=policy, since=start, until=end),
                stale,
                run or [],
                batch_size,
            )
        else:
            engine = open_store(db, create_new_sqlite=False)
        start, end = window(start, end, days)
        f = DriftFilter(RunFilter(env_id=env, policy_id=policy, since=start, until=end), kind=kind)
        with read_session(engine) as session:
            report = report_data(
                session,
                f,
                budget=budget if budget is not None else settings_for(db).drift_budget,
            )
        engine.dispose()

    if fmt is Format.table:
        if output is None:
            render_table(report, console)
        else:
            with output.open("w", encoding="utf-8") as out:
                render_table(report, Console(file=out, width=120, no_color=True))
    else:
        text = render_html(report) if fmt is Format.html else report_json(report).decode()
        if output is None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        else:
            output.write_text(text, encoding="utf-8")
    if output is not None:
        err_console.print(f"wrote {output}", highlight=False)

    rate = report["summary"]["drift_rate"]
    if fail_above is not None and rate is not None and rate > fail_above:
        fail(f"drift rate {rate:.2%} is above {fail_above:.2%}", code=1)


def register(app: typer.Typer) -> None:
    """Add the drift verbs to the console script."""
    app.command(name="drift")(drift)
