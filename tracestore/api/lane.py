"""The ingest lane: a clean single post goes from the server straight to the group commit.

Task apps post one small rollout per request, hundreds at once (issue 19). Every request
passes the app's middleware (the error guard, HEAD, the metrics, the in-flight bound and
body timeouts, the watch for abandoned requests) and the lean route's checks: each a
coroutine, a wrapped `receive` or `send`, a look at the headers. For a 1.2 KB rollout
that was ~40 us of a worker's CPU a post, in-process, and over HTTP a single post cost
1.5-1.7x the server CPU of a batch item, where the bare path (the same group commit, no
middleware) cost 1.04-1.18x (bench/README.md item 25).

`IngestLane`, the outermost middleware of the app, serves `POST /v1/rollouts` itself when
the request is the common, clean case, doing what those layers would do for it in one
pass: the head says a JSON body of a declared length within the limits, no encoding, no
query, a valid key when keys are required; the whole body has arrived with the head (as a
small post does); its bytes fit the worker's in-flight bound. It then charges the bound,
holds the parse budget, submits to the worker's group commit and answers once the group
committed, timing and counting the request as the metrics middleware does. An error
raised on the way takes the app's handlers, as on the lean route. Any other request
(another route, a body still arriving, gzip, a missing or refused key, a bound full, ...)
goes down the app unchanged, with what the lane already received handed on first: so
every refusal is the app's own, in its words. tests/api/test_ingest_lane.py sends the same
requests with the lane and without and compares the answers and the metrics.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracestore.api.body import is_json, parsed_estimate, whole_body_cost
from tracestore.api.deps import AppState, check_key
from tracestore.api.errors import RouteHandlers
from tracestore.api.limits import HANDED_TICKET, InflightLimit, Ticket
from tracestore.api.observability import STARTED, observe_ingest
from tracestore.api.routes.rollouts import INGEST_PATH, group_commit, ingest_answer
from tracestore.errors import Unauthorized
from tracestore.ingest.group import GroupCommit
from tracestore.jsontext import dumps

_JSON_HEADERS = (b"content-type", b"application/json")


def _clean_head(scope: Scope, max_body: int) -> int | None:
    """The declared body length of a post the lane may serve, or None: a JSON body (or
    one without Content-Type) of a declared length, 1 to `max_body` bytes, not encoded
    nor chunked."""
    length: bytes | None = None
    media: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            if length is not None:
                return None  # repeated: the app's reading decides
            length = value
        elif name == b"content-type":
            if media is not None:
                return None  # repeated: the app reads the first
            media = value
        elif name in (b"content-encoding", b"transfer-encoding"):
            return None
    if length is None or not length.isdigit():
        return None
    size = int(length)
    if not 0 < size <= max_body:
        return None
    if media and not is_json(media.decode("latin-1").split(";", 1)[0].strip().lower()):
        return None
    return size


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """`receive`, after the messages already taken from it."""

    async def replayed() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return replayed


class IngestLane:
    """ASGI middleware, the outermost: serves a clean `POST /v1/rollouts` (see the module
    doc); everything else goes on down the app."""

    def __init__(self, app: ASGIApp, *, owner: FastAPI, route: Route) -> None:
        self.app = app
        self.owner = owner
        self.route = route  # the lean ingest route: the metrics and handlers read it
        self.handlers = RouteHandlers(owner)
        self.served = 0  # posts the lane answered itself (tests check it takes its share)
        self._inflight: InflightLimit | None = None

    def _bound(self) -> InflightLimit | None:
        # The app's in-flight bound, the middleware instance Starlette built below us:
        # the lane charges the same counter, so requests on both paths share one bound.
        # An app without one (not as create_app builds it) gets no lane.
        if self._inflight is None:
            node: Any = self.app
            while node is not None and not isinstance(node, InflightLimit):
                node = getattr(node, "app", None)
            self._inflight = node
        return self._inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call."""
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != INGEST_PATH
            or scope.get("query_string")
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()  # where the metrics middleware's clock starts
        state: AppState | None = getattr(self.owner.state, "tracestore", None)
        size = None if state is None else _clean_head(scope, state.settings.max_body_bytes)
        bound = self._bound()
        if (
            state is None
            or size is None
            or bound is None
            or (state.settings.api_keys and not _key_valid(scope, state))
        ):
            await self.app(scope, receive, send)
            return
        group = group_commit(self.owner, state)
        metrics = state.observability.metrics
        ticket = bound.admit(size)
        if ticket is None:  # the bound is full: the middleware refuses it
            await self.app(scope, receive, send)
            return
        try:
            # As ingest_one reads it: a group about to be written waits for this body.
            # Submitted at once when it came, so its end starts no write of its own (a
            # write started there left this post out: groups of 14 where 15.7 came).
            async with group.arriving(then_submits=True):
                arrived = await _whole_body(bound, ticket, receive, size)
        except BaseException:  # cancelled (shutdown): as the metrics middleware counts it
            bound.release(ticket)
            observe_ingest(metrics, 500, time.perf_counter() - start)
            raise
        if arrived is None or arrived[1] is None:
            group.kick()  # this post will not be submitted here
        if arrived is None:  # nothing came within the body timeout: 408, as the app's
            bound.release(ticket)
            await bound.refuse_stalled(send)
            observe_ingest(metrics, 408, time.perf_counter() - start)
            return
        taken, body = arrived
        if body is None:
            # Still arriving (a large or slow body), or the client left: down the app,
            # which has the streaming limits, keeping the request's charge (its place as
            # the oldest, its clock for the body's rate) and its clock for the metrics.
            scope[HANDED_TICKET] = ticket
            scope[STARTED] = start
            try:
                await self.app(scope, _replaying(taken, receive), send)
            finally:
                # InflightLimit adopts and releases it; a layer that answered without
                # calling down (or passed on a copy of the scope) would have leaked it.
                bound.release(ticket)
            return
        try:
            await self._ingest(scope, receive, send, state, group, body, start)
        finally:
            bound.release(ticket)

    async def _ingest(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: AppState,
        group: GroupCommit,
        body: bytes,
        start: float,
    ) -> None:
        status = 500  # an error no handler answers: ServerErrorMiddleware's 500
        submitted = False
        # As the router would have set them: the handlers and the metrics read the route.
        scope["router"] = self.owner.router
        scope["route"] = self.route
        scope["endpoint"] = self.route.endpoint
        scope["path_params"] = {}
        try:
            try:
                cost = whole_body_cost(body, state.settings.max_parsed_bytes)
                # As ingest_one: the memory its ingest may take, held with every other
                # ingest of this worker (a bounded wait, else 503), then stored with the
                # posts arriving with it and answered once their transaction committed.
                async with state.lanes.parsing.hold(cost, lambda: parsed_estimate(body)):
                    submitted = True  # submit adds it to the group before it waits
                    result = await group.submit(body)
            except Exception as exc:
                response = await self.handlers.answer(Request(scope, receive, send), exc)
                self.served += 1
                if response is None:
                    return
                status = response.status_code
                await response(scope, receive, send)
                return
            status, answer = ingest_answer(result)
            data = dumps(answer)  # as JSONBody renders it
            self.served += 1
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-length", b"%d" % len(data)), _JSON_HEADERS],
                }
            )
            await send({"type": "http.response.body", "body": data})
        finally:
            if not submitted:
                # Refused before its submit (413 on its parsed size, the parse budget
                # busy, cancelled): a group waiting for this post need not wait out its
                # timer (its arriving() ended quietly, counting on the submit).
                group.kick()
            observe_ingest(state.observability.metrics, status, time.perf_counter() - start)


