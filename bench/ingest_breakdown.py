"""Where in-process ingest time goes, per rollout: parse, prepare, write; next to the floor.

`ingest_raw_many` = parse (orjson) + prepare (validate, project into rows, drift comparison
and the phase-1 reproduction check) + write (bulk writes, one commit per batch of 50). The
floor (bench/ingest.py) is parse + the bare driver's write. So the gap to the floor splits
into what tracestore computes per rollout and what its write costs over the bare one.

    python -m bench.ingest_breakdown [--n-multi 100] [--n-single 1000] [--db sqlite]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from bench import ingest as ingest_bench
from bench.common import fresh_database, pg_available
from bench.corpus import corpus
from bench.prepare_cost import timed_pass
from tracestore.db.engine import create_engine
from tracestore.ingest.service import store_prepared

BATCH = 50


def measure(backend: str, docs: Sequence[bytes]) -> dict[str, Any]:
    """Milliseconds per rollout of each ingest stage, and of the floor, on `backend`."""
    n = len(docs)
    parse_s, prepare_s, prepared = timed_pass(docs)  # one pass (bench.prepare_cost: best of 7)
    with fresh_database(backend) as url:
        engine = create_engine(url)
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            store_prepared(engine, prepared[i : i + BATCH])
        write_s = time.perf_counter() - start
        engine.dispose()
    with fresh_database(backend) as url:
        floor_s = ingest_bench.floor(url, docs)
    ms = 1000 / n
    return {
        "rollouts": n,
        "parse_ms": parse_s * ms,
        "prepare_ms": prepare_s * ms,
        "write_ms": write_s * ms,
        "total_ms": (parse_s + prepare_s + write_s) * ms,
        "floor_ms": floor_s * ms,
        "floor_write_ms": (floor_s - parse_s) * ms,
    }


def run(backends: Sequence[str], n_multi: int, n_single: int) -> dict[str, Any]:
    """The breakdown for both corpora on every backend."""
    corpora = {"multi": corpus("multi", n_multi), "single": corpus("single", n_single)}
    return {
        f"{backend}/{name}": measure(backend, docs)
        for backend in backends
        for name, docs in corpora.items()
    }


def markdown(results: dict[str, Any]) -> str:
    """The breakdown as a Markdown table."""
    lines = [
        "| database/corpus | parse | prepare | write | total | floor (parse + bare write) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, r in results.items():
        lines.append(
            f"| {key} | {r['parse_ms']:.3f} ms | {r['prepare_ms']:.3f} ms | "
            f"{r['write_ms']:.3f} ms | {r['total_ms']:.3f} ms | "
            f"{r['floor_ms']:.3f} ms ({r['parse_ms']:.3f} + {r['floor_write_ms']:.3f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-multi", type=int, default=100)
    parser.add_argument("--n-single", type=int, default=1000)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], action="append")
    args = parser.parse_args()
    backends = args.db or (["sqlite", "postgresql"] if pg_available() else ["sqlite"])
    print(markdown(run(backends, args.n_multi, args.n_single)))


if __name__ == "__main__":
    main()
