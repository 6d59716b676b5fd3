"""`tracestore convert` (files, offline) and `tracestore backfill` (the store)."""

from __future__ import annotations

import gzip
import re
import sys
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, cast

import typer

from tracestore.cli.common import (
    DbOption,
    console,
    err_console,
    fail,
    open_store,
    output_file,
    reported_errors,
)
from tracestore.errors import TracestoreError

SHOW_PROBLEMS = 20
_INDEX = re.compile(r"\[\d+\]")

convert_app = typer.Typer(
    help=(
        "Convert rollout files between legacy trajectories and v3 traces, offline (nothing "
        "is stored). Reads .json (a rollout or an array), .jsonl/.ndjson and their .gz; "
        "writes JSONL (gzipped when OUT ends in .gz), one converted rollout per line."
    ),
    no_args_is_help=True,
)

FileArg = Annotated[
    Path,
    typer.Argument(help="Input file.", exists=True, dir_okay=False, readable=True),
]
OutOption = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Output file (default: standard output)."),
]
LossesOption = Annotated[
    Path | None,
    typer.Option("--losses", help="Also write each rollout's loss report and provenance (JSONL)."),
]


def _open_out(path: Path | None, stack: ExitStack) -> IO[bytes]:
    if path is None:
        return sys.stdout.buffer
    out = stack.enter_context(output_file(path))
    if path.name.endswith(".gz"):
        zipped = stack.enter_context(gzip.GzipFile(filename=path.name, mode="wb", fileobj=out))
        return cast(IO[bytes], zipped)  # a GzipFile is a binary file object
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def _refuse_overwriting(path: Path, out: Path | None, losses: Path | None) -> None:
    """Fail before anything is opened when an output is the input, or both outputs are
    one file: opening it for writing emptied it before a line was read."""
    for option, target in (("-o", out), ("--losses", losses)):
        if target is not None and _same_file(target, path):
            fail(f"{option} {target} is the input file: converting would erase it")
    if out is not None and losses is not None and (out == losses or _same_file(out, losses)):
        fail(f"-o and --losses name the same file ({out}): give each its own")


def _convert_file(
    target: str, path: Path, out: Path | None, losses: Path | None, replace: bool
) -> None:
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from tracestore.convert import convert_document
    from tracestore.convert.numbers import report_rounded
    from tracestore.ingest.files import UnreadableFile, iter_file, stored_size
    from tracestore.ingest.parse import validate_rollout
    from tracestore.jsontext import dumps, loads_whole, may_hold_inexact_numbers

    counts: Counter[str] = Counter()
    loss_kinds: Counter[str] = Counter()
    problems: list[str] = []
    warnings: list[str] = []
    # A trace made here came to be when its file was written: the file's time stands in
    # for a creation time the trajectories do not hold (deterministic for a given file).
    created_at = _file_time(path)
    unreadable: str | None = None
    steps = 0
    started = time.perf_counter()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} bytes"),
        TimeRemainingColumn(),
        console=err_console,
        disable=out is None and not err_console.is_terminal,
    )
    _refuse_overwriting(path, out, losses)
    with reported_errors(), ExitStack() as stack, progress:
        sink = _open_out(out, stack)
        report = _open_out(losses, stack) if losses else None
        task = progress.add_task(escape(path.name), total=stored_size(path))
        items = iter_file(path, lambda n: progress.update(task, completed=n))
        while True:
            try:
                item = next(items)
            except StopIteration:
                break
            except UnreadableFile as exc:
                # What was converted before stays written; the summary says what went wrong.
                unreadable = exc.message
                break
            try:
                if isinstance(item.value, TracestoreError):
                    raise item.value
                doc = validate_rollout(item.value)
                again = may_hold_inexact_numbers(item.raw)
                if again:
                    # orjson read an integer past 64 bits as a float, 1e-400 as 0.0: read
                    # again with integers whole (convert/numbers.py), not holding both.
                    del doc
                    item.value = None
                    doc = loads_whole(item.raw)
                new_doc, conversion = convert_document(
                    doc, target, replace=replace, created_at=created_at
                )
                if again:
                    conversion = report_rounded(conversion, new_doc)
            except TracestoreError as exc:
                counts["invalid"] += 1
                problems.append(f"{item.where}: {exc.message}")
                continue
            sink.write(dumps(new_doc) + b"\n")
            if report is not None:
                line = {"run_id": doc.get("run_id"), **conversion.report()}
                report.write(dumps(line) + b"\n")
            counts[conversion.action] += 1
            warnings.extend(f"{item.where}: {w}" for w in conversion.warnings)
            if conversion.action == "kept":
                counts["kept, rounded"] += not conversion.lossless
                continue
            counts["converted"] += 1
            counts["lossless" if conversion.lossless else "with losses"] += 1
            loss_kinds.update(_INDEX.sub("[]", entry.path) for entry in conversion.losses)
            steps += sum(len(t.get("steps") or []) for t in new_doc.get("trajectories") or [])
    elapsed = time.perf_counter() - started
    if unreadable is not None and not counts:
        fail(unreadable)  # nothing read: the one line says it all
    err_console.print(
        f"{counts['converted']} converted ({counts['lossless']} lossless, "
        f"{counts['with losses']} with losses; {counts['replaced']} replaced a part the "
        f"document had), {counts['kept']} kept as sent, {counts['invalid']} invalid, "
        f"{steps} steps in {elapsed:.2f}s",
        highlight=False,
        soft_wrap=True,
    )
    for warning in warnings[:SHOW_PROBLEMS]:
        err_console.print(
            f"  [yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True
        )
    if len(warnings) > SHOW_PROBLEMS:
        err_console.print(f"  ... and {len(warnings) - SHOW_PROBLEMS} more warnings")
    if counts["kept"] and not replace:
        # Unchanged but for the numbers no double holds (each said in a warning above).
        rounded = counts["kept, rounded"]
        but = f" ({rounded} with numbers written rounded)" if rounded else ""
        err_console.print(
            f"  {counts['kept']} rollouts already had a {target} and were written "
            f"unchanged{but}: --replace converts over it",
            highlight=False,
            soft_wrap=True,
        )
    if loss_kinds:
        top = ", ".join(f"{k} x{n}" for k, n in loss_kinds.most_common(8))
        err_console.print(f"  losses: {escape(top)}", highlight=False)
    for problem in problems[:SHOW_PROBLEMS]:
        err_console.print(f"  invalid: {escape(problem)}", highlight=False, soft_wrap=True)
    if len(problems) > SHOW_PROBLEMS:
        err_console.print(f"  ... and {len(problems) - SHOW_PROBLEMS} more")
    if unreadable is not None:
        fail(unreadable)
    if problems:
        raise typer.Exit(2)


