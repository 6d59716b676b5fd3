"""HTTP look-up latency against a kept store, for before/after pairs of trees.

`PYTHONPATH=TREE python -m bench.lookup_http SAMPLES SEED` runs TREE's `tracestore serve`
(one worker) on the store `python -m bench.lookup --db postgresql --keep
tracestore_lookup_1m` built, warms it with 200 look-ups, then times SAMPLES look-ups by
cid and SAMPLES by run_id (the same random runs, from SEED) with a keep-alive httpx
client, and prints their p50/p99 as JSON. Run it for each tree in turns: the machine's
drift then falls on both alike (bench/results/lookup-c19.txt, bench/README.md item 17).
Only `bench.common.server` and `percentiles` are used, which every tree since issue 19
has, so a tree's own copy of this file is not needed.
"""

from __future__ import annotations

import json
import random
import sys
import time

import httpx

from bench.common import percentiles, server

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/tracestore_lookup_1m"
RUNS = 1_000_000


def main(samples: int, seed: int) -> dict[str, dict[str, float]]:
    """p50/p99 of `samples` look-ups by cid and by run_id over HTTP."""
    rng = random.Random(seed)
    picks = [rng.randint(1, RUNS) for _ in range(samples)]
    out: dict[str, dict[str, float]] = {}
    with server(URL) as base, httpx.Client(base_url=base) as http:
        for _ in range(200):
            http.get(f"/v1/correlations/trace_{rng.randint(1, RUNS):016x}")
        for kind, path in (
            ("cid", "/v1/correlations/trace_{:016x}"),
            ("run_id", "/v1/rollouts/run-{:09d}"),
        ):
            times = []
            for k in picks:
                started = time.perf_counter()
                answer = http.get(path.format(k))
                times.append(time.perf_counter() - started)
                assert answer.status_code == 200, answer.text
            out[kind] = percentiles(times)
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
