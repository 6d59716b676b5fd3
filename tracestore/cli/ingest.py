"""`tracestore ingest PATH...`: files into the store directly, or into a running server."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from tracestore.cli.common import DbOption, console, err_console, fail, open_store, reported_errors
from tracestore.cli.remote import server_url
from tracestore.errors import TracestoreError
from tracestore.ingest.files import (
    DIRECTORY_PATTERNS,
    FileItem,
    UnreadableFile,
    expand_paths,
    iter_file,
    stored_size,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from tracestore.client import TracestoreClient

BATCH_DOCS = 64
BATCH_BYTES = 8 * 1024 * 1024
SHOW_PROBLEMS = 20
STATUSES = ("created", "duplicate", "conflict", "invalid")
PROBLEMS = ("invalid", "conflict", "refused")

# Shared with `tracestore demo`, which sends its examples the same way.
UrlOption = Annotated[
    str | None,
    typer.Option(
        help="Post to a running server at this base URL instead of --db (default: "
        "TRACESTORE_URL when neither --db nor TRACESTORE_DATABASE_URL names a store).",
        show_default=False,
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(envvar="TRACESTORE_API_KEY", help="API key for --url."),
]
Record = Callable[[FileItem, str, str | None], None]


@dataclass
class Tally:
    """Outcomes of an ingest: counts by status, and why items were invalid or conflicted."""

    counts: Counter[str] = field(default_factory=Counter)
    problems: list[tuple[str, str, str]] = field(default_factory=list)

    def record(self, item: FileItem, status: str, reason: str | None) -> None:
        """Count one item's outcome."""
        self.counts[status] += 1
        if status in PROBLEMS:
            self.problems.append((status, item.where, reason or ""))

    def print(self) -> None:
        """Print the closing summary: counts, then the first problems with their reasons."""
        counts = self.counts
        # `refused` (too large for the server) only appears when it happened.
        shown = [*STATUSES, *(["refused"] if counts["refused"] else [])]
        summary = ", ".join(f"{counts[s]} {s}" for s in shown)
        total = sum(counts.values())
        console.print(f"{total} rollout{'' if total == 1 else 's'}: {summary}")
        for status, where, reason in self.problems[:SHOW_PROBLEMS]:
            # Text, not markup: run ids and paths may hold brackets ('[/x]').
            line = escape(f"  {status}: {where}: {reason}")
            console.print(line, highlight=False, soft_wrap=True)
        if len(self.problems) > SHOW_PROBLEMS:
            console.print(f"  ... and {len(self.problems) - SHOW_PROBLEMS} more")


def _advance(progress: Progress, task: TaskID, start: int, read: int) -> None:
    progress.update(task, completed=start + read)


def _items(
    paths: list[Path | UnreadableFile], progress: Progress, unreadable: list[str]
) -> Iterator[FileItem]:
    """The documents of every file; a file that cannot be read is reported (and added to
    `unreadable`) and the next one read: the documents before the problem still count."""
    sizes = [stored_size(p) if isinstance(p, Path) else 0 for p in paths]
    # A FIFO's size is unknown until it ends: the bar then shows activity, not a fraction.
    total = None if None in sizes else sum(s or 0 for s in sizes)
    task = progress.add_task("ingesting", total=total)
    done = 0
    for path, size in zip(paths, sizes, strict=True):
        try:
            if isinstance(path, UnreadableFile):
                raise path
            progress.update(task, description=escape(path.name))
            yield from iter_file(path, functools.partial(_advance, progress, task, done))
        except UnreadableFile as exc:
            unreadable.append(exc.message)
            progress.console.print(
                f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True
            )
        done += size or 0
        if total is not None:
            progress.update(task, completed=done)


def _batches(
    items: Iterator[FileItem],
    record: Record,
    max_docs: int = BATCH_DOCS,
    max_bytes: int = BATCH_BYTES,
    max_item: int | None = None,
) -> Iterator[list[FileItem]]:
    """Parsed items in batches of at most `max_docs` items and `max_bytes` bytes (as one
    NDJSON body: a newline between items), an item larger than that in a batch of its own;
    on the way, unparseable items are recorded as invalid, and items past `max_item` (the
    server's body limit) as refused."""
    batch: list[FileItem] = []
    size = 0
    for item in items:
        if isinstance(item.value, TracestoreError):
            record(item, "invalid", item.value.message)
            continue
        n = len(item.raw)
        if max_item is not None and n > max_item:
            record(item, "refused", f"{n} bytes, past the server's limit of {max_item} a request")
            continue
        if batch and (len(batch) >= max_docs or size + 1 + n > max_bytes):
            yield batch
            batch, size = [], 0
        size += n + (1 if batch else 0)
        batch.append(item)
    if batch:
        yield batch


def _direct(db: str | None, items: Iterator[FileItem], record: Record) -> None:
    from tracestore.ingest.service import ingest_many

    engine = open_store(db)
    try:
        for batch in _batches(items, record):
            # Each rollout stands alone (its own savepoint); the batch shares a commit.
            results = ingest_many(engine, [(i.raw, i.value) for i in batch])
            for item, result in zip(batch, results, strict=True):
                record(item, result.status, result.error.message if result.error else None)
    finally:
        engine.dispose()


