"""The group commit's write alone, in-process on PostgreSQL: CPU (this process's and its
PostgreSQL backend's) and wall time per rollout of `store_many` over groups of N prepared
rollouts, one transaction per group, for several values of db/bulk.py's
PIPELINE_MAX_VALUES (0: every table by COPY) and PADDED_MAX_ROWS (0: no INSERT padded and
prepared, each one's text made for its row count).

    .venv/bin/python -m bench.group_write [--corpus single|multi] [--groups 1 8 50]
        [--max-values 0 2000 1000000000] [--padded-max 0 64] [--rollouts 700]

Median of 3 rounds, the settings in turns within each round (bench/README.md items 18, 23).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import cpu_seconds, fresh_database
from bench.corpus import corpus
from tracestore.db import bulk, migrate
from tracestore.db.engine import create_engine
from tracestore.db.uow import write_connection
from tracestore.ingest.service import prepare
from tracestore.store.rollouts import store_many


def main(argv: list[str] | None = None) -> None:
    """Print one line per (group size, setting): wall and CPU ms per rollout."""
    parser = argparse.ArgumentParser(prog="python -m bench.group_write", description=__doc__)
    parser.add_argument("--corpus", choices=["single", "multi"], default="single")
    parser.add_argument("--groups", type=int, nargs="*", default=[1, 8, 50])
    parser.add_argument("--max-values", type=int, nargs="*", default=[0, 2000, 10**9])
    parser.add_argument("--padded-max", type=int, nargs="*", default=[bulk.PADDED_MAX_ROWS])
    parser.add_argument("--rollouts", type=int, default=700)
    args = parser.parse_args(argv)
    n = args.rollouts
    default, padded = bulk.PIPELINE_MAX_VALUES, bulk.PADDED_MAX_ROWS
    settings = [(m, p) for m in args.max_values for p in args.padded_max]
    with fresh_database("postgresql") as url:
        engine = create_engine(url, connections=1)  # one backend: its CPU is the figure
        migrate.upgrade(engine)
        seed = 10_000_000
        try:
            for size in args.groups:
                figures: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
                for _ in range(3):
                    for setting in settings:
                        prepared = [prepare(d) for d in corpus(args.corpus, n, start=seed)]
                        seed += n
                        # What write_many's calls read.
                        bulk.PIPELINE_MAX_VALUES, bulk.PADDED_MAX_ROWS = setting
                        with write_connection(engine) as conn:
                            raw: Any = conn.connection.driver_connection
                            backend_pid = raw.info.backend_pid
                        backend = cpu_seconds(backend_pid)
                        wall, cpu = time.perf_counter(), time.process_time()
                        for i in range(0, n, size):
                            with write_connection(engine) as conn:
                                store_many(conn, prepared[i : i + size])
                        figures.setdefault(setting, []).append(
                            (
                                (time.perf_counter() - wall) * 1000 / n,
                                (time.process_time() - cpu) * 1000 / n,
                                (cpu_seconds(backend_pid) - backend) * 1000 / n,
                            )
                        )
                for (max_values, padded_max), rounds in figures.items():
                    print(
                        f"{args.corpus} groups of {size:>3}, max values {max_values:>10}, "
                        f"padded to {padded_max:>3}: "
                        f"wall {statistics.median(r[0] for r in rounds):.3f} ms, "
                        f"CPU {statistics.median(r[1] for r in rounds):.3f} ms, "
                        f"PostgreSQL {statistics.median(r[2] for r in rounds):.3f} ms per rollout"
                    )
        finally:
            bulk.PIPELINE_MAX_VALUES, bulk.PADDED_MAX_ROWS = default, padded
            engine.dispose()


if __name__ == "__main__":
    main()
