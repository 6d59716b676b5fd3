"""Delete throughput and the store's size before and after, on a big store (issue 20).

    python -m bench.delete_bench [--steps N] [--quick] [--no-pg] [--batch-size B]
                                 [--out bench/results/delete]

Builds a store of at least N trajectory steps (default 1,000,000; --quick: 50,000) with
bench/reports_bench.py's builder (producer-shaped runs, received over 30 days), on SQLite
and on PostgreSQL, then on each:

1. deletes 200 single runs as `DELETE /v1/rollouts/{run_id}` does (one transaction each,
   with the audit row): latency p50 / p99;
2. a retention sweep (`tracestore retention apply`'s code) with a rule selecting the runs
   older than 15 days (about half the store), in batches: runs, steps and document bytes
   deleted per second;
3. the store's size before, after the sweep, and after `tracestore db vacuum` (SQLite:
   VACUUM rewrites the file; PostgreSQL: VACUUM (ANALYZE) makes the room reusable, the
   files keep their size). The SQLite file is measured after a WAL checkpoint.

With --incremental (SQLite), the store is first switched to incremental auto-vacuum
(`tracestore db vacuum --incremental`), and the sweep gives the freed pages back after
each batch, as `tracestore retention apply` does on such a store.

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, bindparam, text

from bench.common import fresh_database, pg_available
from bench.reports_bench import build
from tracestore.db.engine import create_engine
from tracestore.db.uow import write_session
from tracestore.durations import parse_age
from tracestore.retention.space import store_size, vacuum
from tracestore.retention.sweep import apply, plan
from tracestore.store.deletion import Deletion, delete_run
from tracestore.store.retention import Rule

# reports_bench.build spreads receive times over 30 days from here.
BUILT_FROM = datetime(2025, 10, 1, tzinfo=UTC)
SINGLE_DELETES = 200


def _checkpoint(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def _size(engine: Engine) -> int:
    _checkpoint(engine)
    return store_size(engine).bytes


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
            for t in ("runs", "steps", "trace_events", "trace_messages", "run_deletions")
        }


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": statistics.median(ordered) * 1e3, "p99_ms": p99 * 1e3}


def bench(url: str, min_steps: int, batch_size: int, incremental: bool) -> dict[str, Any]:
    """Build, delete, sweep and vacuum one store; its figures."""
    engine = create_engine(url)
    t0 = time.perf_counter()
    built = build(engine, min_steps)
    build_s = time.perf_counter() - t0
    print(f"{engine.dialect.name}: built in {build_s:.0f} s: {built}", flush=True)
    switch_s = None
    if incremental and engine.dialect.name == "sqlite":
        # `tracestore db vacuum --incremental`: sweeps then give pages back as they go.
        t0 = time.perf_counter()
        vacuum(engine, incremental=True)
        switch_s = time.perf_counter() - t0
    before = _size(engine)
    counts_before = _counts(engine)

    # 1. Single deletes, as the API does them (newest runs: not the sweep's).
    with engine.connect() as conn:
        victims = list(
            conn.execute(
                text("SELECT run_id FROM runs ORDER BY received_at DESC LIMIT :n"),
                {"n": SINGLE_DELETES},
            ).scalars()
        )
    how = Deletion(by="bench", via="api", reason="bench")
    single: list[float] = []
    for run_id in victims:
        t = time.perf_counter()
        with write_session(engine) as session:
            delete_run(session, run_id, how, datetime.now(UTC))
        single.append(time.perf_counter() - t)

    # 2. The sweep: the runs older than 15 days at the end of the 30 received.
    now = BUILT_FROM + timedelta(days=30)
    rule = Rule("bench-15d", max_age_s=parse_age("15d"))
    t = time.perf_counter()
    planned = plan(engine, [rule], now=now)
    plan_s = time.perf_counter() - t
    planned_pks = [r.pk for r in planned.runs]
    with engine.connect() as conn:
        steps_planned = 0
        for start in range(0, len(planned_pks), 5000):
            chunk = planned_pks[start : start + 5000]
            steps_planned += int(
                conn.execute(
                    text("SELECT count(*) FROM steps WHERE run_pk IN :pks").bindparams(
                        bindparam("pks", expanding=True)
                    ),
                    {"pks": chunk},
                ).scalar_one()
            )
    t = time.perf_counter()
    swept = apply(engine, planned, batch_size=batch_size, vacuum=incremental)
    sweep_s = time.perf_counter() - t
    after_sweep = _size(engine)
    free_after_sweep = store_size(engine).free_bytes
    counts_after = _counts(engine)

    # 3. Space back.
    t = time.perf_counter()
    done = vacuum(engine)
    vacuum_s = time.perf_counter() - t
    after_vacuum = _size(engine)
    engine.dispose()
    return {
        "backend": engine.dialect.name
        + (" (incremental auto-vacuum)" if switch_s is not None else ""),
        "switch_to_incremental_s": switch_s,
        "build_s": build_s,
        "counts_before": counts_before,
        "counts_after": counts_after,
        "single_delete": {"n": len(single), **_ms(single)},
        "sweep": {
            "plan_s": plan_s,
            "seconds": sweep_s,
            "batch_size": batch_size,
            "runs": swept.deleted,
            "steps": steps_planned,
            "doc_bytes": swept.doc_bytes,
            "runs_per_s": swept.deleted / sweep_s,
            "steps_per_s": steps_planned / sweep_s,
        },
        "size": {
            "before": before,
            "after_sweep": after_sweep,
            "free_inside_after_sweep": free_after_sweep,
            "after_vacuum": after_vacuum,
            "vacuum": done,
            "vacuum_s": vacuum_s,
        },
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def markdown(results: list[dict[str, Any]], min_steps: int) -> str:
    """The results as a Markdown table."""
    lines = [
        f"Stores of at least {min_steps:,} trajectory steps (bench/reports_bench.py's builder); "
        f"machine: {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}.",
        "",
        "| | " + " | ".join(r["backend"] for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]

    def row(name: str, fn: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(fn(r) for r in results) + " |")

    row(
        "runs / steps before",
        lambda r: f"{r['counts_before']['runs']:,} / {r['counts_before']['steps']:,}",
    )
    row(
        "single DELETE (one run, one transaction), p50 / p99",
        lambda r: f"{r['single_delete']['p50_ms']:.1f} / {r['single_delete']['p99_ms']:.1f} ms",
    )
    row(
        "sweep: runs (steps) deleted", lambda r: f"{r['sweep']['runs']:,} ({r['sweep']['steps']:,})"
    )
    row(
        "sweep: time (plan)",
        lambda r: f"{r['sweep']['seconds']:.1f} s ({r['sweep']['plan_s']:.1f} s)",
    )
    row(
        "sweep throughput",
        lambda r: (
            f"{r['sweep']['runs_per_s']:,.0f} runs/s, {r['sweep']['steps_per_s']:,.0f} steps/s"
        ),
    )
    row("size before", lambda r: _mb(r["size"]["before"]))
    row("size after the sweep", lambda r: _mb(r["size"]["after_sweep"]))
    row(
        "size after `tracestore db vacuum`",
        lambda r: f"{_mb(r['size']['after_vacuum'])} ({r['size']['vacuum_s']:.1f} s)",
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the benchmark on SQLite and PostgreSQL; write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="minimum trajectory steps")
    parser.add_argument("--quick", action="store_true", help="50,000 steps: a smoke run")
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--batch-size", type=int, default=500, help="runs per sweep batch")
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="SQLite: switch the store to incremental auto-vacuum first (db vacuum "
        "--incremental); the sweep then gives pages back batch by batch",
    )
    args = parser.parse_args()
    min_steps = 50_000 if args.quick else args.steps
    backends = ["sqlite"] + ([] if args.no_pg or not pg_available() else ["postgresql"])
    results = []
    for backend in backends:
        with fresh_database(backend) as url:
            results.append(bench(url, min_steps, args.batch_size, args.incremental))
    table = markdown(results, min_steps)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_bytes(
            orjson.dumps({"min_steps": min_steps, "results": results}, option=orjson.OPT_INDENT_2)
        )
        args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
