"""Reports, queries and exports over a live store, without endangering it.

DuckDB reads a SQLite store through its sqlite extension, which carries its own copy of
the SQLite library. Two SQLite libraries must never open the same file in one process:
POSIX advisory locks belong to the process, so when DuckDB's copy closes the file it
drops the locks this process's own connections still hold. The next process to close
the store then believes it is the last user, checkpoints and deletes the WAL under our
live writer, whose later commits go to a deleted file: acknowledged rollouts are lost
(issue 18, item 1). SQLite's documentation warns of exactly this ("How To Corrupt An
SQLite Database File", section 2.2).

So DuckDB's work on a live store runs in a child process (started with `spawn`: it
inherits no descriptors, locks or threads from us) that holds nothing but read-only
handles: its locks are its own, and closing them harms no one. A PostgreSQL store is
read there too, for memory: a report's working set (hundreds of MiB on a store of a
million steps, more on larger ones) would otherwise land in an API worker, past the
bound its ingest keeps to, and stay in its heap; in the child it is bounded by DuckDB's
memory limit (connection.py), and a child that dies anyway takes no worker with it.
Results come back pickled (Arrow tables pickle as Arrow IPC). One DuckDB per store is
kept open in each child: loading the extension and creating the views costs more than
most reports; each call reads fresh data.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy.engine import URL

from tracestore.db.engine import normalize_url
from tracestore.orphans import when_orphaned
from tracestore.reports.spill import (
    new_spill_root,
    remove_if_last,
    remove_spill_root,
    use_spill_root,
)

if TYPE_CHECKING:
    from tracestore.reports.connection import Analytics
    from tracestore.reports.export import ExportSummary
    from tracestore.reports.filters import Filters
    from tracestore.reports.runner import Result
    from tracestore.reports.watermark import Cut

T = TypeVar("T")

# Where to find sqlite_scanner/postgres_scanner .duckdb_extension files instead of the
# PyPI packages' (e.g. binaries vendored by an operator); also how tests force the
# SQLAlchemy fallback. Read by the API and the CLI alike.
EXTENSION_DIR_ENV = "TRACESTORE_DUCKDB_EXTENSION_DIR"
# Child processes for live analytics; two let a long report not hold up a short one.
WORKERS = 2

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
# pool -> the directory its children's DuckDBs spill under: made and removed here, so that
# a child killed mid-spill (the OOM killer) leaves nothing behind once its pool is gone.
_spill_roots: dict[ProcessPoolExecutor, str] = {}
# (url, extension_dir) -> the DuckDB kept open for that store in this process.
_sessions: dict[tuple[str, str | None], Analytics] = {}
_sessions_lock = threading.Lock()


def extension_dir_from_env() -> Path | None:
    """The extension directory named by TRACESTORE_DUCKDB_EXTENSION_DIR, if any."""
    value = os.environ.get(EXTENSION_DIR_ENV)
    return Path(value) if value else None


def report(url: str | URL, name: str, filters: Filters) -> Result:
    """Run the named report over the live store at `url`."""
    return _dispatch(url, _report, name, filters)


def query(url: str | URL, sql: str) -> Result:
    """Run one ad-hoc SELECT over the live store at `url` (read-only)."""
    return _dispatch(url, _query, sql)


def export(
    url: str | URL,
    out: Path,
    filters: Filters,
    *,
    fmt: str = "parquet",
    incremental: bool = False,
    schema_revision: str | None = None,
) -> ExportSummary:
    """Export the live store at `url` into `out` (Parquet or Delta, in full or the runs
    past the last export: reports/export.py)."""
    # The cut is taken here, in the process that may write the store (on SQLite it may
    # sequence runs another writer left without one), before DuckDB reads anything.
    cut = _cut(url)
    return _dispatch(url, _export, out, filters, cut, fmt, incremental, schema_revision)


def _cut(url: str | URL) -> Cut:
    from sqlalchemy.pool import NullPool

    from tracestore.db.engine import create_engine
    from tracestore.reports.watermark import take_cut

    engine = create_engine(normalize_url(url), poolclass=NullPool)
    try:
        return take_cut(engine)
    finally:
        engine.dispose()


# --- where the work runs ------------------------------------------------------------------


def _dispatch(url: str | URL, fn: Callable[..., T], *args: object) -> T:
    text = normalize_url(url).render_as_string(hide_password=False)
    ext = extension_dir_from_env()
    return _in_child(fn, text, str(ext) if ext is not None else None, *args)


def _in_child(fn: Callable[..., T], *args: object) -> T:
    from tracestore.reports.connection import AnalyticsError

    for attempt in (1, 2):
        pool = _worker_pool()
        try:
            return pool.submit(_portable, fn, *args).result()
        except BrokenProcessPool:
            # A child died (killed, out of memory): start new ones and try once more.
            _reset_pool(pool)
            if attempt == 2:
                raise AnalyticsError(
                    "the analytics process died while reading the store; try again"
                ) from None
    raise AssertionError("unreachable")


def _portable(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` in the child, its error made one the parent can unpickle (and DuckDB's
    own, which no caller maps, an AnalyticsError: 503, not 500)."""
    import duckdb

    from tracestore.reports.connection import AnalyticsError
    from tracestore.reports.runner import memory_hint, public_reason

    try:
        return fn(*args)
    except duckdb.Error as exc:  # opening the store, an export: not the report's query
        raise AnalyticsError(f"{public_reason(exc)}{memory_hint(exc)}") from None
    except Exception as exc:
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            # Some extension modules' errors (deltalake's DeltaError) do not pickle: the
            # parent would see a PicklingError instead of the reason.
            raise AnalyticsError(f"{type(exc).__name__}: {exc}") from None
        raise


