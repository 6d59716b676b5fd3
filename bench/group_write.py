"""The group commit's write alone, in-process on PostgreSQL: CPU and wall time per rollout
of `store_many` over groups of N prepared rollouts, one transaction per group, for several
values of db/bulk.py's PIPELINE_MAX_VALUES (0: every table by COPY).

    .venv/bin/python -m bench.group_write [--corpus single|multi] [--groups 1 8 50]
        [--max-values 0 2000 1000000000] [--rollouts 700]

Median of 3 rounds, the settings in turns within each round (bench/README.md item 18).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import fresh_database
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
    parser.add_argument("--rollouts", type=int, default=700)
    args = parser.parse_args(argv)
    n = args.rollouts
    default = bulk.PIPELINE_MAX_VALUES
    with fresh_database("postgresql") as url:
        engine = create_engine(url)
        migrate.upgrade(engine)
        seed = 10_000_000
        try:
            for size in args.groups:
                figures: dict[int, list[tuple[float, float]]] = {}
                for _ in range(3):
                    for max_values in args.max_values:
                        prepared = [prepare(d) for d in corpus(args.corpus, n, start=seed)]
                        seed += n
                        bulk.PIPELINE_MAX_VALUES = max_values  # what write_many's call reads
                        wall, cpu = time.perf_counter(), time.process_time()
                        for i in range(0, n, size):
                            with write_connection(engine) as conn:
                                store_many(conn, prepared[i : i + size])
                        figures.setdefault(max_values, []).append(
                            (
                                (time.perf_counter() - wall) * 1000 / n,
                                (time.process_time() - cpu) * 1000 / n,
                            )
                        )
                for max_values, rounds in figures.items():
                    print(
                        f"{args.corpus} groups of {size:>3}, max values {max_values:>10}: "
                        f"wall {statistics.median(r[0] for r in rounds):.3f} ms, "
                        f"CPU {statistics.median(r[1] for r in rounds):.3f} ms per rollout"
                    )
        finally:
            bulk.PIPELINE_MAX_VALUES = default
            engine.dispose()


if __name__ == "__main__":
    main()