def _file_time(path: Path) -> str | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).isoformat()
    except OSError:
        return None  # a pipe or a vanished file: no creation time


ReplaceOption = Annotated[
    bool,
    typer.Option(
        "--replace",
        help="Convert over a part the rollout already has (by default it is kept as sent). "
        "A conversion that gives nothing never replaces a real part.",
    ),
]


@convert_app.command("to-trace")
def to_trace(
    file: FileArg,
    output: OutOption = None,
    losses: LossesOption = None,
    replace: ReplaceOption = False,
) -> None:
    """Fill each rollout's missing `trace` from its trajectories (lossless; round-trips exactly)."""
    _convert_file("trace", file, output, losses, replace)


@convert_app.command("to-trajectories")
def to_trajectories(
    file: FileArg,
    output: OutOption = None,
    losses: LossesOption = None,
    replace: ReplaceOption = False,
) -> None:
    """Fill each rollout's missing `trajectories` from its trace (what it lacks is reported)."""
    _convert_file("trajectories", file, output, losses, replace)


def backfill(
    db: DbOption = None,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Runs converted per transaction (a kill loses one batch).")
    ] = 100,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many runs (default: all).")
    ] = None,
) -> None:
    """Store converted traces for legacy-only runs (trajectories, no trace).

    Batched and idempotent: rerun it after a kill and it continues; runs it already
    converted are not touched. Safe alongside live ingest, and on PostgreSQL several
    backfills can run at once (each locks its batch with SKIP LOCKED).
    """
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from tracestore.backfill import BackfillResult, count_pending
    from tracestore.backfill import backfill as run_backfill

    with reported_errors():
        # A store to backfill must exist: a mistyped path gets an error, not a new file.
        engine = open_store(db, create_new_sqlite=False)
        pending = count_pending(engine)
        total_runs = pending if limit is None else min(pending, limit)
        started = time.perf_counter()
        progress = Progress(
            TextColumn("backfill"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err_console,
            disable=not err_console.is_terminal,  # piped or logged, the summary says it
        )
        with progress:
            task = progress.add_task("backfill", total=total_runs)

            def advance(batch: BackfillResult) -> None:
                progress.advance(task, batch.runs + batch.skipped + len(batch.failed))

            result = run_backfill(engine, batch_size=batch_size, limit=limit, on_batch=advance)
        engine.dispose()
    elapsed = time.perf_counter() - started
    console.print(
        f"backfill: {result.runs} runs converted ({result.steps} steps) in {elapsed:.1f}s; "
        f"{result.skipped} already converted by another backfill; {len(result.failed)} failed; "
        f"{max(pending - result.runs - result.skipped, 0)} still pending",
        highlight=False,
    )
    for run_id, reason in list(result.failed.items())[:SHOW_PROBLEMS]:
        line = escape(f"  failed: {run_id}: {reason}")  # text, not markup
        console.print(line, highlight=False, soft_wrap=True)
    if result.failed:
        fail(f"{len(result.failed)} runs could not be converted (listed above)")


def register(app: typer.Typer) -> None:
    """Add the conversion verbs to the console script."""
    app.add_typer(convert_app, name="convert")
    app.command(name="backfill")(backfill)