def _worker_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            spill_root = new_spill_root()
            _pool = ProcessPoolExecutor(
                max_workers=WORKERS,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_child_init,
                initargs=(spill_root, os.getpid()),
            )
            _spill_roots[_pool] = spill_root
        return _pool


def _reset_pool(broken: ProcessPoolExecutor) -> None:
    global _pool
    with _pool_lock:
        if _pool is broken:
            _pool = None
        spill_root = _spill_roots.pop(broken, None)
    # A broken pool's children are being stopped (the executor ends them all): wait for
    # them, so that none still writes where the spill root is removed.
    broken.shutdown(wait=True, cancel_futures=True)
    if spill_root is not None:
        remove_spill_root(spill_root)


def shutdown() -> None:
    """Stop the analytics child processes and close this process's DuckDB sessions."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
        spill_roots = list(_spill_roots.values())
        _spill_roots.clear()
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    for spill_root in spill_roots:
        remove_spill_root(spill_root)
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        session.close()


atexit.register(shutdown)


def _child_init(spill_root: str, parent: int) -> None:
    from tracestore.reports.connection import allow_sqlite_attach

    # Ctrl-C in a terminal reaches the whole process group: the parent stops its children.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    allow_sqlite_attach()
    use_spill_root(spill_root)
    # A parent that dies without stopping its children (SIGKILL, the OOM killer) would
    # leave them running, each holding its DuckDB's memory, for good.
    when_orphaned(parent, functools.partial(_leave_orphaned, spill_root), name="parent-watch")


def _leave_orphaned(spill_root: str) -> None:
    # The parent is gone, and nobody else removes what the pool spilled; the last of the
    # children to notice does (a sibling may still be spilling into it).
    remove_if_last(spill_root)
    os._exit(1)


# --- the work itself (in a child) ---------------------------------------------------------


def _cursor(url: str, ext: str | None, *, fresh: bool = False) -> Analytics:
    """A cursor on the store's kept DuckDB (opened now when absent, or when `fresh`)."""
    from sqlalchemy.pool import NullPool

    from tracestore.db.engine import create_engine
    from tracestore.reports.connection import open_live

    key = (url, ext)
    with _sessions_lock:
        session = _sessions.pop(key, None) if fresh else _sessions.get(key)
        if fresh and session is not None:
            session.close()
            session = None
        if session is None:
            # NullPool: no connection of ours stays open on the store between reads.
            engine = create_engine(url, poolclass=NullPool)
            extension_dir = Path(ext) if ext is not None else None
            session = _sessions[key] = open_live(engine, extension_dir=extension_dir)
        # Made under the lock: the shared connection object is not used by two threads.
        return session.cursor()


def _report(url: str, ext: str | None, name: str, filters: Filters) -> Result:
    import duckdb

    from tracestore.reports.catalog import get_report
    from tracestore.reports.connection import AnalyticsError
    from tracestore.reports.runner import run_report

    chosen = get_report(name)
    try:
        with _cursor(url, ext) as analytics:
            return run_report(analytics, chosen, filters)
    except AnalyticsError as exc:
        if isinstance(exc.__cause__, duckdb.OutOfMemoryException):
            raise  # its own size, not the connection: the same again would fail the same
        # The kept connection may have gone stale (a restarted database, a replaced
        # file): a new one answers, or fails for a reason worth reporting.
        with _cursor(url, ext, fresh=True) as analytics:
            return run_report(analytics, chosen, filters)


def _query(url: str, ext: str | None, sql: str) -> Result:
    from tracestore.reports.runner import run_sql

    with _cursor(url, ext) as analytics:
        return run_sql(analytics, sql)


def _export(
    url: str,
    ext: str | None,
    out: Path,
    filters: Filters,
    cut: Cut,
    fmt: str,
    incremental: bool,
    schema_revision: str | None,
) -> ExportSummary:
    from sqlalchemy.pool import NullPool

    from tracestore.db.engine import create_engine
    from tracestore.reports.export import export_snapshot

    engine = create_engine(url, poolclass=NullPool)
    try:
        return export_snapshot(
            engine,
            out,
            filters,
            cut,
            fmt=fmt,
            incremental=incremental,
            extension_dir=Path(ext) if ext is not None else None,
            schema_revision=schema_revision,
        )
    finally:
        engine.dispose()
