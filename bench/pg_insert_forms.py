"""Ways to send a group's small tables to PostgreSQL, side by side, in one pipeline and one
transaction per group: multi-row INSERTs of the exact row count, not prepared (db/bulk.py
before the eleventh round: one text per row count); the same in power-of-two chunks, each
prepared (a few texts a table, more statements); one INSERT ... SELECT FROM (VALUES ...)
padded to the next power of two with NULL rows its WHERE drops, prepared (db/bulk.py's
`padded_insert` now: one statement a table, a few texts); and one prepared INSERT ...
SELECT FROM unnest() per table (one text whatever the count). Synthetic tables (10, of 6
to 11 columns: bigint, text, jsonb, timestamptz, float8, int4; an index each) and rows (20
a rollout), in a schema of its own on a fresh database; prints the PostgreSQL backend's
CPU (from /proc), this process's CPU and the wall time, per rollout (PERFORMANCE.md, tenth
and eleventh rounds).

    .venv/bin/python -m bench.pg_insert_forms [--groups 15 50] [--rollouts 4500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.common import cpu_seconds, fresh_database

TYPES = ["int8", "text", "jsonb", "timestamptz", "float8", "int8", "text", "text", "int4", "jsonb"]
TABLES = [[(f"c{i}", TYPES[(i + t) % len(TYPES)]) for i in range(6 + t % 6)] for t in range(10)]
Write = Callable[[psycopg.RawCursor[Any], int, list[list[str]]], None]


def _value(kind: str, i: int) -> str:
    return {
        "int8": str(i),
        "int4": str(i % 1000),
        "text": f"value-{i}-abc",
        "jsonb": json.dumps({"k": i, "s": "x" * 20}),
        "timestamptz": "2026-12-05T01:02:03.456+00:00",
        "float8": str(i * 0.5),
    }[kind]


def _rows(t: int, n: int, base: int) -> list[list[str]]:
    return [[_value(kind, base + r) for _, kind in TABLES[t]] for r in range(n)]


def _names(t: int) -> str:
    return ", ".join(c for c, _ in TABLES[t])


def _multirow_sql(t: int, n: int) -> str:
    width = len(TABLES[t])
    marks = ", ".join(
        "(" + ", ".join(f"${r * width + c + 1}" for c in range(width)) + ")" for r in range(n)
    )
    return f"INSERT INTO forms.t{t} ({_names(t)}) VALUES {marks}"


def multirow(cur: psycopg.RawCursor[Any], t: int, rows: list[list[str]]) -> None:
    """VALUES ($1, ...), (...) of the exact count, not prepared (db/bulk.py's plain form)."""
    cur.execute(_multirow_sql(t, len(rows)), [v for row in rows for v in row], prepare=False)


def chunked(cur: psycopg.RawCursor[Any], t: int, rows: list[list[str]]) -> None:
    """Multi-row INSERTs of power-of-two row counts (a few texts per table), prepared."""
    start = 0
    while start < len(rows):
        n = 1 << ((len(rows) - start).bit_length() - 1)
        chunk = rows[start : start + n]
        cur.execute(_multirow_sql(t, n), [v for row in chunk for v in row], prepare=True)
        start += n


def padded(cur: psycopg.RawCursor[Any], t: int, rows: list[list[str]]) -> None:
    """One INSERT ... SELECT FROM (VALUES ...) of the next power-of-two row count, padded
    with rows of NULLs that its WHERE drops, each text prepared: one statement a table."""
    cols = TABLES[t]
    width = len(cols)
    n = 1 << (len(rows) - 1).bit_length()
    marks = ", ".join(
        "(" + ", ".join(f"${r * width + c + 1}::{cols[c][1]}" for c in range(width)) + ")"
        for r in range(n)
    )
    sql = (
        f"INSERT INTO forms.t{t} ({_names(t)}) SELECT * FROM (VALUES {marks}) "
        f"AS v({_names(t)}) WHERE v.c0 IS NOT NULL"
    )
    values = [v for row in rows for v in row] + [None] * (width * (n - len(rows)))
    cur.execute(sql, values, prepare=True)


def unnest(cur: psycopg.RawCursor[Any], t: int, rows: list[list[str]]) -> None:
    """One text per table: each column an array (psycopg adapts the lists), prepared."""
    cols = TABLES[t]
    arrays = ", ".join(f"${i + 1}::text[]" for i in range(len(cols)))
    sql = (
        f"INSERT INTO forms.t{t} ({_names(t)}) SELECT "
        + ", ".join(f"u.{c}::{kind}" for c, kind in cols)
        + f" FROM unnest({arrays}) AS u({_names(t)})"
    )
    cur.execute(sql, [list(col) for col in zip(*rows, strict=True)], prepare=True)


FORMS: dict[str, Write] = {
    "multi-row": multirow,
    "chunked": chunked,
    "padded": padded,
    "unnest": unnest,
}


def _run(conn: psycopg.Connection[Any], write: Write, groups: int, size: int) -> list[float]:
    pid = conn.info.backend_pid
    cur = psycopg.RawCursor(conn)
    backend, wall, cpu = cpu_seconds(pid), time.perf_counter(), time.process_time()
    for g in range(groups):
        with conn.pipeline():
            for t in range(len(TABLES)):
                write(cur, t, _rows(t, size * (1 + t % 3), g * 1000))
        conn.commit()
    n = groups * size
    return [
        (cpu_seconds(pid) - backend) * 1000 / n,
        (time.process_time() - cpu) * 1000 / n,
        (time.perf_counter() - wall) * 1000 / n,
    ]


def main(argv: list[str] | None = None) -> None:
    """Print one line per group size, round and form."""
    parser = argparse.ArgumentParser(prog="python -m bench.pg_insert_forms", description=__doc__)
    parser.add_argument("--groups", type=int, nargs="*", default=[15, 50])
    parser.add_argument("--rollouts", type=int, default=4500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with fresh_database("postgresql") as url:
        dsn = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE SCHEMA forms")
            for t, cols in enumerate(TABLES):
                columns = ", ".join(f"{c} {kind}" for c, kind in cols)
                conn.execute(f"CREATE TABLE forms.t{t} (id bigserial PRIMARY KEY, {columns})")
                conn.execute(f"CREATE INDEX ON forms.t{t} (c0)")
            conn.commit()
            for size in args.groups:
                for round_ in range(args.rounds):
                    for name, write in FORMS.items():
                        backend, cpu, wall = _run(conn, write, args.rollouts // size, size)
                        print(
                            f"groups of {size:>2}, round {round_ + 1}, {name:>9}: PostgreSQL "
                            f"{backend:.3f} ms, this process {cpu:.3f} ms, wall {wall:.3f} ms "
                            "per rollout",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
