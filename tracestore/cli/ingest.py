"""`tracestore ingest PATH...`: files into the store directly, or into a running server."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from tracestore.cli.common import DbOption, console, err_console, fail, open_store, reported_errors
from tracestore.errors import TracestoreError
from tracestore.ingest.files import FileItem, iter_file

BATCH_DOCS = 64
BATCH_BYTES = 8 * 1024 * 1024
SHOW_PROBLEMS = 20


def _advance(progress: Progress, task: TaskID, start: int, read: int) -> None:
    progress.update(task, completed=start + read)


def _items(paths: list[Path], progress: Progress) -> Iterator[FileItem]:
    total = sum(p.stat().st_size for p in paths)
    task = progress.add_task("ingesting", total=total)
    done = 0
    for path in paths:
        progress.update(task, description=path.name)
        yield from iter_file(path, functools.partial(_advance, progress, task, done))
        done += path.stat().st_size
        progress.update(task, completed=done)


def _batches(items: Iterator[FileItem], record: Any) -> Iterator[list[FileItem]]:
    """Parsed items in batches of at most BATCH_DOCS / BATCH_BYTES; unparseable ones are
    recorded as invalid on the way."""
    batch: list[FileItem] = []
    size = 0
    for item in items:
        if isinstance(item.value, TracestoreError):
            record(item, "invalid", item.value.message)
            continue
        batch.append(item)
        size += len(item.raw)
        if len(batch) >= BATCH_DOCS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _direct(db: str | None, items: Iterator[FileItem], record: Any) -> None:
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


def _remote(url: str, api_key: str | None, items: Iterator[FileItem], record: Any) -> None:
    from tracestore.client import TracestoreClient

    # A few retries ride out a server restart; a server that stays down fails the command.
    with TracestoreClient(url, api_key=api_key, max_retries=3) as client:
        for batch in _batches(items, record):
            body = client.post_batch([i.raw for i in batch])
            for item, result in zip(batch, body["results"], strict=True):
                error = result.get("error") or {}
                record(item, result["status"], error.get("message"))


def ingest(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Files: .json (a rollout or an array), .jsonl/.ndjson (one per line), or .gz.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    db: DbOption = None,
    url: Annotated[
        str | None,
        typer.Option(help="Post to a running server at this base URL instead of --db."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="TRACESTORE_API_KEY", help="API key for --url."),
    ] = None,
) -> None:
    """Ingest rollout files, with a progress bar and a closing summary.

    Exit status: 0 when every rollout was created or a duplicate; 2 when any was invalid or
    conflicted with a stored rollout of the same run_id.
    """
    if url and db:
        fail("give --db or --url, not both")
    counts: Counter[str] = Counter()
    problems: list[tuple[str, str, str]] = []

    def record(item: FileItem, status: str, reason: str | None) -> None:
        counts[status] += 1
        if status in ("invalid", "conflict"):
            problems.append((status, item.where, reason or ""))

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
    )
    with reported_errors(), progress:
        items = _items(paths, progress)
        if url:
            import httpx

            from tracestore.client import TracestoreHTTPError

            try:
                _remote(url, api_key, items, record)
            except TracestoreHTTPError as exc:
                fail(f"the server refused the batch: {exc}")
            except (OSError, httpx.TransportError) as exc:
                fail(f"cannot reach {url}: {exc}")
        else:
            _direct(db, items, record)
    summary = ", ".join(f"{counts[s]} {s}" for s in ("created", "duplicate", "conflict", "invalid"))
    console.print(f"{sum(counts.values())} rollouts: {summary}")
    for status, where, reason in problems[:SHOW_PROBLEMS]:
        console.print(f"  {status}: {where}: {reason}", highlight=False, soft_wrap=True)
    if len(problems) > SHOW_PROBLEMS:
        console.print(f"  ... and {len(problems) - SHOW_PROBLEMS} more")
    if problems:
        raise typer.Exit(2)
