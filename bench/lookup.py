"""Look-up latency by correlation id and by run_id at 100,000 and 1,000,000 stored runs.

The store is filled by the bare driver (runs, one trajectory each with its own cid, a small
document each): ingesting a million rollouts through the service would take hours and
measure ingest, not look-up. Latency is measured in-process (the store functions the API
calls, on a session) and over HTTP (keep-alive client, one worker), next to the floor: the
same indexed SELECT through the bare driver.

On its own: `python -m bench.lookup [--db sqlite|postgresql] [--runs N] [--samples N]
[--keep NAME] [--out FILE]`; `--keep` builds the store once (a SQLite file path, or a
PostgreSQL database name on TRACESTORE_BENCH_PG_URL's server) and reuses it on later runs
(filling a million runs takes a minute or two), `--keep NAME --drop` removes it.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
from sqlalchemy import create_engine as sa_engine
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench.common import PG_ADMIN, fresh_database, percentiles, server
from tracestore.api.overload import read_session, reading
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.store.documents import compress_document
from tracestore.store.runs import get_document, runs_by_correlation

CHUNK = 50_000


def _run_rows(start: int, n: int) -> Iterator[tuple[list[tuple[Any, ...]], ...]]:
    now = datetime.now(UTC)
    body = compress_document(orjson.dumps({"run_id": "bench", "trajectories": [], "metrics": {}}))
    for base in range(start, start + n, CHUNK):
        ids = range(base + 1, min(base + CHUNK, start + n) + 1)
        runs = [
            (
                i,
                f"run-{i:09d}",
                f"trace_{i:016x}",
                "pipeline_metadata",
                now,
                None,
                1,
                1,
                0,
                0,
                0.5,
                1,
                1,
                None,
                None,
                "{}",
                False,
                1,
                "{}",
                "{}",
                "x" * 64,
                300,
            )
            for i in ids
        ]
        trajectories = [
            (i, i, 0, f"env-{i % 7}", f"pol-{i % 3}", 1, "", f"trace_t{i:015x}", "trajectory", 1)
            for i in ids
        ]
        documents = [(i, "zstd", body) for i in ids]
        yield runs, trajectories, documents


RUN_COLUMNS = (
    "id, run_id, correlation_id, correlation_source, received_at, trace_kind, n_trajectories, "
    "n_steps, n_events, n_messages, mean_return, num_steps, num_episodes, outcome_score, "
    "events_score, metrics, aborted, ops_executed, branches, pipeline_metadata, content_hash, "
    "doc_bytes"
)
TRAJ_COLUMNS = (
    "id, run_pk, idx, env_id, policy_id, length, inference_url, correlation_id, "
    "correlation_source, n_steps"
)


def fill(url: str, n: int, start: int = 0) -> None:
    """Add runs start+1..start+n with the bare driver."""
    if url.startswith("sqlite"):
        path = make_url(url).database
        assert path is not None
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        for runs, trajectories, documents in _run_rows(start, n):
            conn.executemany(
                f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                [(*r[:4], r[4].replace(tzinfo=None).isoformat(" "), *r[5:]) for r in runs],
            )
            conn.executemany(
                f"INSERT INTO trajectories ({TRAJ_COLUMNS}) VALUES ({', '.join('?' * 10)})",
                trajectories,
            )
            conn.executemany("INSERT INTO run_documents VALUES (?, ?, ?)", documents)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        conn.close()
        return
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as pg:
        with pg.transaction(), pg.cursor() as cur:
            for runs, trajectories, documents in _run_rows(start, n):
                with cur.copy(f"COPY runs ({RUN_COLUMNS}) FROM STDIN") as copy:
                    for row in runs:
                        copy.write_row(row)
                with cur.copy(f"COPY trajectories ({TRAJ_COLUMNS}) FROM STDIN") as copy:
                    for row in trajectories:
                        copy.write_row(row)
                with cur.copy("COPY run_documents (run_pk, encoding, body) FROM STDIN") as copy:
                    for row in documents:
                        copy.write_row(row)
            for table in ("runs", "trajectories", "run_documents"):
                cur.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', "
                    f"'{'run_pk' if table == 'run_documents' else 'id'}'), {start + n})"
                    if table != "run_documents"
                    else "SELECT 1"
                )
        pg.execute("ANALYZE")


def _sample(fn: Callable[[Any], Any], keys: list[Any]) -> dict[str, float]:
    times = []
    for key in keys:
        start = time.perf_counter()
        fn(key)
        times.append(time.perf_counter() - start)
    return percentiles(times)


def measure(url: str, n: int, samples: int, seed: int = 1) -> dict[str, Any]:
    """p50/p99 of look-ups by cid and by run_id over a store of n runs."""
    rng = random.Random(seed)
    picks = [rng.randint(1, n) for _ in range(samples)]
    cids = [f"trace_{i:016x}" for i in picks]
    run_ids = [f"run-{i:09d}" for i in picks]
    out: dict[str, Any] = {}
    # Floor: the indexed SELECTs through the bare driver.
    if url.startswith("sqlite"):
        path = make_url(url).database
        raw = sqlite3.connect(path or "")
        cid_sql = "SELECT id, run_id FROM runs WHERE correlation_id = ?"
        doc_sql = (
            "SELECT d.body FROM run_documents d JOIN runs r ON r.id = d.run_pk WHERE r.run_id = ?"
        )
        out["floor_cid"] = _sample(lambda k: raw.execute(cid_sql, (k,)).fetchall(), cids)
        out["floor_run_id"] = _sample(lambda k: raw.execute(doc_sql, (k,)).fetchall(), run_ids)
        raw.close()
    else:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as pg:
            cid_sql = "SELECT id, run_id FROM runs WHERE correlation_id = %s"
            doc_sql = (
                "SELECT d.body FROM run_documents d JOIN runs r ON r.id = d.run_pk "
                "WHERE r.run_id = %s"
            )
            out["floor_cid"] = _sample(lambda k: pg.execute(cid_sql, (k,)).fetchall(), cids)
            out["floor_run_id"] = _sample(lambda k: pg.execute(doc_sql, (k,)).fetchall(), run_ids)
    # The API's read sessions: on PostgreSQL in autocommit (api/overload.py).
    engine = reading(create_engine(url))

    def by_cid(cid: str) -> None:
        with read_session(engine) as session:
            runs_by_correlation(session, cid)

    def by_run_id(run_id: str) -> None:
        with read_session(engine) as session:
            get_document(session, run_id)

    out["in_process_cid"] = _sample(by_cid, cids)
    out["in_process_run_id"] = _sample(by_run_id, run_ids)
    engine.dispose()
    with server(url) as base, httpx.Client(base_url=base) as http:
        out["http_cid"] = _sample(
            lambda k: http.get(f"/v1/correlations/{k}").raise_for_status(), cids
        )
        out["http_run_id"] = _sample(
            lambda k: http.get(f"/v1/rollouts/{k}").raise_for_status(), run_ids
        )
    for kind in ("cid", "run_id"):
        floor_p99 = out[f"floor_{kind}"]["p99_ms"]
        for where in ("in_process", "http"):
            out[f"{where}_{kind}"]["p99_ratio_to_floor"] = (
                out[f"{where}_{kind}"]["p99_ms"] / floor_p99
            )
    return out


def _store_url(backend: str, name: str) -> str:
    """The URL of a kept store: a SQLite file path, or a PostgreSQL database name."""
    if backend == "sqlite":
        return f"sqlite:///{name}"
    return make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)


def _count_runs(url: str) -> int | None:
    """Runs in the store at `url`; None when it does not exist or has no schema."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one())
    except Exception:
        return None
    finally:
        engine.dispose()


