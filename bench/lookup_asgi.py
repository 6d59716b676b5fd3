"""One route's latency through the whole app, in-process: no sockets, no client.

`python -m bench.lookup_asgi PATH [PATH ...]` (N=1000 requests each by default, env N)
drives `create_app` over the store `python -m bench.lookup --db postgresql --keep
tracestore_lookup_1m` built, calling the ASGI app as uvicorn would, one request at a time,
and prints each path's status and p50/p99. What it leaves out is the server's and the
client's socket work, so the framework's share of a request shows (bench/README.md item 17).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from starlette.types import Message, Receive, Scope, Send

from bench.common import percentiles
from bench.lookup_http import URL
from tracestore.api.app import create_app
from tracestore.settings import Settings


def _request(path: str) -> tuple[Scope, Receive, Send, list[Message]]:
    """An ASGI GET of `path` (scope, receive, send) and the list its answer goes to."""
    given = False
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)  # the client never goes away
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    return scope, receive, send, sent


async def _measure(paths: list[str], n: int) -> None:
    app = create_app(Settings(database_url=URL))
    started: list[Message] = []
    lifespan_in: asyncio.Queue[Message] = asyncio.Queue()
    await lifespan_in.put({"type": "lifespan.startup"})

    async def lifespan_send(message: Message) -> None:
        started.append(message)

    scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    lifespan = asyncio.create_task(app(scope, lifespan_in.get, lifespan_send))
    while not started:
        await asyncio.sleep(0.01)
    for path in paths:
        times: list[float] = []
        status = 0
        for _ in range(n):
            request, receive, send, sent = _request(path)
            begun = time.perf_counter()
            await app(request, receive, send)
            times.append(time.perf_counter() - begun)
            status = sent[0]["status"]
        print(path, status, percentiles(times))
    await lifespan_in.put({"type": "lifespan.shutdown"})
    await lifespan


if __name__ == "__main__":
    asyncio.run(_measure(sys.argv[1:], int(os.environ.get("N", "1000"))))
