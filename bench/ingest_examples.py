"""Ingest throughput and bytes on disk for examples/rollouts.jsonl, in one process.

    python -m bench.ingest_examples [--copies N] [--pg URL]

Ingests the examples file N times (run_ids suffixed per copy, so every copy is created)
through the library call the API uses (`ingest_bytes`), into a fresh SQLite file and a
fresh PostgreSQL database, and prints rollouts/s, MB/s and bytes on disk per rollout
next to the raw JSON and its gzip size.
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from sqlalchemy import create_engine as sa_engine
from sqlalchemy import text

from tracestore.db import migrate
from tracestore.db.base import Base
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes

EXAMPLES = Path(
    os.environ.get("TRACESTORE_EXAMPLES_DIR", Path(__file__).resolve().parents[1] / "examples")
)


def corpus(copies: int) -> list[bytes]:
    """The example lines that are created in file order, copied with fresh run_ids."""
    seen: set[str] = set()
    lines = []
    for raw in (EXAMPLES / "rollouts.jsonl").read_bytes().splitlines():
        doc = orjson.loads(raw)
        if doc["run_id"] not in seen:
            seen.add(doc["run_id"])
            lines.append(doc)
    out = []
    for copy in range(copies):
        for doc in lines:
            out.append(orjson.dumps(dict(doc, run_id=f"{doc['run_id']}-c{copy}")))
    return out


def size_on_disk(url: str) -> int:
    """Bytes the store occupies: tables and indexes (SQLite: the file after a checkpoint)."""
    engine = create_engine(url)
    try:
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            path = engine.url.database
            assert path is not None
            return Path(path).stat().st_size
        names = [t.name for t in Base.metadata.sorted_tables]
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                        "WHERE c.relname = ANY(:names) AND c.relkind = 'r'"
                    ),
                    {"names": names},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def measure(url: str, docs: list[bytes]) -> dict[str, float]:
    """Ingest `docs` into an empty store at `url`; return the figures."""
    engine = create_engine(url)
    migrate.upgrade(engine)
    empty = size_on_disk(url)
    start = time.perf_counter()
    for raw in docs:
        result = ingest_bytes(engine, raw)
        assert result.status == "created", result
    elapsed = time.perf_counter() - start
    engine.dispose()
    raw_bytes = sum(len(d) for d in docs)
    disk = size_on_disk(url) - empty
    engine = create_engine(url)
    with engine.connect() as conn:
        # The zstd copies of the documents (what makes reads lossless), part of `disk`.
        compressed = conn.execute(text("SELECT sum(length(body)) FROM run_documents")).scalar_one()
    engine.dispose()
    return {
        "rollouts": len(docs),
        "seconds": elapsed,
        "rollouts_per_s": len(docs) / elapsed,
        "mb_per_s": raw_bytes / elapsed / 1e6,
        "raw_bytes_per_rollout": raw_bytes / len(docs),
        "gzip_bytes_per_rollout": sum(len(gzip.compress(d)) for d in docs) / len(docs),
        "disk_bytes_per_rollout": disk / len(docs),
        "disk_to_raw": disk / raw_bytes,
        "document_bytes_per_rollout": compressed / len(docs),
    }


def main() -> None:
    """Run on SQLite and PostgreSQL and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    docs = corpus(args.copies)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = measure(f"sqlite:///{tmp}/bench.db", docs)
    admin = sa_engine(args.pg, isolation_level="AUTOCOMMIT")
    name = f"tracestore_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        from sqlalchemy.engine import make_url

        url = make_url(args.pg).set(database=name).render_as_string(hide_password=False)
        results["postgresql"] = measure(url, docs)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print(f"{len(docs)} rollouts ({args.copies} copies of the examples' created lines)")
    columns = ["database", "rollouts/s", "MB/s", "raw B/rollout", "gzip B/rollout"]
    columns += ["disk B/rollout", "disk/raw", "of which zstd documents B/rollout"]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for db, r in results.items():
        print(
            f"| {db} | {r['rollouts_per_s']:.0f} | {r['mb_per_s']:.1f} | "
            f"{r['raw_bytes_per_rollout']:.0f} | {r['gzip_bytes_per_rollout']:.0f} | "
            f"{r['disk_bytes_per_rollout']:.0f} | {r['disk_to_raw']:.2f} | "
            f"{r['document_bytes_per_rollout']:.0f} |"
        )


if __name__ == "__main__":
    main()
