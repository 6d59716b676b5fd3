"""Ingest: documents in, checked and projected outside any transaction, then stored.

Two entry points: `ingest_bytes` (one document, its own transaction: all or nothing) and
`ingest_many` (many documents, each standing or falling alone, a few per transaction).
`prepare` does the Python work (parse, validate, project, compare the two formats);
`tracestore.store.rollouts` does the writing.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine

from tracestore.correlation import resolve_correlation
from tracestore.db.uow import write_connection
from tracestore.drift.rows import drift_rows
from tracestore.errors import TracestoreError
from tracestore.ingest.parse import parse_json, validate_rollout
from tracestore.ingest.project import project_rollout
from tracestore.store.documents import content_hash
from tracestore.store.rollouts import IngestResult, Prepared, store_many
from tracestore.wire.trace import reusing_views

_MISSING = object()


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while documents are parsed and projected.

    Parsed JSON and the rows made from it hold no reference cycles, so a collection finds
    nothing there, yet each one walks every live container: with a batch of parsed
    documents alive that walking was up to half of prepare's time (bench/README.md).
    Reference counting still frees all of it. The collector is process-wide, so pauses
    are counted: it resumes when the last concurrent pause ends, and only if it was on.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def prepare(raw: bytes, doc: Any = _MISSING) -> Prepared:
    """Parse (unless `doc` is given), validate and project one raw document."""
    with cyclic_gc_paused():
        parsed = parse_json(raw) if doc is _MISSING else doc
        valid = validate_rollout(parsed)
        # Projection, drift comparison and the reproduction check each read the trace: once.
        # The cids are resolved once, for the projection and the drift comparison.
        resolution = resolve_correlation(valid)
        with reusing_views():
            rows = project_rollout(valid, resolution)
            drift = drift_rows(valid, resolution)
    return Prepared(doc=valid, raw=raw, digest=content_hash(raw), rows=rows, drift=drift)


# A transaction holds SQLite's single write lock: bound how much one batch does under it.
MAX_ROLLOUTS_PER_TRANSACTION = 64
MAX_BYTES_PER_TRANSACTION = 16 * 1024 * 1024


def _chunks(prepared: Sequence[Prepared]) -> Iterator[list[Prepared]]:
    chunk: list[Prepared] = []
    size = 0
    for item in prepared:
        if chunk and (
            len(chunk) >= MAX_ROLLOUTS_PER_TRANSACTION
            or size + len(item.raw) > MAX_BYTES_PER_TRANSACTION
        ):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += len(item.raw)
    if chunk:
        yield chunk


def store_prepared(engine: Engine, prepared: Sequence[Prepared]) -> list[IngestResult]:
    """Store prepared rollouts, each standing alone (a savepoint each), a few per transaction.

    Sharing a transaction means one commit, so one disk flush, for many rollouts; nothing
    is acknowledged before its transaction commits.
    """
    results: list[IngestResult] = []
    for chunk in _chunks(prepared):
        with write_connection(engine) as conn:
            results.extend(store_many(conn, chunk))
    return results


def ingest_bytes(engine: Engine, raw: bytes, doc: Any = _MISSING) -> IngestResult:
    """Ingest one raw document in its own transaction. Bad input raises (nothing written).

    `doc` is the document already parsed from `raw`, when the caller has it.
    """
    with cyclic_gc_paused():  # see ingest_many
        return store_prepared(engine, [prepare(raw, doc)])[0]


def ingest_many(engine: Engine, items: Sequence[bytes | tuple[bytes, Any]]) -> list[IngestResult]:
    """Ingest several documents (raw bytes, or (bytes, parsed) pairs), each standing or
    falling alone: a bad one becomes an `invalid` result, in its place."""
    # Paused across the batch and its write: its parsed documents are all alive until
    # _ingest_many returns, and reference counting frees them then. Resumed while they
    # were alive, the collector's first pass walked every one of them (a collection of
    # all generations, given how much was allocated meanwhile): 18% of a server's CPU
    # under single posts in groups (bench/README.md).
    with cyclic_gc_paused():
        return _ingest_many(engine, items)


def _ingest_many(engine: Engine, items: Sequence[bytes | tuple[bytes, Any]]) -> list[IngestResult]:
    results: list[IngestResult | None] = []
    ready: list[tuple[int, Prepared]] = []
    for item in items:
        raw, doc = (item, _MISSING) if isinstance(item, bytes) else item
        try:
            if doc is _MISSING:
                doc = parse_json(raw)  # here, so a refusal can still name the run_id
            ready.append((len(results), prepare(raw, doc)))
            results.append(None)
        except TracestoreError as exc:
            run_id = doc.get("run_id") if isinstance(doc, dict) else None
            results.append(
                IngestResult(
                    run_id=run_id if isinstance(run_id, str) else None,
                    status="invalid",
                    error=exc,
                )
            )
    stored = store_prepared(engine, [p for _, p in ready])
    for (index, _), result in zip(ready, stored, strict=True):
        results[index] = result
    return [r for r in results if r is not None]
