"""What a single post costs beyond a batch item, part by part (issue 19, bench/README.md
item 19).

Three measures, on SQLite and PostgreSQL, 1.2 KB rollouts:

1. Over HTTP, `serve --workers 2`, 32 clients: server CPU per single post to the API as
   `tracestore serve` runs it, then per single post to the *bare ingest path* (the same
   app, but `POST /v1/rollouts` answered by a few lines of ASGI that read the body, hand
   it to the worker's group commit and send the answer: no framework, no middleware, no
   checks), then per item of NDJSON batches of 50 to the API. The first two differ by what
   the framework and the middleware cost a post; the bare path is an experiment, not a
   way to serve (it skips the API key, the limits and the error shape).
2. The group commit's sizes on those runs (`tracestore_group_commit_rollouts` on /metrics).
3. In-process, `store_each` (the group commit's write) per group of 1, 8 and 50 prepared
   rollouts, one transaction each: CPU per rollout, so the group's fixed cost shows.

    .venv/bin/python -m bench.single_post_parts [--db sqlite|postgresql|both] [--posts 5000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.common import free_port, fresh_database, pg_available
from bench.concurrency import WORKERS, Seeds, measure, serving
from tracestore.api.routes.rollouts import new_group_commit
from tracestore.api.server import served_app
from tracestore.db.engine import create_engine
from tracestore.db.uow import write_connection
from tracestore.ingest.group import GroupCommit
from tracestore.ingest.service import cyclic_gc_paused, prepare
from tracestore.store.rollouts import store_each

CLIENTS = 32
GROUPS = (1, 8, 50)
ROOT = str(Path(__file__).resolve().parent.parent)


def bare_ingest_app() -> ASGIApp:
    """The API, but single posts go straight to the group commit (see the module doc)."""
    return bare_ingest_path(served_app())


def bare_ingest_path(app: FastAPI) -> ASGIApp:
    """`app`, with `POST /v1/rollouts` read, handed to the group commit and answered by a
    few lines of ASGI (bench.app_overhead measures against it too)."""
    groups: list[GroupCommit] = []

    async def bare(scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == "/v1/rollouts"
        ):
            await app(scope, receive, send)
            return
        if not groups:
            groups.append(new_group_commit(app.state.tracestore))
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        result = await groups[0].submit(body)
        answer = orjson.dumps(result.to_json())
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return bare


def _group_sizes(base: str) -> tuple[float, float]:
    """(groups, posts) one worker's /metrics counted (the scrape reaches one worker)."""
    count = total = 0.0
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tracestore_group_commit_rollouts_count"):
            count = float(line.split()[-1])
        elif line.startswith("tracestore_group_commit_rollouts_sum"):
            total = float(line.split()[-1])
    return count, total


def over_http(backend: str, posts: int, seeds: Seeds) -> dict[str, Any]:
    """Server CPU per post: the API, the bare ingest path, and a batch item."""
    out: dict[str, Any] = {}
    for name, factory in (
        ("api", "tracestore.api.server:served_app"),
        ("bare", "bench.single_post_parts:bare_ingest_app"),
    ):
        with fresh_database(backend) as url:
            port = free_port()
            command = [
                sys.executable,
                "-c",
                "from tracestore.api.server import run_server; "
                f"run_server(host='127.0.0.1', port={port}, workers={WORKERS}, "
                f"log_level='warning', access_log=False, app='{factory}')",
            ]
            # The server imports this module (bare_ingest_app); a PYTHONPATH given (a tree to
            # measure) stays first.
            path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), ROOT) if p)
            env = {"TRACESTORE_DATABASE_URL": url, "PYTHONPATH": path}
            with serving(command, port, env, WORKERS) as (base, pid):
                measure(base, pid, seeds.take("single", 200), 8, batch=False)  # warm-up
                before = _group_sizes(base)
                single = measure(base, pid, seeds.take("single", posts), CLIENTS, batch=False)
                after = _group_sizes(base)
                assert single["failures"] == 0, single["first_failure"]
                out[name] = single["server_cpu_ms_per_rollout"]
                out[f"{name}_per_s"] = single["rollouts_per_s"]
                groups = after[0] - before[0]
                out[f"{name}_group"] = (after[1] - before[1]) / groups if groups else None
                if name == "api":
                    batch = measure(base, pid, seeds.take("single", posts), CLIENTS, batch=True)
                    out["batch_item"] = batch["server_cpu_ms_per_rollout"]
                    out["batch_per_s"] = batch["rollouts_per_s"]
    return out


def in_process(backend: str, seeds: Seeds, n: int = 800) -> dict[int, float]:
    """CPU ms per rollout of store_each over groups of each size, one transaction each."""
    out: dict[int, float] = {}
    with fresh_database(backend) as url:
        engine = create_engine(url)
        try:
            with write_connection(engine) as conn:  # warm the connection and the caches
                store_each(conn, [prepare(raw) for raw in seeds.take("single", 8)])
            for size in GROUPS:
                with cyclic_gc_paused():
                    prepared = [prepare(raw) for raw in seeds.take("single", n)]
                start = time.process_time()
                for i in range(0, n, size):
                    with write_connection(engine) as conn:
                        store_each(conn, prepared[i : i + size])
                out[size] = (time.process_time() - start) * 1000 / n
        finally:
            engine.dispose()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Measure each part on each database and print a Markdown table."""
    parser = argparse.ArgumentParser(prog="python -m bench.single_post_parts", description=__doc__)
    parser.add_argument("--db", default="both", choices=["sqlite", "postgresql", "both"])
    parser.add_argument("--posts", type=int, default=5000)
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        print("PostgreSQL is unreachable: measuring SQLite only")
        backends.remove("postgresql")
    seeds = Seeds()
    print(
        "| database | API: single post | bare ingest path | batch item | mean group "
        "(API / bare) | store_each, groups of 1 / 8 / 50 |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for backend in backends:
        http = over_http(backend, args.posts, seeds)
        groups = in_process(backend, seeds)
        mean = " / ".join(
            "-" if http[f"{k}_group"] is None else f"{http[f'{k}_group']:.1f}"
            for k in ("api", "bare")
        )
        print(
            f"| {backend} | {http['api']:.3f} ms ({http['api_per_s']:.0f}/s) "
            f"| {http['bare']:.3f} ms ({http['bare_per_s']:.0f}/s) "
            f"| {http['batch_item']:.3f} ms ({http['batch_per_s']:.0f}/s) | {mean} "
            f"| {' / '.join(f'{groups[g]:.3f}' for g in GROUPS)} ms |"
        )


if __name__ == "__main__":
    main()
