"""DuckDB's EXPLAIN ANALYZE of named reports on the live SQLite store and on its snapshot.

Shows where a report's time goes on each source (the scans, and whether filters reach
them). Uses the store and snapshot kept by the reports benchmark:

    python -m bench.reports_bench --no-pg --keep /tmp/reports-bench
    python -m bench.reports_profile /tmp/reports-bench models returns rewards
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from tracestore.db.engine import create_engine
from tracestore.reports.catalog import get_report
from tracestore.reports.connection import Analytics, open_live, open_snapshot
from tracestore.reports.filters import Filters


def main() -> None:
    """Print each report's profile on the live store and on the snapshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="the --keep folder of bench.reports_bench")
    parser.add_argument("reports", nargs="*", default=["models", "returns", "rewards", "tools"])
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    engine = create_engine(f"sqlite:///{args.work / f'store-{args.steps}.db'}")
    sources: dict[str, Callable[[], Analytics]] = {
        "live SQLite": lambda: open_live(engine, in_this_process=True),
        "snapshot": lambda: open_snapshot(args.work / f"snapshot-{args.steps}"),
    }
    for label, opener in sources.items():
        analytics = opener()
        try:
            for name in args.reports:
                report = get_report(name)
                params = Filters().bind(report.parameters, report.name)
                start = time.perf_counter()
                rows = analytics.con.sql(
                    "EXPLAIN ANALYZE " + report.sql, params=params or None
                ).fetchall()
                print(f"=== {name} on {label}: {time.perf_counter() - start:.3f} s")
                print(rows[0][1])
        finally:
            analytics.close()
    engine.dispose()


if __name__ == "__main__":
    main()