async def _whole_body(
    bound: InflightLimit, ticket: Ticket, receive: Receive, size: int
) -> tuple[list[Message], bytes | None] | None:
    """The messages taken, and the body when all `size` bytes came in them (else None);
    None when nothing came within the body timeout.

    uvicorn hands on a body that arrived with its head in one message; a server that
    sends the body and then an empty last message (httpx's ASGI transport) takes one more
    receive, which the body's declared length says is due at once. Each wait is the
    bound's, which a sweep cuts after the body timeout: a head whose body never comes
    (uvicorn's receive waits for it without end) holds its charge no longer than on the
    app's path.
    """
    first = await bound.wait_piece(ticket, receive)
    if first is None:
        return None
    if first["type"] != "http.request" or len(first.get("body", b"")) != size:
        return [first], None
    if not first.get("more_body", False):
        return [first], first["body"]
    last = await bound.wait_piece(ticket, receive)
    if last is None:
        return None
    if last["type"] != "http.request" or last.get("body") or last.get("more_body", False):
        return [first, last], None
    return [first, last], first["body"]


def _key_valid(scope: Scope, state: AppState) -> bool:
    """True when the request's key is valid (noting whose, as check_key does)."""
    try:
        check_key(Request(scope), state.settings)
    except Unauthorized:
        return False
    return True
