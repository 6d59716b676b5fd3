"""What one group of single posts costs, this process and the PostgreSQL server (issue 19).

In-process, `store_group` (the group commit's write: prepare, look-up, keys, rows, commit)
over groups of each size, one transaction each, 1.2 KB rollouts: this process's CPU per
rollout, and on PostgreSQL the CPU of the server's backend (user and system time from
/proc, every `postgres` process of the bench database). The store first holds `--stored`
rollouts, analyzed on PostgreSQL as autovacuum would (0: an empty store, never analyzed:
there the look-up's cached plan scans all of `runs` for each group). Groups of the sizes
take turns, so a slow spell of the machine falls on all of them.

    .venv/bin/python -m bench.group_cost [--db sqlite|postgresql|both] [--groups 1 16 50]
        [--rollouts 4800] [--stored 2000]

To compare two trees, run it as a file with the other tree first on PYTHONPATH:
`PYTHONPATH=/tmp/before python bench/group_cost.py ...`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file: bench/ and the tree on PYTHONPATH importable
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine

from bench.common import fresh_database, pg_available
from bench.concurrency import Seeds
from tracestore.db.engine import create_engine
from tracestore.ingest.group import store_group

TICK = os.sysconf("SC_CLK_TCK")


def postgres_cpu(database: str) -> tuple[float, float]:
    """User and system seconds of the PostgreSQL processes serving `database`."""
    user = system = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if not command.startswith("postgres") or f" {database} " not in f"{command} ":
                continue
            if "autovacuum" in command:
                continue  # a worker vacuuming the database: no group's own cost
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        user += int(fields[11]) / TICK
        system += int(fields[12]) / TICK
    return user, system


def _stored(engine: Engine, seeds: Seeds, n: int) -> None:
    docs = seeds.take("single", n)
    for i in range(0, n, 50):
        store_group(engine, docs[i : i + 50])
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()


def measure(
    backend: str, groups: Sequence[int], rollouts: int, stored: int
) -> dict[int, dict[str, float]]:
    """{group size: {ours, postgres_user, postgres_system}} in ms per rollout."""
    seeds = Seeds()
    totals = {g: {"ours": 0.0, "postgres_user": 0.0, "postgres_system": 0.0} for g in groups}
    with fresh_database(backend) as url:
        engine = create_engine(url, connections=1)
        database = engine.url.database or ""
        try:
            store_group(engine, seeds.take("single", 8))  # connect, warm the caches
            if stored:
                _stored(engine, seeds, stored)
            rounds = max(1, rollouts // sum(groups))
            for _ in range(rounds):
                for g in groups:
                    docs = seeds.take("single", g)
                    pg_before = postgres_cpu(database) if backend == "postgresql" else (0, 0)
                    started = time.process_time()
                    store_group(engine, docs)
                    totals[g]["ours"] += time.process_time() - started
                    if backend == "postgresql":
                        pg_after = postgres_cpu(database)
                        totals[g]["postgres_user"] += pg_after[0] - pg_before[0]
                        totals[g]["postgres_system"] += pg_after[1] - pg_before[1]
        finally:
            engine.dispose()
    return {
        g: {k: 1000 * v / (rounds * g) for k, v in figures.items()} for g, figures in totals.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print a Markdown table."""
    parser = argparse.ArgumentParser(prog="python -m bench.group_cost", description=__doc__)
    parser.add_argument("--db", default="both", choices=["sqlite", "postgresql", "both"])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 16, 50])
    parser.add_argument(
        "--rollouts",
        type=int,
        default=4800,
        help="rollouts in all, shared by the sizes in turns (each size gets its share)",
    )
    parser.add_argument("--stored", type=int, default=2000)
    args = parser.parse_args(argv)
    if min(args.groups) < 1 or args.rollouts < 1 or args.stored < 0:
        parser.error("--groups and --rollouts must be 1 or more, --stored 0 or more")
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        print("PostgreSQL is unreachable: measuring SQLite only")
        backends.remove("postgresql")
    print(
        "| database | group | this process (ms/rollout) | PostgreSQL backend user / system "
        "(ms/rollout) |\n|---|---:|---:|---:|"
    )
    for backend in backends:
        for g, m in measure(backend, args.groups, args.rollouts, args.stored).items():
            server = (
                f"{m['postgres_user']:.3f} / {m['postgres_system']:.3f}"
                if backend == "postgresql"
                else "-"
            )
            print(f"| {backend} | {g} | {m['ours']:.3f} | {server} |", flush=True)


if __name__ == "__main__":
    main()
