"""Floods of readers against `tracestore serve` (issue 18 item 2): 500s, /health latency
during a flood and time to /health after it, a producer's posts acknowledged meanwhile.

A server with the default settings (1 worker) over a store of `--runs` rollouts, on
loopback, from raw sockets (bench/floods.py). Scenarios, each after the server settled:

- `fresh_300_cheap`: on a server just started, 300 concurrent `?limit=1` reads, once each;
- `heavy_60`: 60 concurrent `GET /v1/rollouts?limit=1000`, once each;
- `abandoned_200`: 200 of those sent, then their clients leave after 1 s: seconds until
  /health answers, and until a read does;
- `load_300`: 300 readers (list, fetch, trace, big list) for `--seconds`, a producer
  posting rollouts with tracestore's client throughout, /health probed every 0.2 s.

    .venv/bin/python -m bench.overload [--db sqlite|postgresql|both] [--seconds 30]

Writes bench/results/overload.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import fresh_database, pg_available
from bench.floods import HealthProbe, abandoned_requests, p99, read_flood, time_to_health
from bench.hostile_memory import serve

RESULTS = Path(__file__).resolve().parent / "results"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "rollouts.jsonl"
HEAVY = "/v1/rollouts?limit=1000"


class Rollouts:
    """New rollouts made from the small examples: a fresh run_id each."""

    def __init__(self, prefix: str) -> None:
        lines = EXAMPLES.read_bytes().splitlines()
        self.templates = [orjson.loads(raw) for raw in lines if len(raw) <= 50_000]
        self.prefix = prefix
        self._n = itertools.count()

    def make(self) -> bytes:
        """The next rollout's bytes."""
        n = next(self._n)
        doc = dict(self.templates[n % len(self.templates)], run_id=f"{self.prefix}-{n:07d}")
        return orjson.dumps(doc)


def fill(url: str, n: int) -> list[str]:
    """Post `n` rollouts in NDJSON batches of 500; their run_ids."""
    rollouts = Rollouts("fill")
    run_ids = []
    with httpx.Client(base_url=url, timeout=600) as http:
        for at in range(0, n, 500):
            docs = [rollouts.make() for _ in range(min(500, n - at))]
            response = http.post(
                "/v1/rollouts/batch",
                content=b"\n".join(docs),
                headers={"Content-Type": "application/x-ndjson"},
            )
            response.raise_for_status()
            run_ids += [orjson.loads(d)["run_id"] for d in docs]
    return run_ids


def _ms(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p99_ms": round(p99(samples) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
        "n": len(samples),
    }


def _settle(url: str) -> None:
    time_to_health(url, 120)
    with httpx.Client(base_url=url, timeout=120) as http:
        http.get("/v1/rollouts?limit=1")


def fresh_300_cheap(url: str) -> dict[str, Any]:
    """300 concurrent cheap reads on a server that just started."""
    start = time.monotonic()
    result = read_flood(url, ["/v1/rollouts?limit=1"], clients=300, per_client=1)
    return {
        "answers": dict(result.answers),
        "server_errors": result.server_errors,
        "all_answered_s": round(time.monotonic() - start, 2),
    }


def heavy_60(url: str) -> dict[str, Any]:
    """60 concurrent list reads of 1,000 runs."""
    with HealthProbe(url, every=0.1) as probe:
        start = time.monotonic()
        result = read_flood(url, [HEAVY], clients=60, per_client=1)
        took = time.monotonic() - start
    return {
        "answers": dict(result.answers),
        "server_errors": result.server_errors,
        "retry_after_missing": result.retry_after_missing,
        "all_answered_s": round(took, 2),
        "health_during": _ms(probe.latencies),
    }


def abandoned_200(url: str) -> dict[str, Any]:
    """200 heavy reads whose clients leave after 1 s."""
    abandoned_requests(url, HEAVY, 200, after=1.0)
    health = time_to_health(url, 600)
    start = time.monotonic()
    with httpx.Client(base_url=url, timeout=600) as http:
        status = http.get("/v1/rollouts?limit=1").status_code
    return {
        "health_after_s": round(health, 2),
        "read_after_s": round(time.monotonic() - start, 2),
        "read_status": status,
    }


