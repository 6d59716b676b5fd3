"""Latency of served reads: GET /v1/rollouts/{run_id}/trace of runs stored with
trajectories only (converted on each read) and GET .../trajectories of runs that have
them (served as stored), one client, against `tracestore serve` on SQLite.

The 108 KB corpus (bench/corpus.py), 20 runs each way, read in 40 rounds (the first one
a warm-up): p50 and mean over the rest. With `--against TREE` (another checkout, e.g. a
`git worktree` of an earlier commit), a second server runs that tree's code on the same
database and every read goes to both, back to back, in alternating order: on a noisy
machine a difference shows only when the two are read side by side.

    .venv/bin/python -m bench.served_reads [--against /tmp/base]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import httpx
import orjson

from bench.common import fresh_database, server
from bench.corpus import corpus
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes

RUNS = 20
ROUNDS = 40


def _corpus() -> tuple[list[bytes], list[bytes]]:
    stored = corpus("multi", RUNS)
    legacy = []  # the same rollouts without their trace: /trace converts them
    for raw in stored:
        doc: dict[str, Any] = orjson.loads(raw)
        doc["trace"] = None
        doc["run_id"] += "-legacy"
        legacy.append(orjson.dumps(doc))
    return stored, legacy


def measure(against: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """p50/mean milliseconds of each kind of served read, per server."""
    stored, legacy = _corpus()
    out: dict[str, dict[str, dict[str, float]]] = {}
    with fresh_database("sqlite") as url:
        engine = create_engine(url)
        for raw in stored + legacy:
            assert ingest_bytes(engine, raw).status == "created"
        engine.dispose()
        with ExitStack() as stack:
            bases = {"this": stack.enter_context(server(url))}
            if against is not None:
                bases["against"] = stack.enter_context(server(url, PYTHONPATH=against))
            http = stack.enter_context(httpx.Client())
            for part, docs in (("trace", legacy), ("trajectories", stored)):
                paths = [f"/v1/rollouts/{orjson.loads(d)['run_id']}/{part}" for d in docs]
                seconds: dict[str, list[float]] = {name: [] for name in bases}
                for r in range(ROUNDS):
                    order = list(bases.items())
                    if r % 2:
                        order.reverse()
                    for path in paths:
                        for name, base in order:
                            start = time.perf_counter()
                            response = http.get(base + path)
                            if r:  # the first round warms up
                                seconds[name].append(time.perf_counter() - start)
                            assert response.status_code == 200, response.text[:200]
                out[part] = {
                    name: {
                        "p50_ms": round(statistics.median(v) * 1000, 3),
                        "mean_ms": round(statistics.mean(v) * 1000, 3),
                    }
                    for name, v in seconds.items()
                }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Print the figures as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.served_reads", description=__doc__)
    parser.add_argument("--against", help="another tree whose server is read side by side")
    args = parser.parse_args(argv)
    print(orjson.dumps(measure(args.against)).decode())


if __name__ == "__main__":
    main()
