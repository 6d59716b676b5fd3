"""What drift detection adds to ingest, per rollout, on examples/rollouts.jsonl.

    .venv/bin/python bench/drift_ingest_cost.py [--copies N] [--rounds N] [--pg URL | --no-pg]

Measurements:

1. pure, before the transaction: `prepare(raw)` (parse, validate, project, drift) with the
   drift hook and without it, alternately per rollout, so the difference is what drift adds
   where ingest runs it (trace views shared with the projection); and `drift_rows(doc)` on
   its own, split into the comparison and the reproduction check;
2. in the transaction (under SQLite's write lock): `drift_writes`, the drift rows laid out for
   the rollout's own bulk write (store/rollouts.py `write_many` inserts them with its other
   rows, so their insert is not timed apart: it is in 3), timed inside real ingests;
3. end to end: `ingest_bytes` into two fresh stores, one with the drift hook and one
   without (both hook functions replaced by no-ops), in alternating rounds so that the
   machine's load hits both alike; the median round's difference per rollout.

The corpus is the examples that create a run, copied with fresh run_ids.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import create_engine as sa_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url

import tracestore.ingest.service as ingest_service
import tracestore.store.rollouts as store_rollouts
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.drift.compare import compare_rollout
from tracestore.drift.rows import drift_rows, reproduction
from tracestore.store.drift import drift_writes

EXAMPLES = Path(
    os.environ.get("TRACESTORE_EXAMPLES_DIR", Path(__file__).resolve().parents[1] / "examples")
)
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def first_lines() -> list[bytes]:
    """The example lines whose run_id is new in file order (the ones that create a run)."""
    seen: set[str] = set()
    out = []
    for raw in (EXAMPLES / "rollouts.jsonl").read_bytes().splitlines():
        run_id = orjson.loads(raw)["run_id"]
        if run_id not in seen:
            seen.add(run_id)
            out.append(raw)
    return out


def corpus(lines: list[bytes], copies: int, tag: str) -> list[bytes]:
    """The lines copied `copies` times with fresh run_ids."""
    out = []
    for copy in range(copies):
        for raw in lines:
            doc = orjson.loads(raw)
            doc["run_id"] = f"{doc['run_id']}-{tag}{copy}"
            out.append(orjson.dumps(doc))
    return out


def per_call_ms(fn: Callable[[Any], Any], items: list[Any], repeat: int) -> list[float]:
    """Mean milliseconds of fn(item) for each item, over `repeat` calls (after a warm-up)."""
    for item in items:
        fn(item)
    out = []
    for item in items:
        start = time.perf_counter()
        for _ in range(repeat):
            fn(item)
        out.append((time.perf_counter() - start) * 1000 / repeat)
    return out


def describe(label: str, values: list[float]) -> str:
    """Mean, median and max of per-rollout milliseconds."""
    ordered = sorted(values)
    return (
        f"{label:<34} mean {statistics.mean(values):7.3f} ms   "
        f"p50 {ordered[len(ordered) // 2]:7.3f} ms   max {ordered[-1]:7.3f} ms"
    )


@contextmanager
def fresh_store(backend: str, pg_admin: str) -> Iterator[Any]:
    """An engine on a new, migrated store; dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            engine = create_engine(f"sqlite:///{tmp}/bench.db")
            migrate.upgrade(engine)
            yield engine
            engine.dispose()
        return
    name = f"tracestore_drift_bench_{uuid.uuid4().hex[:8]}"
    admin = sa_engine(pg_admin, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(make_url(pg_admin).set(database=name))
    try:
        migrate.upgrade(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def drift_hook(on: bool, in_tx: list[float] | None = None) -> Iterator[None]:
    """Ingest with the drift hook (its rows' layout timed into `in_tx`), or with both
    parts no-ops (no drift rows computed, none written)."""

    def timed_writes(items: Any) -> Any:
        start = time.perf_counter()
        out = drift_writes(items)
        if in_tx is not None:  # per rollout
            in_tx.append((time.perf_counter() - start) * 1000 / max(1, len(items)))
        return out

    # Patched as modules, not as typed names: the benchmark swaps what ingest calls.
    service: Any = ingest_service
    rollouts: Any = store_rollouts
    saved = service.drift_rows, rollouts.drift_writes
    if on:
        rollouts.drift_writes = timed_writes
    else:
        service.drift_rows = lambda doc, resolution=None: None
        rollouts.drift_writes = lambda items: []
    try:
        yield
    finally:
        service.drift_rows, rollouts.drift_writes = saved


def prepare_ms(lines: list[bytes], repeat: int) -> tuple[list[float], list[float]]:
    """Per rollout: mean ms of prepare() with drift and without, measured alternately."""
    with_drift: list[float] = []
    without: list[float] = []
    for raw in lines:
        for on, out in ((True, with_drift), (False, without)):
            with drift_hook(on):
                ingest_service.prepare(raw)  # warm-up
                start = time.perf_counter()
                for _ in range(repeat):
                    ingest_service.prepare(raw)
                out.append((time.perf_counter() - start) * 1000 / repeat)
    return with_drift, without


def ingest_s(engine: Any, docs: list[bytes]) -> float:
    """Seconds to ingest every doc (each is created)."""
    start = time.perf_counter()
    for raw in docs:
        assert ingest_service.ingest_bytes(engine, raw).status == "created"
    return time.perf_counter() - start


def main() -> None:
    """Print the three measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=2, help="corpus copies per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per store")
    parser.add_argument("--repeat", type=int, default=10, help="calls per pure timing")
    parser.add_argument("--pg", default=os.environ.get("TRACESTORE_BENCH_PG_URL", PG_ADMIN))
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args()

    lines = first_lines()
    docs = [orjson.loads(raw) for raw in lines]
    comparable = [d for d in docs if compare_rollout(d).comparable]
    mean_kb = statistics.mean(len(r) for r in lines) / 1024
    print(f"{len(docs)} rollouts ({len(comparable)} comparable), mean {mean_kb:.1f} KB")

    print("\n1. pure, before the transaction")
    with_drift, without = prepare_ms(lines, args.repeat)
    added = [a - b for a, b in zip(with_drift, without, strict=True)]
    print(describe("prepare with drift", with_drift))
    print(describe("prepare without drift", without))
    print(describe("added by drift (as ingest runs it)", added))
    print(describe("drift_rows alone, all", per_call_ms(drift_rows, docs, args.repeat)))
    print(
        describe("drift_rows alone, comparable", per_call_ms(drift_rows, comparable, args.repeat))
    )
    print(describe("  compare_rollout", per_call_ms(compare_rollout, comparable, args.repeat)))
    print(describe("  reproduction", per_call_ms(reproduction, comparable, args.repeat)))

    backends = ["sqlite"] if args.no_pg else ["sqlite", "postgresql"]
    for backend in backends:
        in_tx: list[float] = []
        rounds: list[tuple[float, float]] = []
        n = len(lines) * args.copies
        with fresh_store(backend, args.pg) as on, fresh_store(backend, args.pg) as off:
            for r in range(args.rounds):
                with drift_hook(True, in_tx):
                    on_s = ingest_s(on, corpus(lines, args.copies, f"on{r}-"))
                with drift_hook(False):
                    off_s = ingest_s(off, corpus(lines, args.copies, f"off{r}-"))
                rounds.append((on_s * 1000 / n, off_s * 1000 / n))
        diffs = sorted(a - b for a, b in rounds)
        median = diffs[len(diffs) // 2]
        on_ms = statistics.median(a for a, _ in rounds)
        off_ms = statistics.median(b for _, b in rounds)
        print(f"\n{backend}: {args.rounds} rounds of {n} rollouts into each store")
        print(describe("2. drift_writes, in the transaction", in_tx))
        print(
            f"3. ingest_bytes per rollout (median round): with drift {on_ms:.3f} ms, without "
            f"{off_ms:.3f} ms, difference {median:+.3f} ms ({median / off_ms * 100:+.1f}%)"
        )


if __name__ == "__main__":
    main()
