"""Ingest throughput: in-process and over HTTP, next to the bare-driver floor.

Floor: the same rows (typed tables plus the document bytes) written by the bare driver in
ONE transaction, JSON parsing included: sqlite3 `executemany` on SQLite, psycopg `COPY` on
PostgreSQL. Row building is done before the clock starts, so the floor is what the
database and driver cost with no service at all.
"""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import psycopg
from sqlalchemy.engine import make_url

from bench.common import fresh_database, server
from tracestore.correlation import resolve_correlation
from tracestore.db.base import Base
from tracestore.db.engine import create_engine
from tracestore.db.types import JSONValue
from tracestore.ingest.project import project_rollout
from tracestore.ingest.service import ingest_bytes, ingest_many
from tracestore.store.rollouts import RolloutRows

TABLES = (
    "runs",
    "run_documents",
    "trajectories",
    "steps",
    "traces",
    "trace_time_steps",
    "trace_events",
    "trace_messages",
)


def _json_columns(table: str) -> set[str]:
    return {c.name for c in Base.metadata.tables[table].columns if isinstance(c.type, JSONValue)}


def _table_rows(docs: Sequence[bytes]) -> dict[str, list[dict[str, Any]]]:
    """Every row the documents become, with keys wired (the floor's input)."""
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    ids = dict.fromkeys(TABLES, 0)

    def next_id(table: str) -> int:
        ids[table] += 1
        return ids[table]

    now = datetime.now(UTC)
    for raw in docs:
        doc = orjson.loads(raw)
        rows: RolloutRows = project_rollout(doc, resolve_correlation(doc))
        run_pk = next_id("runs")
        out["runs"].append(
            dict(rows.run, id=run_pk, received_at=now, content_hash="x" * 64, doc_bytes=len(raw))
        )
        out["run_documents"].append({"run_pk": run_pk, "encoding": "raw", "body": raw})
        for traj, steps in zip(rows.trajectories, rows.steps, strict=True):
            traj_pk = next_id("trajectories")
            out["trajectories"].append(dict(traj, id=traj_pk, run_pk=run_pk))
            out["steps"] += [
                dict(s, id=next_id("steps"), run_pk=run_pk, trajectory_pk=traj_pk) for s in steps
            ]
        for trace in rows.traces:
            trace_pk = next_id("traces")
            out["traces"].append(
                dict(
                    trace.trace,
                    id=trace_pk,
                    run_pk=run_pk,
                    origin="received",
                    converter=None,
                    converter_version=None,
                    source_hash=None,
                )
            )
            by_pos = {}
            for s in trace.time_steps:
                pk = next_id("trace_time_steps")
                by_pos[s["position"]] = pk
                out["trace_time_steps"].append(dict(s, id=pk, trace_pk=trace_pk))
            out["trace_events"] += [
                dict(
                    e,
                    id=next_id("trace_events"),
                    trace_pk=trace_pk,
                    run_pk=run_pk,
                    time_step_pk=by_pos.get(p),
                )
                for e, p in zip(trace.events, trace.event_steps, strict=True)
            ]
            out["trace_messages"] += [
                dict(
                    m,
                    id=next_id("trace_messages"),
                    trace_pk=trace_pk,
                    run_pk=run_pk,
                    time_step_pk=by_pos.get(p),
                )
                for m, p in zip(trace.messages, trace.message_steps, strict=True)
            ]
    return out


def _tuples(
    table: str, rows: list[dict[str, Any]], sqlite: bool
) -> tuple[list[str], list[tuple[Any, ...]]]:
    if not rows:
        return [], []
    columns = list(rows[0])
    json_cols = _json_columns(table)
    out = []
    for row in rows:
        values = []
        for c in columns:
            v = row[c]
            if c in json_cols and v is not None:
                v = orjson.dumps(v).decode()
            elif sqlite and isinstance(v, datetime):
                v = v.isoformat(" ")
            values.append(v)
        out.append(tuple(values))
    return columns, out


def floor(url: str, docs: Sequence[bytes]) -> float:
    """Seconds for the bare driver to parse the documents and write their rows at once."""
    rows = _table_rows(docs)  # before the clock: the floor is storage, not projection
    prepared = {t: _tuples(t, rows[t], url.startswith("sqlite")) for t in TABLES}
    if url.startswith("sqlite"):
        path = make_url(url).database
        assert path is not None
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        start = time.perf_counter()
        for raw in docs:
            orjson.loads(raw)
        conn.execute("BEGIN IMMEDIATE")
        for table, (columns, data) in prepared.items():
            if data:
                marks = ", ".join("?" for _ in columns)
                conn.executemany(
                    f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES ({marks})', data
                )
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        conn.close()
        return elapsed
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as pg:
        start = time.perf_counter()
        for raw in docs:
            orjson.loads(raw)
        with pg.transaction(), pg.cursor() as cur:
            for table, (columns, data) in prepared.items():
                if data:
                    with cur.copy(f'COPY "{table}" ({", ".join(columns)}) FROM STDIN') as copy:
                        for item in data:
                            copy.write_row(item)
        return time.perf_counter() - start