def load_300(url: str, run_ids: list[str], seconds: float) -> dict[str, Any]:
    """300 readers for `seconds`, a producer posting throughout, /health probed."""
    from tracestore.client import TracestoreClient

    paths = [
        "/v1/rollouts?limit=1",
        f"/v1/rollouts/{run_ids[0]}",
        "/v1/rollouts?limit=100",
        f"/v1/rollouts/{run_ids[1]}/trace",
    ]
    rollouts = Rollouts("load")
    statuses: list[str] = []
    post_times: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        with TracestoreClient(url, max_retries=50, backoff=0.2, timeout=120) as client:
            while not stop.is_set():
                start = time.monotonic()
                statuses.append(client.post_rollout(rollouts.make())["status"])
                post_times.append(time.monotonic() - start)

    producer = threading.Thread(target=produce)
    with HealthProbe(url, every=0.2) as probe:
        producer.start()
        result = read_flood(url, paths, clients=300, seconds=seconds)
        stop.set()
        producer.join(timeout=600)
    health_after = time_to_health(url, 600)
    return {
        "seconds": seconds,
        "answers": dict(result.answers),
        "reads_per_s": round(result.count("200") / seconds, 1),
        "server_errors": result.server_errors,
        "retry_after_missing": result.retry_after_missing,
        "health_during": _ms(probe.latencies),
        "health_statuses": dict(probe.statuses),
        "health_after_s": round(health_after, 2),
        "posts": {
            "acknowledged": statuses.count("created") + statuses.count("duplicate"),
            "other": len(statuses) - statuses.count("created") - statuses.count("duplicate"),
            "latency_incl_retries": _ms(post_times),
        },
    }


def run(backend: str, runs: int, seconds: float, log: Path) -> dict[str, Any]:
    """Every scenario on `backend`."""
    out: dict[str, Any] = {"runs": runs}
    with fresh_database(backend) as db_url:
        with serve(db_url, log) as server:
            run_ids = fill(server.url, runs)
        with serve(db_url, log) as server:  # a fresh process for the first flood
            out["fresh_300_cheap"] = fresh_300_cheap(server.url)
            scenarios: tuple[tuple[str, Callable[[], Any]], ...] = (
                ("heavy_60", lambda: heavy_60(server.url)),
                ("abandoned_200", lambda: abandoned_200(server.url)),
                ("load_300", lambda: load_300(server.url, run_ids, seconds)),
            )
            for name, scenario in scenarios:
                _settle(server.url)
                out[name] = scenario()
                print(backend, name, json.dumps(out[name]), flush=True)
    return out


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        "| | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(label: str, get: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(str(get(r)) for r in results.values()) + " |")

    row("runs in the store", lambda r: r["runs"])
    row("300 cheap reads on a fresh server: answers", lambda r: r["fresh_300_cheap"]["answers"])
    row("... all answered after (s)", lambda r: r["fresh_300_cheap"]["all_answered_s"])
    row("60 heavy reads (?limit=1000): answers", lambda r: r["heavy_60"]["answers"])
    row("... /health during: p99 (ms)", lambda r: r["heavy_60"]["health_during"]["p99_ms"])
    row(
        "200 abandoned heavy reads: /health answers after (s)",
        lambda r: r["abandoned_200"]["health_after_s"],
    )
    row("... a read answers after (s)", lambda r: r["abandoned_200"]["read_after_s"])
    row("300 readers + a producer: answers", lambda r: r["load_300"]["answers"])
    row("... reads/s answered 200", lambda r: r["load_300"]["reads_per_s"])
    row("... 500s", lambda r: r["load_300"]["server_errors"])
    row(
        "... /health during: p50 / p99 / max (ms)",
        lambda r: "{p50_ms} / {p99_ms} / {max_ms}".format(**r["load_300"]["health_during"]),
    )
    row("... /health after the flood (s)", lambda r: r["load_300"]["health_after_s"])
    row(
        "... producer: posts acknowledged / other",
        lambda r: "{acknowledged} / {other}".format(**r["load_300"]["posts"]),
    )
    row(
        "... producer: post p50 / p99 incl. retries (ms)",
        lambda r: "{p50_ms} / {p99_ms}".format(**r["load_300"]["posts"]["latency_incl_retries"]),
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the scenarios; write bench/results/overload.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        print("PostgreSQL is not reachable: SQLite only")
        backends.remove("postgresql")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            results[backend] = run(backend, args.runs, args.seconds, Path(tmp) / "server.log")
    RESULTS.mkdir(exist_ok=True)
    body = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "command": f"python -m bench.overload --db {args.db} --runs {args.runs} "
        f"--seconds {args.seconds:g}",
        "results": results,
    }
    (RESULTS / "overload.json").write_text(json.dumps(body, indent=2) + "\n")
    table = _markdown(results)
    (RESULTS / "overload.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
