"""The app's own CPU around one single post, in-process and without noise (issue 19,
bench/README.md item 24).

Over HTTP a single post's server CPU swings by 10-20% from one run to the next on these
shared cores, more than the part of it that is the app's own work (middleware, the lean
route, the body's reading, the answer). Here the served app (`served_app`, every
middleware as `tracestore serve` stacks them) is called directly as ASGI, one post after
another on one event loop, with the group commit's `submit` answering at once with a
stored result: what is left is the app's work around the store, measured as process CPU
per post. Beside it the *bare ingest path* of bench/single_post_parts.py (read the body,
submit, answer; the same function): the app's overhead is the difference. No server, no
socket, no database write: these are not throughput figures.

    .venv/bin/python -m bench.app_overhead [--posts 30000] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Scope

from bench.corpus import corpus
from bench.single_post_parts import bare_ingest_path
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.group import GroupCommit
from tracestore.ingest.service import ingest_many
from tracestore.store.rollouts import IngestResult

SCOPE: Scope = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/rollouts",
    "raw_path": b"/v1/rollouts",
    "root_path": "",
    "query_string": b"",
    "client": ("127.0.0.1", 40000),
    "server": ("127.0.0.1", 8000),
}


async def _started(app: FastAPI) -> None:
    """Run the app's lifespan start-up (its state, lanes and engines)."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    asyncio.get_running_loop().create_task(app(scope, inbox.get, send))
    await asyncio.wait_for(started.wait(), timeout=60)


def _poster(app: ASGIApp, sent: list[Message]) -> Callable[[bytes], Awaitable[None]]:
    async def post(raw: bytes) -> None:
        messages: list[Message] = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive() -> Message:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        headers = [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(raw)),
        ]
        await app({**SCOPE, "headers": headers, "state": {}}, receive, send)
        # One turn of the loop between posts, as a server's loop turns: timers cancelled
        # by a post are dropped from its heap there (else the heap grows all run long).
        await asyncio.sleep(0)

    return post


def measure(posts: int, rounds: int, profile: bool) -> dict[str, list[float]]:
    """CPU microseconds per post of each path, `rounds` times each in turns."""
    from tracestore.api.server import served_app

    docs = corpus("single", 64)
    stored: list[IngestResult] = []

    async def answered_at_once(self: GroupCommit, raw: bytes) -> IngestResult:
        return stored[0]

    # The store is out of the measure: every post is answered with one stored result.
    GroupCommit.submit = answered_at_once  # type: ignore[method-assign]

    async def run() -> dict[str, list[float]]:
        real = served_app()
        await _started(real)
        stored.append(ingest_many(real.state.tracestore.engine, [docs[0]])[0])
        out: dict[str, list[float]] = {"api": [], "bare": []}
        sent: list[Message] = []
        paths = {"api": _poster(real, sent), "bare": _poster(bare_ingest_path(real), sent)}
        for post in paths.values():  # warm-up
            for raw in docs * 8:
                await post(raw)
        assert all(m.get("status", 200) < 300 for m in sent), sent[:2]
        for _ in range(rounds):
            for name, post in paths.items():
                sent.clear()
                profiler = cProfile.Profile() if profile and name == "api" else None
                if profiler is not None:
                    profiler.enable()
                started = time.process_time()
                for i in range(posts):
                    await post(docs[i % len(docs)])
                took = time.process_time() - started
                if profiler is not None:
                    profiler.disable()
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
                assert sent[0]["status"] in (200, 201), sent[0]
                out[name].append(took / posts * 1e6)
        return out

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    """Print each path's CPU per post and the app's overhead (their difference)."""
    parser = argparse.ArgumentParser(prog="python -m bench.app_overhead", description=__doc__)
    parser.add_argument("--posts", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the API's rounds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'store.db'}"
        engine = create_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
        os.environ["TRACESTORE_DATABASE_URL"] = url
        figures = measure(args.posts, args.rounds, args.profile)
    api, bare = min(figures["api"]), min(figures["bare"])
    rows: list[Any] = [
        ("API (served_app)", figures["api"]),
        ("bare ingest path", figures["bare"]),
    ]
    print("| path | CPU us a post, each round | best |\n|---|---|---:|")
    for name, values in rows:
        print(f"| {name} | {' / '.join(f'{v:.1f}' for v in values)} | {min(values):.1f} |")
    print(f"\nthe app's overhead: {api - bare:.1f} us a post (best rounds)")


if __name__ == "__main__":
    main()