def _kept_store(backend: str, name: str, n: int) -> str:
    """A store of n runs named `name`, built on first use and kept: later runs reuse it."""
    url = _store_url(backend, name)
    have = _count_runs(url)
    if have == n:
        return url
    if have is not None:
        raise SystemExit(f"{url} holds {have:,} runs, not {n:,}: --drop it first")
    if backend == "postgresql":
        admin = sa_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
    engine = create_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    started = time.perf_counter()
    fill(url, n)
    print(f"built {url}: {n:,} runs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return url


def _drop(backend: str, name: str) -> None:
    if backend == "sqlite":
        for suffix in ("", "-wal", "-shm", "-writer"):
            Path(name + suffix).unlink(missing_ok=True)
        return
    admin = sa_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.lookup`: look-up latency on one database, as `bench all` measures it."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.lookup",
        description="Look-up latency by cid and by run_id (bench/lookup.py).",
    )
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument(
        "--keep",
        metavar="NAME",
        help="build the store once as NAME (a SQLite file path, or a PostgreSQL database "
        "name) and reuse it on later runs (default: a fresh store, removed afterwards)",
    )
    parser.add_argument("--drop", action="store_true", help="remove the --keep store and exit")
    parser.add_argument("--out", metavar="FILE", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.drop:
        if not args.keep:
            parser.error("--drop needs --keep NAME")
        _drop(args.db, args.keep)
        return
    if args.keep:
        url = _kept_store(args.db, args.keep, args.runs)
        result = measure(url, args.runs, args.samples)
    else:
        with fresh_database(args.db) as url:
            fill(url, args.runs)
            result = measure(url, args.runs, args.samples)
    for key, fig in result.items():
        ratio = fig.get("p99_ratio_to_floor")
        extra = f"  ({ratio:.1f}x floor p99)" if ratio is not None else ""
        print(f"{key:20s} p50 {fig['p50_ms']:7.3f} ms  p99 {fig['p99_ms']:7.3f} ms{extra}")
    if args.out:
        Path(args.out).write_text(json.dumps({"db": args.db, "runs": args.runs, **result}))


if __name__ == "__main__":
    main()
