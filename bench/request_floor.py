"""The floor of one HTTP request (issue 19): what `tracestore serve` costs per request
with no application work at all.

A bare ASGI app (it reads the body to its end and answers 201 with a small JSON, as a
stored post is answered; nothing else: no framework, no middleware, no parse, no store)
is served exactly as `tracestore serve --workers 2` serves the API (`run_server`: the
same uvicorn protocol, event loop and one listening socket per worker), and the 1.2 KB
corpus is posted to it by bench/concurrency.py's clients. Its server CPU per request is
the part of a single post's cost that no change to tracestore's own code can remove:
issue 19's target, a single post's CPU within 1.3x a batch item's, needs the whole post
(this floor included) to fit in 1.3x what a batch item costs.

    .venv/bin/python -m bench.request_floor [--clients 1 32 128] [--requests 5000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from bench.common import free_port
from bench.concurrency import WORKERS, measure, serving
from bench.corpus import corpus

ROOT = Path(__file__).resolve().parent.parent
# About what tracestore answers a created post (`Accepted`).
ANSWER = (
    b'{"run_id":"run-000000000","status":"created","correlation_id":"trace_0000000000000000",'
    b'"correlation_source":"pipeline_metadata","n_trajectories":1,"n_steps":1}'
)


def bare_app() -> ASGIApp:
    """An ASGI app that reads each request's body and answers 201 (200 for /health)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        status = 200 if scope["path"] == "/health" else 201
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})

    return app


def main(argv: list[str] | None = None) -> None:
    """Measure the floor for each client count and print a Markdown table."""
    parser = argparse.ArgumentParser(prog="python -m bench.request_floor", description=__doc__)
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 32, 128])
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args(argv)
    port = free_port()
    command = [
        sys.executable,
        "-c",
        "from tracestore.api.server import run_server; "
        f"run_server(host='127.0.0.1', port={port}, workers={WORKERS}, log_level='warning', "
        "access_log=False, app='bench.request_floor:bare_app')",
    ]
    bodies = corpus("single", args.requests)
    print("| clients | requests/s | p50 / p99 ms | server CPU ms per request |")
    print("|---:|---:|---:|---:|")
    with serving(command, port, {"PYTHONPATH": str(ROOT)}, WORKERS) as (base, pid):
        measure(base, pid, bodies[:200], 8, batch=False)  # warm-up
        for clients in args.clients:
            f = measure(base, pid, bodies, clients, batch=False)
            assert f["failures"] == 0, f["first_failure"]
            print(
                f"| {clients} | {f['rollouts_per_s']} | {f['p50_ms']} / {f['p99_ms']} | "
                f"{f['server_cpu_ms_per_rollout']} |"
            )


if __name__ == "__main__":
    main()
