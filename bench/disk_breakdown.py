"""Bytes on disk per rollout, table by table and index by index, on PostgreSQL.

Shows where a rollout's bytes go: the zstd document, each typed table (heap + TOAST), each
index. `python -m bench.disk_breakdown [--corpus single|multi] [--n N]`
"""

from __future__ import annotations

import argparse

from sqlalchemy import text

from bench.common import fresh_database
from bench.corpus import corpus
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_many

SIZES = """
SELECT c.relname, c.relkind,
       pg_relation_size(c.oid) + coalesce(pg_total_relation_size(c.reltoastrelid), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') AND c.relname <> 'alembic_version'
ORDER BY 3 DESC
"""


def main() -> None:
    """Ingest a corpus into a fresh PostgreSQL database and print bytes per rollout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=["single", "multi"], default="single")
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    docs = corpus(args.corpus, args.n)
    raw = sum(map(len, docs)) / args.n
    with fresh_database("postgresql") as url:
        engine = create_engine(url)
        empty: dict[str, int] = {}
        with engine.connect() as conn:
            empty = {name: size for name, _, size in conn.execute(text(SIZES))}
        for i in range(0, args.n, 50):
            ingest_many(engine, docs[i : i + 50])
        with engine.connect() as conn:
            rows = [(n, k, s - empty.get(n, 0)) for n, k, s in conn.execute(text(SIZES))]
        engine.dispose()
    total = sum(size for _, _, size in rows)
    print(
        f"{args.corpus}: raw JSON {raw:.0f} B per rollout; on disk {total / args.n:.0f} B "
        f"({total / args.n / raw:.2f}x)"
    )
    print("| relation | kind | bytes per rollout |\n|---|---|---:|")
    for name, kind, size in rows:
        if size > 0:
            print(f"| {name} | {'index' if kind == 'i' else 'table'} | {size / args.n:.0f} |")


if __name__ == "__main__":
    main()
