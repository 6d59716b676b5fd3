"""Fetching a whole rollout back (GET /v1/rollouts/{run_id}) for 5 KB, 100 KB and 5 MB.

Floor: reading the same bytes from a file (open + read), the least any server could do.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import percentiles, server
from bench.corpus import sized
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes

SIZES = {"5KB": 5_000, "100KB": 100_000, "5MB": 5_000_000}


def measure(url: str, samples: int) -> dict[str, Any]:
    """p50/p99 of fetching each size, over HTTP and from a file."""
    docs = {name: sized(n, seed=i) for i, (name, n) in enumerate(SIZES.items())}
    engine = create_engine(url)
    for raw in docs.values():
        assert ingest_bytes(engine, raw).status == "created"
    engine.dispose()
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        server(url) as base,
        httpx.Client(base_url=base, timeout=60) as http,
    ):
        for name, raw in docs.items():
            run_id = orjson.loads(raw)["run_id"]
            path = Path(tmp) / f"{name}.json"
            path.write_bytes(raw)
            n = samples if len(raw) < 1_000_000 else max(20, samples // 10)
            file_times, http_times = [], []
            for _ in range(n):
                start = time.perf_counter()
                with path.open("rb") as f:
                    data = f.read()
                file_times.append(time.perf_counter() - start)
                assert data == raw
                start = time.perf_counter()
                response = http.get(f"/v1/rollouts/{run_id}")
                http_times.append(time.perf_counter() - start)
                assert response.content == raw
            floor = percentiles(file_times)
            served = percentiles(http_times)
            served["p50_ratio_to_floor"] = served["p50_ms"] / floor["p50_ms"]
            out[name] = {"bytes": len(raw), "floor_file": floor, "http": served}
    return out