def _remote(url: str, api_key: str | None, items: Iterator[FileItem], record: Record) -> None:
    from tracestore.client import TracestoreClient
    from tracestore_client.cli import route_client_logs

    # The summary and the error line say what happened; the client's retry warnings
    # would repeat it on stderr.
    route_client_logs(verbose=False)
    # A few retries ride out a server restart; a server that stays down fails the command.
    with TracestoreClient(url, api_key=api_key, max_retries=3) as client:
        max_docs, max_body = _server_limits(client)
        batch_bytes = min(BATCH_BYTES, max_body) if max_body else BATCH_BYTES
        for batch in _batches(items, record, max_docs, batch_bytes, max_body):
            _post(client, batch, record)


def _server_limits(client: TracestoreClient) -> tuple[int, int | None]:
    """The most rollouts a batch may hold and the largest body the server takes (None:
    not said), from GET /info: rollouts it takes one by one are then not refused
    together as one batch too large."""
    from tracestore.client import TracestoreHTTPError

    try:
        limits = client.info().get("limits") or {}
    except (TracestoreHTTPError, ValueError):
        # A server without /info, or a proxy's page: the default bounds, and _post's
        # halving of what is refused as too large.
        limits = {}
    max_docs, max_body = limits.get("max_batch_items"), limits.get("max_body_bytes")
    return (
        min(BATCH_DOCS, max_docs) if isinstance(max_docs, int) and max_docs > 0 else BATCH_DOCS,
        max_body if isinstance(max_body, int) and max_body > 0 else None,
    )


def _post(client: TracestoreClient, batch: list[FileItem], record: Record) -> None:
    """Post `batch`; a batch refused as too large (413: the parsed size, say) is posted
    again in halves, and a single rollout refused so is recorded with the server's word."""
    from tracestore.client import TracestoreHTTPError

    try:
        body = client.post_batch([i.raw for i in batch])
    except TracestoreHTTPError as exc:
        if exc.status != 413:
            raise
        if len(batch) == 1:
            record(batch[0], "refused", f"the server refused it: {exc}")
            return
        half = len(batch) // 2
        _post(client, batch[:half], record)
        _post(client, batch[half:], record)
        return
    for item, result in zip(batch, body["results"], strict=True):
        error = result.get("error") or {}
        record(item, result["status"], error.get("message"))


def send(
    items: Iterator[FileItem],
    record: Record,
    *,
    db: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
) -> None:
    """Store `items` in the store at `db`, or post them to the server at `url`; record each.

    Database errors propagate (wrap the call in `reported_errors`); a server that refuses a
    batch or cannot be reached ends the command with one line on stderr.
    """
    if not url:
        _direct(db, items, record)
        return
    import httpx

    from tracestore.client import TracestoreHTTPError

    try:
        _remote(url, api_key, items, record)
    except TracestoreHTTPError as exc:
        fail(f"the server refused the batch: {exc}")
    except (OSError, httpx.TransportError) as exc:
        fail(f"cannot reach {url}: {exc}")


def _print_stopped(tally: Tally, unreadable: list[str], why: str) -> None:
    if tally.counts:
        tally.print()
        _print_unreadable(unreadable)
        console.print(f"{why}: the rollouts after these were not sent")


def _print_unreadable(unreadable: list[str]) -> None:
    if unreadable:
        n = len(unreadable)
        console.print(f"{n} file{'s' if n > 1 else ''} could not be read (named above)")


def ingest(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Files: .json (a rollout or an array), .jsonl/.ndjson (one per line), or "
            "their .gz; FIFOs are read as streams. A directory stands for its files named "
            f"{', '.join(DIRECTORY_PATTERNS)} (sorted, not recursive).",
            show_default=False,
        ),
    ],
    db: DbOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Ingest rollout files, with a progress bar and a closing summary.

    With --url, rollouts go in batches within the server's limits (GET /info); one the
    server will not take even alone (too large) is counted as refused.

    Exit status: 0 when every rollout was created or a duplicate; 2 when any was invalid,
    refused or conflicted with a stored rollout of the same run_id, or a file could not be
    read (each is named as it is met; the other files are still ingested); 130 on Ctrl-C,
    after the summary of what was stored.
    """
    # TRACESTORE_URL as the read verbs take it: exported for them, it was ignored here, and
    # the rollouts went to a new local store while the summary said "created".
    url = server_url(db, url)
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    tally = Tally()
    unreadable: list[str] = []
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
        # Piped or logged, a bar is noise: the summary says it all.
        disable=not err_console.is_terminal,
    )
    try:
        with reported_errors(), progress:
            items = _items(list(expand_paths(paths)), progress, unreadable)
            send(items, tally.record, db=db, url=url, api_key=api_key)
    except typer.Exit:
        # Stopped part-way (the server refused or went away): what was done still counts.
        _print_stopped(tally, unreadable, "stopped at the error above")
        raise
    except KeyboardInterrupt:
        # Ctrl-C on a long ingest: what was stored stays stored, and the summary says what.
        err_console.print("interrupted", highlight=False)
        _print_stopped(tally, unreadable, "interrupted")
        raise typer.Exit(130) from None
    tally.print()
    _print_unreadable(unreadable)
    if tally.problems or unreadable:
        raise typer.Exit(2)
