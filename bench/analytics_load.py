"""Reports and ingest at once: what reports do to ingest, and the server's memory.

    python -m bench.analytics_load [--seconds 30] [--steps N] [--db sqlite|postgresql]
                                   [--url URL] [--ingest-clients 4] [--report-clients 6]

Serves the store (`bench.analytics_memory`'s options: built for the run, or `--url`) with
`tracestore serve --workers 2`, then for `--seconds` keeps `--ingest-clients` clients
posting the examples (each under a new run id) and `--report-clients` clients running the
named reports in turn (a report started near the end runs to its end). Prints the
answers by status, the ingest latency, and the peak resident memory of the server's
workers and of their analytics children. To compare another tree, copy this file and
bench/analytics_memory.py into it and run `python -m bench.analytics_load` there with
that tree on `PYTHONPATH`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import orjson

from bench.analytics_memory import store, store_options
from bench.common import server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "rollouts.jsonl"
REPORTS = ("tools", "rewards", "models", "returns", "drift", "migration")


def _children(pid: int) -> list[int]:
    """`pid`'s children (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError):  # gone meanwhile
            continue
    return found


def _peak_mib(pid: int) -> int | None:
    """The process's peak resident memory, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def _is_worker(pid: int) -> bool:
    try:
        return b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _peaks(supervisor: int) -> tuple[list[int], list[int]]:
    """Peak MiB of the server's workers, and of their analytics children."""
    workers = [pid for pid in _children(supervisor) if _is_worker(pid)]
    children = [kid for pid in workers for kid in _children(pid)]
    return (
        sorted((p for p in map(_peak_mib, workers) if p is not None), reverse=True),
        sorted((p for p in map(_peak_mib, children) if p is not None), reverse=True),
    )


async def _ingest(
    client: httpx.AsyncClient,
    docs: list[dict[str, object]],
    until: float,
    latencies: list[float],
    answers: Counter[str],
) -> None:
    for doc in itertools.cycle(docs):
        if time.monotonic() >= until:
            return
        body = orjson.dumps({**doc, "run_id": f"load-{uuid.uuid4().hex}"})
        start = time.perf_counter()
        try:
            got = await client.post("/v1/rollouts", content=body)
        except httpx.HTTPError as exc:  # counted, not the end of the run
            answers[f"ingest {type(exc).__name__}"] += 1
            continue
        latencies.append(time.perf_counter() - start)
        answers[f"ingest {got.status_code}"] += 1


async def _reports(
    client: httpx.AsyncClient, first: int, until: float, answers: Counter[str]
) -> None:
    for name in itertools.islice(itertools.cycle(REPORTS), first, None):
        if time.monotonic() >= until:
            return
        try:
            got = await client.get(f"/v1/reports/{name}", timeout=600)
        except httpx.HTTPError as exc:
            answers[f"report {type(exc).__name__}"] += 1
            continue
        code = "" if got.status_code == 200 else f" {got.content[:80]!r}"
        if got.headers.get("content-type", "").startswith("application/json"):
            code = "" if got.status_code == 200 else " " + got.json()["error"]["code"]
        answers[f"report {got.status_code}{code}"] += 1


async def _load(base: str, args: argparse.Namespace) -> tuple[Counter[str], list[float]]:
    docs = [orjson.loads(line) for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    until = time.monotonic() + args.seconds
    answers: Counter[str] = Counter()
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        await asyncio.gather(
            *(_ingest(client, docs, until, latencies, answers) for _ in range(args.ingest_clients)),
            *(_reports(client, i, until, answers) for i in range(args.report_clients)),
        )
    return answers, latencies


def main() -> None:
    """Serve the store, load it, print what happened."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.analytics_load", description=__doc__.splitlines()[0]
    )
    store_options(parser)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--ingest-clients", type=int, default=4)
    parser.add_argument("--report-clients", type=int, default=6)
    args = parser.parse_args()
    with store(args) as url, server(url, workers=2) as base:
        answers, latencies = asyncio.run(_load(base, args))
        workers, children = _peaks(_supervisor(base))  # while the server runs
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    median = statistics.median(latencies) if latencies else 0.0
    print(
        f"{args.seconds:g} s, {args.ingest_clients} ingest clients, "
        f"{args.report_clients} report clients: {dict(sorted(answers.items()))}"
    )
    print(f"ingest p50 {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
    print(f"peak resident memory, MiB: workers {workers}, analytics children {children}")


def _supervisor(base: str) -> int:
    """The pid of the `tracestore serve` listening at `base` (from /proc)."""
    port = base.rsplit(":", 1)[1]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in words and port.encode() in words:
            return int(cmdline.parent.name)
    raise RuntimeError(f"no tracestore serve on port {port}")


if __name__ == "__main__":
    main()
