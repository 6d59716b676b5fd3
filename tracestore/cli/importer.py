"""`tracestore import synth-db PATH`: synth-ai's own trace database into the store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from tracestore.cli.common import DbOption, console, err_console, fail, reported_errors
from tracestore.cli.ingest import ApiKeyOption, Tally, UrlOption, send

if TYPE_CHECKING:
    from tracestore.ingest.files import FileItem
    from tracestore.ingest.synth_db import Imported

SHOW_LOSSES = 8

import_app = typer.Typer(
    help=(
        "Import rollouts producers already hold in their own stores. (Rollout archives, "
        "JSON/JSONL dumps of RolloutResponses, go in with `tracestore ingest`.)"
    ),
    no_args_is_help=True,
)


@dataclass
class ImportStats:
    """What an import read: sessions, events, messages, and the losses over all sessions."""

    sessions: int = 0
    events: int = 0
    messages: int = 0
    # (path, kind, detail) -> [sessions affected, occurrences]
    losses: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)

    def add(self, imported: Imported) -> None:
        """Count one rebuilt session."""
        self.sessions += 1
        self.events += imported.n_events
        self.messages += imported.n_messages
        for entry in imported.losses:
            seen = self.losses.setdefault((entry.path, entry.kind, entry.detail), [0, 0])
            seen[0] += 1
            seen[1] += entry.count

    def print(self, source: Path, seconds: float) -> None:
        """The closing lines: what was read, how fast, and what synth-ai's store lost."""
        rate = max(seconds, 1e-9)
        console.print(
            escape(
                f"{self.sessions:,} sessions ({self.events:,} events, {self.messages:,} "
                f"messages) from {source} in {seconds:.2f}s: {self.sessions / rate:,.0f} "
                f"sessions/s, {self.events / rate:,.0f} events/s"
            ),
            highlight=False,
            soft_wrap=True,
        )
        ordered = sorted(self.losses.items(), key=lambda item: (-item[1][0], item[0]))
        for (path, kind, detail), (sessions, count) in ordered[:SHOW_LOSSES]:
            console.print(
                escape(f"  {kind}: {path} ({count:,} in {sessions:,} sessions): {detail}"),
                highlight=False,
                soft_wrap=True,
            )
        if len(ordered) > SHOW_LOSSES:
            console.print(f"  ... and {len(ordered) - SHOW_LOSSES} more kinds of loss")


@import_app.command("synth-db")
def synth_db(
    location: Annotated[
        str,
        typer.Argument(
            metavar="PATH",
            help="synth-ai's trace database: a SQLite file (as its tracer writes it), or "
            "synth-ai's URL of one (sqlite+aiosqlite:///path/to/traces.db).",
            show_default=False,
        ),
    ],
    db: DbOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    run_id_map: Annotated[
        Path | None,
        typer.Option(
            "--map",
            help="run_id per session: a JSON object {session_id: run_id}, or a CSV with "
            "columns session_id,run_id. Sessions it does not name keep their id as run_id.",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        # At most 500: each batch is one `IN (...)` of bound parameters, and older SQLite
        # builds allow 999 per statement.
        int, typer.Option(min=1, max=500, help="Sessions read per read transaction.")
    ] = 64,
) -> None:
    """Import every session of synth-ai's trace database as a trace-only rollout.

    Each session is rebuilt as the v3 trace synth-ai's tracer recorded (its time steps,
    events and messages, rewards and outcome rewards) and stored like a posted rollout:
    run_id from the session id (or --map), metrics from the rewards, the cid from the
    session metadata or the LM call records when the producer put one there, and what
    synth-ai's store could not keep in the document's `tracestore_import` loss report.
    Importing again adds nothing (every session is then a duplicate); an interrupted
    import is finished by running it again. The database is only read.

    Exit status: 0 when every session was created or a duplicate; 2 when the database
    cannot be read, or a session was invalid or conflicts with another rollout stored
    under its run_id.
    """
    if url and db:
        fail("give --db or --url, not both")
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from tracestore.ingest.files import FileItem
    from tracestore.ingest.synth_db import (
        Imported,
        SynthDatabase,
        database_path,
        iter_rollouts,
        read_run_id_map,
    )

    with reported_errors():
        path = database_path(location)
        mapping = read_run_id_map(run_id_map) if run_id_map is not None else None
        source = SynthDatabase(path)
    tally = Tally()
    stats = ImportStats()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sessions"),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
        disable=not err_console.is_terminal,
    )
    started = time.perf_counter()
    with reported_errors(), progress, source:
        ids = source.session_ids()
        without_id = source.sessions_without_id()
        task = progress.add_task(escape(path.name), total=len(ids))

        def items() -> Iterator[FileItem]:
            from tracestore.errors import InvalidRollout

            # Counted as invalid, not left out without a word (the summary said "1
            # sessions" for two rows, exit 0).
            for _ in range(without_id):
                refused = InvalidRollout("a session_traces row without a session_id: not read")
                yield FileItem(b"", refused, "a session without an id")
            for built in iter_rollouts(source, ids, mapping, batch_size):
                progress.advance(task)
                where = f"session {_quoted(built.session_id)}"
                if isinstance(built, Imported):
                    stats.add(built)
                    yield FileItem(built.raw, built.doc, where)
                else:
                    yield FileItem(b"", InvalidRollout(built.message), where)

        send(items(), tally.record, db=db, url=url, api_key=api_key)
    elapsed = time.perf_counter() - started
    tally.print()
    stats.print(path, elapsed)
    if tally.problems:
        raise typer.Exit(2)


def _quoted(session_id: object) -> str:
    """The id as the summary names it: quoted, and an unreadable one's escapes (already
    its text, `h\\xffi`, escaped as repr would) shown once, not doubled by repr."""
    from tracestore.ingest.synth_db import UnreadableId  # lazy, as the command's imports

    if isinstance(session_id, UnreadableId):
        return f"'{session_id}'"
    return repr(session_id)


def register(app: typer.Typer) -> None:
    """Add `tracestore import` to the console script."""
    app.add_typer(import_app, name="import")