def in_process(url: str, docs: Sequence[bytes], batch: int) -> float:
    """Seconds for the API's library calls to store every document.

    batch=1: `ingest_bytes` per document (POST /v1/rollouts); else `ingest_many` per batch
    (POST /v1/rollouts/batch): a savepoint per rollout, one commit per transaction.
    """
    engine = create_engine(url)
    start = time.perf_counter()
    if batch == 1:
        results = [ingest_bytes(engine, raw) for raw in docs]
    else:
        results = []
        for i in range(0, len(docs), batch):
            results += ingest_many(engine, docs[i : i + batch])
    elapsed = time.perf_counter() - start
    engine.dispose()
    assert all(r.status == "created" for r in results), [
        r for r in results if r.status != "created"
    ][:1]
    return elapsed


def over_http(url: str, docs: Sequence[bytes], workers: int, batch: int, clients: int) -> float:
    """Seconds to post every document to `tracestore serve` (batch=1: single posts)."""
    chunks = [list(docs[i : i + batch]) for i in range(0, len(docs), batch)]
    lock = threading.Lock()
    errors: list[str] = []

    def client(base: str) -> None:
        with httpx.Client(base_url=base, timeout=120) as http:
            while True:
                with lock:
                    if not chunks:
                        return
                    chunk = chunks.pop()
                if batch == 1:
                    r = http.post(
                        "/v1/rollouts",
                        content=chunk[0],
                        headers={"Content-Type": "application/json"},
                    )
                    ok = r.status_code == 201
                else:
                    r = http.post(
                        "/v1/rollouts/batch",
                        content=b"\n".join(chunk),
                        headers={"Content-Type": "application/x-ndjson"},
                    )
                    ok = r.status_code == 207 and r.json()["summary"]["created"] == len(chunk)
                if not ok:
                    errors.append(r.text[:200])

    with server(url, workers=workers) as base:
        threads = [threading.Thread(target=client, args=(base,)) for _ in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} failed posts; first: {errors[0]}")
    return elapsed


def figures(seconds: float, docs: Sequence[bytes], steps: int) -> dict[str, float]:
    """Throughput figures of one measurement."""
    return {
        "seconds": seconds,
        "rollouts_per_s": len(docs) / seconds,
        "steps_per_s": steps / seconds,
        "mb_per_s": sum(map(len, docs)) / seconds / 1e6,
    }


def run(
    backend: str,
    docs: Sequence[bytes],
    steps: int,
    http_modes: Sequence[tuple[int, int]],
    repeats: int = 1,
) -> dict[str, Any]:
    """All ingest measurements of one corpus on one backend.

    The floor and the in-process figures are the median of `repeats` rounds, the three
    measured one after the other in each round (on a shared machine, what slows one round
    slows its floor too); each measurement gets a fresh database.
    """
    rounds: dict[str, list[float]] = {"floor": [], "in_process_single": [], "in_process_batch": []}
    for _ in range(repeats):
        with fresh_database(backend) as url:
            rounds["floor"].append(floor(url, docs))
        for batch in (1, 50):
            with fresh_database(backend) as url:
                name = "in_process_batch" if batch > 1 else "in_process_single"
                rounds[name].append(in_process(url, docs, batch))
    results: dict[str, Any] = {}
    for name, each_round in rounds.items():
        results[name] = figures(statistics.median(each_round), docs, steps)
        results[name]["rounds_seconds"] = each_round
    for workers, batch in http_modes:
        with fresh_database(backend) as url:
            seconds = over_http(url, docs, workers=workers, batch=batch, clients=2 * workers)
            results[f"http_{workers}w_{'batch' if batch > 1 else 'single'}"] = figures(
                seconds, docs, steps
            )
    floor_s = results["floor"]["seconds"]
    for r in results.values():
        r["ratio_to_floor"] = floor_s / r["seconds"]
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m bench.ingest [--db sqlite|postgresql] [--corpus multi|single]
    [--rollouts 200] [--repeats 3]`: the floor and the in-process figures alone."""
    import argparse

    from bench.corpus import corpus

    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=main.__doc__)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], action="append")
    parser.add_argument("--corpus", choices=["multi", "single"], default="multi")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    docs = corpus(args.corpus, args.rollouts)
    steps = sum(len(t["steps"]) for d in docs for t in orjson.loads(d)["trajectories"])
    for backend in args.db or ["sqlite", "postgresql"]:
        for name, r in run(backend, docs, steps, [], repeats=args.repeats).items():
            rounds = ", ".join(f"{s:.3f}" for s in r["rounds_seconds"])
            print(
                f"{backend} {args.corpus} {name:<18} {r['rollouts_per_s']:8.1f} rollouts/s "
                f"{r['ratio_to_floor']:.2f}x floor (rounds {rounds} s)"
            )


if __name__ == "__main__":
    main()
