"""Observability: request latencies, ingest outcomes and legacy reads, kept per process.

The middleware times every request and counts what it sees; legacy-trajectory reads are
tallied in memory and flushed to the store in the background (every FLUSH_SECONDS, and
at shutdown), so no GET writes to the database. One `Observability` per app, on its
`AppState`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracestore.api.clients import LEGACY_STATE, ClientLabels, reader
from tracestore.api.head import HEAD
from tracestore.drift.reads import LEGACY_ROUTES, LegacyReadTracker
from tracestore.metrics import Metrics

log = logging.getLogger("tracestore.api")

# Legacy reads are counted in memory and written this often (and at shutdown).
FLUSH_SECONDS = 5.0
INGEST_ROUTE = "/v1/rollouts"
BATCH_ROUTE = "/v1/rollouts/batch"
# POST /v1/rollouts: the response status says the outcome.
_INGEST_STATUS = {201: "created", 200: "duplicate", 409: "conflict"}
_INVALID_STATUSES = frozenset((400, 413, 415, 422))
# In a request's scope: when the ingest lane (api/lane.py) began it, for a request it
# handed down the app.
STARTED = "tracestore.started"


@dataclass(slots=True)
class Observability:
    """What one app counts: Prometheus metrics, the legacy-read tally, client labels."""

    metrics: Metrics = field(default_factory=Metrics)
    reads: LegacyReadTracker = field(default_factory=LegacyReadTracker)
    labels: ClientLabels = field(default_factory=ClientLabels)


def _batch_counts(body: bytes) -> dict[str, int]:
    # The batch body ends with its summary (api/routes/rollouts.py writes it last): parse
    # the tail instead of the whole result list; fall back to the whole body otherwise.
    at = body.rfind(b'"summary":')
    try:
        tail = orjson.loads(body[at + len(b'"summary":') : -1]) if at >= 0 else None
        if not isinstance(tail, dict):
            tail = orjson.loads(body).get("summary", {})
    except (orjson.JSONDecodeError, AttributeError):
        return {}
    return {k: v for k, v in tail.items() if k != "total" and isinstance(v, int)}


class ObservabilityMiddleware:
    """Times every request, counts ingest outcomes and legacy reads; flushes reads in the
    background (every FLUSH_SECONDS, and at shutdown) so no GET writes to the database.
    """

    def __init__(self, app: ASGIApp, state: Observability) -> None:
        self.app = app
        self.state = state
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A request the ingest lane began and handed down: timed from its start there.
        start = scope.pop(STARTED, None) or time.perf_counter()
        status = 500
        body = bytearray()
        capture = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, capture
            if message["type"] == "http.response.start":
                status = message["status"]
                capture = (
                    scope["method"] == "POST" and _route(scope) == BATCH_ROUTE and status == 207
                )
            elif capture and message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self._observe(scope, status, time.perf_counter() - start, bytes(body))

    def _observe(self, scope: Scope, status: int, seconds: float, body: bytes) -> None:
        route, method = _route(scope), "HEAD" if scope.get(HEAD) else scope["method"]
        metrics = self.state.metrics
        if method == "POST" and route == INGEST_ROUTE:
            observe_ingest(metrics, status, seconds)
            return
        metrics.observe_request(method, route, str(status), seconds)
        if method == "GET" and status == 200 and route in LEGACY_ROUTES:
            # The whole-run route says whether the run had trajectories (LEGACY_STATE);
            # reading a trace-only run is no legacy read.
            if LEGACY_ROUTES[route] != "rollout" or scope.get("state", {}).get(LEGACY_STATE):
                client = reader(scope, self.state.labels)
                self.state.reads.record(client, LEGACY_ROUTES[route])
                metrics.legacy_reads.labels(client=client, route=LEGACY_ROUTES[route]).inc()
        elif body:
            for outcome, n in _batch_counts(body).items():
                metrics.count_ingest(outcome, n)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = scope.get("app")

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self._task = asyncio.create_task(self._flush_forever(app))
            await send(message)

        async def receive_wrapper() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                # Before the app's own shutdown disposes of the engine.
                if self._task is not None:
                    self._task.cancel()
                await self._flush(app)
            return message

        await self.app(scope, receive_wrapper, send_wrapper)

    async def _flush_forever(self, app: Any) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await self._flush(app)

    async def _flush(self, app: Any) -> None:
        state = getattr(getattr(app, "state", None), "tracestore", None)
        if state is None:
            return
        try:
            await run_in_threadpool(self.state.reads.flush, state.engine)
        except Exception:
            # The counts stay pending; the next flush tries again.
            log.warning("could not record legacy reads; will retry", exc_info=True)


def observe_ingest(metrics: Metrics, status: int, seconds: float) -> None:
    """Time one `POST /v1/rollouts` and count its outcome (its answer's status says it)."""
    metrics.observe_request("POST", INGEST_ROUTE, str(status), seconds)
    outcome = _INGEST_STATUS.get(status, "invalid" if status in _INVALID_STATUSES else "")
    if outcome:
        metrics.count_ingest(outcome)


def _route(scope: Scope) -> str:
    # The route template, not the path: bounded label values, and run ids stay out.
    # `path_format` drops converters ({run_id:run_id} -> {run_id}), as the OpenAPI paths do.
    return getattr(scope.get("route"), "path_format", None) or "unmatched"
