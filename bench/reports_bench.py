"""Named-report times on a big store: live SQLite, live PostgreSQL, and its Parquet snapshot.

    python -m bench.reports_bench [--steps N] [--quick] [--pg URL | --no-pg] [--repeat R]
                                  [--keep DIR]

Builds a store of at least N trajectory steps (default 1,000,000; --quick: 50,000) shaped
like the producers' rollouts: Crafter-style dual-serialized runs with a full trace (an LM
event with a call record, an environment event and a tool-call message per step), the
same with a summary trace, legacy-only runs, trace-only runs, and single-step runs.

The rows come from the ingest library itself: a few hundred generated documents go through
`prepare` (validation, projection, drift check), then each is written many times under new
run ids and receive times (spread over 30 days), with keys assigned here so that whole
batches go in as one executemany per table. That is the shape `POST /v1/rollouts` writes,
at bulk-load speed.

Then it times `tracestore export` of the SQLite store, opening DuckDB on each source, and
every named report on each (median of R runs), checks that each report gives identical
rows on every source, and prints a Markdown table. --keep DIR keeps the SQLite store and
snapshot in DIR and reuses them when they are there.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Boolean, Connection, Engine, Table, text
from sqlalchemy import create_engine as sa_engine
from sqlalchemy.engine import make_url

from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.db.types import JSONValue, UTCDateTime, json_dumps, json_dumps_pg
from tracestore.ingest.service import prepare
from tracestore.store.documents import compress_document
from tracestore.store.rollouts import (
    DOCUMENTS,
    EVENTS,
    MESSAGES,
    RUNS,
    STEPS,
    TIME_STEPS,
    TRACES,
    TRAJECTORIES,
    Prepared,
)

PG_ADMIN = os.environ.get(
    "TRACESTORE_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ENVS = ["crafter", "sokoban", "minigrid", "webshop", "math", "banking"]
MODELS = [("Qwen/Qwen3-4B", "custom"), ("gpt-4.1-mini", "openai"), ("claude-haiku", "anthropic")]
ACTIONS = ["move_up", "move_down", "move_left", "move_right", "do", "sleep", "noop"]
TEMPLATES = 240
STEPS_PER_RUN = 50


# --- documents ----------------------------------------------------------------------------


def _tool_call(rng: random.Random, i: int) -> dict[str, Any]:
    actions = rng.sample(ACTIONS, rng.randint(1, 3))
    dialect = i % 3
    if dialect == 0:
        return {"tool_name": "interact_many", "arguments": {"actions": actions}}
    if dialect == 1:
        return {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "interact", "arguments": orjson.dumps({"a": actions[0]}).decode()},
        }
    return {"tool": "look", "args": {}}


def document(seed: int, kind: str) -> dict[str, Any]:
    """One rollout of `kind`: dual_full, dual_summary, legacy, trace_only or single."""
    rng = random.Random(seed)
    env = ENVS[seed % len(ENVS)]
    policy = f"pol-{env}-{seed % 4}"
    model, provider = MODELS[seed % len(MODELS)]
    n = 1 if kind == "single" else STEPS_PER_RUN
    cid = f"trace_{rng.getrandbits(64):016x}"
    steps: list[dict[str, Any]] = []
    time_steps: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    total = 0.0
    for i in range(n):
        call = _tool_call(rng, i)
        reward = rng.choice([0.0, 0.0, 0.0, 1.0, -0.5]) if i % 7 else None
        total += reward or 0.0
        obs = {"text": f"step {i}: health {rng.randint(1, 9)}/9", "pos": [i, rng.randint(0, 9)]}
        done = i == n - 1
        steps.append(
            {
                "obs": obs,
                "tool_calls": [call],
                "reward": reward,
                "done": done,
                "truncated": False,
                "info": {"meta": {"inference_ms": 800 + i, "turn_index": i}},
            }
        )
        step_id = f"decision_{i}"
        lm = {
            "system_instance_id": "policy",
            "time_record": {"event_time": 1.7e9 + i, "message_time": None},
            "model_name": model,
            "provider": provider,
            "input_tokens": 200 + 3 * i,
            "output_tokens": 20 + i % 11,
            "total_tokens": 220 + 3 * i + i % 11,
            "cost_usd": None if provider == "custom" else round(1e-5 * (20 + i), 8),
            "latency_ms": 400.0 + rng.random() * 900,
            "call_records": [{"call_id": f"{seed}-{i}", "output_tool_calls": [call]}],
            "metadata": {"step_id": step_id},
        }
        # Every ninth producer disagrees with itself once per rollout (drift to report).
        drifted = seed % 9 == 0 and i == n // 2
        env_event = {
            "system_instance_id": "env",
            "time_record": {"event_time": 1.7e9 + i + 0.5, "message_time": None},
            "reward": float(reward or 0.0) + (1.0 if drifted else 0.0),
            "terminated": done,
            "truncated": False,
            "system_state_before": obs,
            "metadata": {"step_id": step_id},
        }
        message = {
            "content": {
                "text": None,
                "json_payload": orjson.dumps({"tool_calls": [call]}).decode(),
            },
            "message_type": "assistant",
            "time_record": {"event_time": 1.7e9 + i, "message_time": None},
            "metadata": {"step_id": step_id, "is_tool_call": True},
        }
        time_steps.append(
            {
                "step_id": step_id,
                "step_index": i,
                "events": [lm, env_event],
                "markov_blanket_messages": [message],
            }
        )
        history.extend([lm, env_event])
    meta = {"env_id": env, "policy_id": policy, "run_id": f"bench-{seed}"}
    trace: dict[str, Any] | None
    if kind in ("dual_full", "trace_only"):
        trace = {
            "session_id": f"bench-{seed}",
            "created_at": "2025-11-20T11:59:59Z",
            "session_time_steps": time_steps,
            "event_history": history,
            "markov_blanket_message_history": [t["markov_blanket_messages"][0] for t in time_steps],
            "metadata": meta,
        }
    elif kind in ("dual_summary", "single"):
        trace = {"session_id": f"s-{seed}", "events_count": n, "lm_calls": n, "metadata": meta}
    else:
        trace = None
    trajectories = []
    if kind != "trace_only":
        trajectories.append(
            {
                "env_id": env,
                "policy_id": policy,
                "steps": steps,
                "length": n,
                "inference_url": f"https://infer.example/v1/chat/completions?cid={cid}",
            }
        )
    return {
        "run_id": f"bench-{seed}",
        "trajectories": trajectories,
        "metrics": {"episode_returns": [total], "mean_return": total, "num_steps": n},
        "trace": trace,
        "pipeline_metadata": {"trace_correlation_id": cid} if seed % 5 else {},
    }


def templates() -> list[tuple[Prepared, bytes]]:
    """Prepared template rollouts (through the ingest library) and their stored bodies."""
    kinds = ["dual_full"] * 7 + ["legacy"] * 7 + ["dual_summary"] * 3 + ["trace_only"] * 2
    kinds.append("single")
    out = []
    for seed in range(TEMPLATES):
        raw = orjson.dumps(document(seed, kinds[seed % len(kinds)]))
        prepared = prepare(raw)
        out.append((prepared, compress_document(raw)))
    return out


# --- bulk writing -------------------------------------------------------------------------


@dataclass
class Keys:
    """The next primary key of every table (the store starts empty)."""

    run: int = 1
    trajectory: int = 1
    step: int = 1
    trace: int = 1
    time_step: int = 1
    event: int = 1
    message: int = 1
    finding: int = 1


def _noise(clone: int, i: int) -> float:
    """A cheap deterministic value in [0, 1) per copy and step (a multiplicative hash)."""
    return ((clone * 2654435761 + i * 40503 + 12345) % 1_000_003) / 1_000_003


def _varied(obs: Any, clone: int, i: int) -> Any:
    # Same change on both sides of a dual-serialized step: copies differ, never drift.
    if isinstance(obs, dict):
        return {**obs, "copy": clone, "noise": _noise(clone, i)}
    return obs


def clone_rows(
    prepared: Prepared, body: bytes, keys: Keys, clone: int, received_at: datetime
) -> dict[str, list[dict[str, Any]]]:
    """The rows of one stored copy of a template, under a new run id and new keys."""
    rows = prepared.rows
    run_pk = keys.run
    keys.run += 1
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in BATCH_TABLES}
    out["runs"].append(
        dict(
            rows.run,
            id=run_pk,
            run_id=f"{rows.run['run_id']}-{clone}",
            received_at=received_at,
            content_hash=prepared.digest,
            doc_bytes=len(prepared.raw),
        )
    )
    out["run_documents"].append({"run_pk": run_pk, "encoding": "zstd", "body": body})
    for trajectory, steps in zip(rows.trajectories, rows.steps, strict=True):
        traj_pk = keys.trajectory
        keys.trajectory += 1
        out["trajectories"].append(dict(trajectory, id=traj_pk, run_pk=run_pk))
        for step in steps:
            out["steps"].append(
                dict(
                    step,
                    id=keys.step,
                    run_pk=run_pk,
                    trajectory_pk=traj_pk,
                    obs=_varied(step["obs"], clone, step["idx"]),
                    info=_varied(step["info"], clone, step["idx"]),
                )
            )
            keys.step += 1
    for trace in rows.traces:
        trace_pk = keys.trace
        keys.trace += 1
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
        by_position: dict[int, int] = {}
        for ts in trace.time_steps:
            by_position[ts["position"]] = keys.time_step
            out["trace_time_steps"].append(dict(ts, id=keys.time_step, trace_pk=trace_pk))
            keys.time_step += 1
        env_index = 0
        for event, at in zip(trace.events, trace.event_steps, strict=True):
            varied: dict[str, Any] = {}
            if event["event_type"] == "environment":
                varied["system_state_before"] = _varied(
                    event["system_state_before"], clone, env_index
                )
                env_index += 1
            elif event["latency_ms"] is not None:
                noise = _noise(clone, event["position"])
                varied["latency_ms"] = event["latency_ms"] * (0.5 + noise)
                varied["input_tokens"] = event["input_tokens"] + int(noise * 500)
                varied["total_tokens"] = event["total_tokens"] + int(noise * 500)
            out["trace_events"].append(
                {
                    **event,
                    **varied,
                    "id": keys.event,
                    "trace_pk": trace_pk,
                    "run_pk": run_pk,
                    "time_step_pk": by_position.get(at) if at is not None else None,
                }
            )
            keys.event += 1
        for message, at in zip(trace.messages, trace.message_steps, strict=True):
            out["trace_messages"].append(
                {
                    **message,
                    "id": keys.message,
                    "trace_pk": trace_pk,
                    "run_pk": run_pk,
                    "time_step_pk": by_position.get(at) if at is not None else None,
                }
            )
            keys.message += 1
    drift = prepared.drift
    out["drift_checks"].append(dict(drift.check, run_pk=run_pk, checked_at=received_at))
    for finding in drift.findings:
        out["drift_findings"].append(dict(finding, id=keys.finding, run_pk=run_pk))
        keys.finding += 1
    return out


def _drift_tables() -> dict[str, Any]:
    from tracestore.store.drift import CHECKS, FINDINGS

    return {"drift_checks": CHECKS, "drift_findings": FINDINGS}


BATCH_TABLES: dict[str, Any] = {
    "runs": RUNS,
    "run_documents": DOCUMENTS,
    "trajectories": TRAJECTORIES,
    "steps": STEPS,
    "traces": TRACES,
    "trace_time_steps": TIME_STEPS,
    "trace_events": EVENTS,
    "trace_messages": MESSAGES,
    **_drift_tables(),
}


def _encoder(column: Any, backend: str) -> Callable[[Any], Any]:
    """How the column's SQLAlchemy type would bind a value (the store's exact stored form)."""
    kind = column.type
    if isinstance(kind, JSONValue):
        dumps = json_dumps_pg if backend == "postgresql" else json_dumps
        return lambda v: None if v is None else dumps(v)
    if isinstance(kind, UTCDateTime) and backend == "sqlite":
        # SQLAlchemy's SQLite DATETIME text, naive UTC (what UTCDateTime stores).
        return lambda v: None if v is None else v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(kind, Boolean) and backend == "sqlite":
        return lambda v: None if v is None else int(v)
    return lambda v: v


def write(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """Bulk-insert rows (dicts keyed by column) as the ORM types would store them.

    SQLAlchemy's per-row bind processing is most of the cost of a Core executemany: values
    are encoded once here, then sent by the driver (SQLite executemany, PostgreSQL COPY).
    """
    backend = conn.dialect.name
    columns = [c for c in table.columns if c.name in rows[0]]
    encoders = [_encoder(c, backend) for c in columns]
    names = [c.name for c in columns]
    data = [tuple(enc(row.get(n)) for enc, n in zip(encoders, names, strict=True)) for row in rows]
    quoted = ", ".join(f'"{n}"' for n in names)
    if backend == "postgresql":
        driver = conn.connection.driver_connection
        assert driver is not None
        with (
            driver.cursor() as cursor,
            cursor.copy(f'COPY "{table.name}" ({quoted}) FROM STDIN') as copy,
        ):
            for record in data:
                copy.write_row(record)
        return
    marks = ", ".join("?" for _ in names)
    conn.exec_driver_sql(f'INSERT INTO "{table.name}" ({quoted}) VALUES ({marks})', data)


def build(engine: Engine, min_steps: int, seed: int = 7) -> dict[str, int]:
    """Fill an empty, migrated store with at least `min_steps` trajectory steps."""
    rng = random.Random(seed)
    prepared = templates()
    keys = Keys()
    start = datetime(2025, 10, 1, tzinfo=UTC)
    pending: dict[str, list[dict[str, Any]]] = {name: [] for name in BATCH_TABLES}
    clone = 0

    def flush() -> None:
        with engine.begin() as conn:
            for name, table in BATCH_TABLES.items():  # parents before children
                if pending[name]:
                    write(conn, table, pending[name])
                    pending[name].clear()

    while keys.step - 1 < min_steps:
        template, body = prepared[clone % len(prepared)]
        received = start + timedelta(seconds=rng.randrange(30 * 86400))
        for name, rows in clone_rows(template, body, keys, clone, received).items():
            pending[name].extend(rows)
        clone += 1
        if len(pending["steps"]) >= 50_000:
            flush()
    flush()
    if engine.dialect.name == "postgresql":
        # Explicit keys left the sequences behind; a later ingest must not collide.
        with engine.begin() as conn:
            for name in BATCH_TABLES:
                if name not in ("run_documents", "drift_checks"):
                    conn.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                            f"coalesce((SELECT max(id) FROM {name}), 1))"
                        )
                    )
            conn.execute(text("ANALYZE"))
    return counts(engine)


def counts(engine: Engine) -> dict[str, int]:
    """Rows per table."""
    with engine.connect() as conn:
        return {
            name: conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one()
            for name in BATCH_TABLES
        }


# --- databases ----------------------------------------------------------------------------


@contextmanager
def pg_database(admin_url: str | None) -> Iterator[str | None]:
    """A fresh PostgreSQL database for the run (dropped at the end), or None if unreachable."""
    if admin_url is None:
        yield None
        return
    try:
        admin = sa_engine(
            admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure: the benchmark runs without PostgreSQL
        print(f"PostgreSQL unreachable ({type(exc).__name__}); timing SQLite and Parquet only")
        yield None
        return
    name = f"tracestore_bench_reports_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# --- timing -------------------------------------------------------------------------------


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    """Median seconds of `repeat` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench_source(label: str, opener: Any, repeat: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Seconds to open DuckDB on a source and to run each report there; the results."""
    from tracestore.reports.catalog import list_reports
    from tracestore.reports.filters import Filters
    from tracestore.reports.runner import run_report

    seconds: dict[str, float] = {}
    tables: dict[str, Any] = {}
    t0 = time.perf_counter()
    analytics = opener()
    seconds["(open DuckDB)"] = time.perf_counter() - t0
    try:
        if analytics.notices:
            print(f"{label}: {'; '.join(analytics.notices)}")
        for report in list_reports():
            s, result = timed(lambda r=report: run_report(analytics, r, Filters()), repeat)
            seconds[report.name] = s
            tables[report.name] = result.table
            print(f"  {label:<18} {report.name:<12} {s:8.3f} s  ({result.table.num_rows} rows)")
    finally:
        analytics.close()
    return seconds, tables


def main() -> None:
    """Build the store, export it, time every report on every source, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="minimum trajectory steps")
    parser.add_argument("--quick", action="store_true", help="50,000 steps: a smoke run")
    parser.add_argument(
        "--pg", default=PG_ADMIN, help="PostgreSQL admin URL (a database is created)"
    )
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--repeat", type=int, default=3, help="runs per report (median)")
    parser.add_argument(
        "--keep", type=Path, help="keep (and reuse) the SQLite store and snapshot here"
    )
    args = parser.parse_args()
    min_steps = 50_000 if args.quick else args.steps

    from tracestore.reports import live
    from tracestore.reports.connection import open_live, open_snapshot
    from tracestore.reports.filters import Filters

    work = args.keep or Path(tempfile.mkdtemp(prefix="tracestore-reports-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    db_path = work / f"store-{min_steps}.db"
    snap = work / f"snapshot-{min_steps}"
    sqlite_url = f"sqlite:///{db_path}"
    lines: list[str] = []
    try:
        sqlite = create_engine(sqlite_url)
        if not db_path.exists() or migrate.is_empty(sqlite):
            migrate.upgrade(sqlite)
            t0 = time.perf_counter()
            rows = build(sqlite, min_steps)
            print(f"SQLite store built in {time.perf_counter() - t0:.1f}s: {rows}")
        else:
            rows = counts(sqlite)
            print(f"reusing {db_path}: {rows}")
        with sqlite.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        size_mb = db_path.stat().st_size / 1e6
        export_s = None
        if not snap.exists():
            t0 = time.perf_counter()
            live.export(
                sqlite.url, snap, Filters(), schema_revision=migrate.current_revision(sqlite)
            )
            export_s = time.perf_counter() - t0
            print(f"exported to {snap} in {export_s:.1f}s")
        snap_mb = sum(p.stat().st_size for p in snap.rglob("*.parquet")) / 1e6

        results: dict[str, dict[str, float]] = {}
        outputs: dict[str, dict[str, Any]] = {}
        results["SQLite (live)"], outputs["sqlite"] = bench_source(
            "SQLite", lambda: open_live(sqlite, in_this_process=True), args.repeat
        )
        with pg_database(None if args.no_pg else args.pg) as pg_url:
            if pg_url is not None:
                pg = create_engine(pg_url)
                migrate.upgrade(pg)
                t0 = time.perf_counter()
                build(pg, min_steps)
                print(f"PostgreSQL store built in {time.perf_counter() - t0:.1f}s")
                results["PostgreSQL (live)"], outputs["postgresql"] = bench_source(
                    "PostgreSQL", lambda: open_live(pg, in_this_process=True), args.repeat
                )
                pg.dispose()
        results["Parquet snapshot"], outputs["snapshot"] = bench_source(
            "Parquet", lambda: open_snapshot(snap), args.repeat
        )
        sqlite.dispose()

        same = all(
            out[name].equals(outputs["sqlite"][name]) for out in outputs.values() for name in out
        )
        lines.append(
            f"Store: {rows['runs']:,} runs, {rows['steps']:,} steps, "
            f"{rows['trace_events']:,} trace events, {rows['trace_messages']:,} messages; "
            f"SQLite file {size_mb:,.0f} MB, snapshot {snap_mb:,.0f} MB of Parquet"
            + (f" (export {export_s:.1f} s)" if export_s is not None else "")
            + "."
        )
        lines.append(
            f"Machine: {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, duckdb {__import__('duckdb').__version__}; "
            f"median of {args.repeat} runs; identical results on every source: "
            f"{'yes' if same else 'NO'}."
        )
        lines.append("")
        sources = list(results)
        lines.append("| report | " + " | ".join(sources) + " |")
        lines.append("|---|" + "---:|" * len(sources))
        for name in results["SQLite (live)"]:
            cells = [f"{results[s][name]:.2f} s" for s in sources]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print()
        print("\n".join(lines))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
