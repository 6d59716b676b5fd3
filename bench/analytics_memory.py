"""Where a report's memory goes: the calling process (an API worker) against the analytics
child that runs DuckDB, for every named report on a big store.

    python -m bench.analytics_memory [--steps N] [--db sqlite|postgresql] [--url URL]

Builds a store of at least N trajectory steps (default 1,000,000) the way
`bench.reports_bench` does (on PostgreSQL in a database made for the run and dropped at
its end), or reads the store at `--url`. Then runs each named report as
`GET /v1/reports/{name}` does (`tracestore.reports.live.report`, in this process) and
prints, per report, its time, how far this process's resident memory peaked above
where it was, and the analytics children's peak (DuckDB runs there since this
benchmark was written; before, a PostgreSQL store's reports ran in this process).
TRACESTORE_ANALYTICS_MEMORY_LIMIT applies as in the server.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.reports_bench import PG_ADMIN, build, pg_database
from tracestore.db import migrate
from tracestore.db.engine import create_engine

MiB = 1 << 20


def _status(pid: int | str, field: str) -> int:
    """A memory figure of the process's /proc status (VmRSS, VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _children() -> list[int]:
    from tracestore.reports import live

    pool = live._pool  # the pool is this process's own: its children's pids
    procs = pool._processes.values() if pool is not None else []
    return [p.pid for p in procs if p.pid is not None]


def measure(url: str) -> list[tuple[str, float, int, int]]:
    """(report, seconds, how far this process's memory peaked above where it was, the
    analytics children's largest peak) per report."""
    from tracestore.reports import live
    from tracestore.reports.catalog import list_reports
    from tracestore.reports.filters import Filters

    live.query(url, "SELECT 1")  # the child started, the store attached: not counted
    rows = []
    for report in list_reports():
        for pid in ["self", *_children()]:  # restart each process's peak (VmHWM) from now
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        before = _status("self", "VmRSS")
        start = time.perf_counter()
        live.report(url, report.name, Filters())
        took = time.perf_counter() - start
        child = max((_status(pid, "VmHWM") for pid in _children()), default=0)
        rows.append((report.name, took, _status("self", "VmHWM") - before, child))
    live.shutdown()
    return rows


def store_options(parser: argparse.ArgumentParser) -> None:
    """The options choosing the store (`store`), on `parser`."""
    parser.add_argument("--steps", type=int, default=1_000_000, help="minimum trajectory steps")
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--url", help="an existing store to read instead of building one")
    parser.add_argument("--pg", default=PG_ADMIN, help="PostgreSQL admin URL")


@contextmanager
def store(args: argparse.Namespace) -> Iterator[str]:
    """The store `store_options` chose: `--url`, or one of `--steps` built for the run."""
    if args.url:
        yield args.url
        return

    def built(url: str) -> str:
        engine = create_engine(url)
        migrate.upgrade(engine)
        t0 = time.perf_counter()
        counts = build(engine, args.steps)
        print(f"store built in {time.perf_counter() - t0:.1f} s: {counts}")
        engine.dispose()
        return url

    if args.db == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tracestore-analytics-bench-") as work:
            yield built(f"sqlite:///{work}/store.db")
    else:
        with pg_database(args.pg) as pg_url:
            if pg_url is None:
                raise SystemExit("PostgreSQL unreachable: give --db sqlite or --pg URL")
            yield built(pg_url)


def main() -> None:
    """Build or open the store, run every report, print a Markdown table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.analytics_memory", description=__doc__.splitlines()[0]
    )
    store_options(parser)
    with store(parser.parse_args()) as url:
        print("| report | seconds | this process's peak above its start | the child's peak |")
        print("|---|---:|---:|---:|")
        for name, took, here, child in measure(url):
            print(f"| {name} | {took:.2f} | +{here / MiB:,.0f} MiB | {child / MiB:,.0f} MiB |")


if __name__ == "__main__":
    main()
