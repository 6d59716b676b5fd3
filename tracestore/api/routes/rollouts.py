"""Rollout routes: ingest (single and batch), fetch, list, look-up by correlation id."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from pydantic import TypeAdapter
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tracestore.api.body import (
    NDJSON_TYPES,
    Charge,
    array_items,
    is_json,
    media_type,
    parsed_estimate,
    read_body,
    read_ndjson_items,
    require_json,
)
from tracestore.api.clients import LEGACY_STATE
from tracestore.api.deps import AppState, ReadSessionDep, StateDep, check_key
from tracestore.api.errors import JSONBody, RouteHandlers, error_body, status_of
from tracestore.api.overload import read_session
from tracestore.api.params import (
    RUN_PATH,
    RunFilterDep,
    RunIdPath,
    refuse_undeclared_query,
)
from tracestore.api.schemas import (
    Accepted,
    BatchResult,
    CorrelationRuns,
    RunList,
    error_responses,
)
from tracestore.errors import EmptyBatch, UnsupportedMediaType
from tracestore.ingest.group import GroupCommit
from tracestore.ingest.parse import RUN_SUBRESOURCES
from tracestore.ingest.service import MAX_BYTES_PER_TRANSACTION, cyclic_gc_paused, ingest_many
from tracestore.store.rollouts import IngestResult
from tracestore.store.runs import MAX_LIMIT, get_document_read, list_runs, runs_by_correlation

router = APIRouter(prefix="/v1", tags=["rollouts"])

_ROLLOUT_BODY = {"$ref": "#/components/schemas/RolloutIn"}


# Where an app keeps its worker's group committer (one per event loop).
_GROUP = "tracestore_group_commit"
# The transaction size the batch route uses (ingest/service.py).
_GROUP_MAX_BYTES = MAX_BYTES_PER_TRANSACTION


def new_group_commit(state: AppState) -> GroupCommit:
    """A group committer for the running event loop, configured from `state`'s settings."""
    settings = state.settings
    return GroupCommit(
        state.engine,
        state.lanes.writes.run,
        wait=settings.group_commit_wait_ms / 1000,
        max_items=settings.group_commit_max_rollouts,
        max_bytes=_GROUP_MAX_BYTES,
        # One group of a worker at a time, on both databases: SQLite has one writer (a
        # second group would queue for its lock), and on PostgreSQL two groups side by
        # side made smaller groups and cost more CPU per post than they overlapped
        # (bench/README.md item 13).
        concurrency=1,
        observe=state.observability.metrics.group_sizes.observe,
    )


def group_commit(app: FastAPI, state: AppState) -> GroupCommit:
    """The group committer of this worker's event loop (made at its first single post)."""
    group: GroupCommit | None = getattr(app.state, _GROUP, None)
    if group is None or group.loop is not asyncio.get_running_loop():
        group = new_group_commit(state)
        setattr(app.state, _GROUP, group)
    return group


def _result_status(result: IngestResult) -> int:
    if result.error is not None:
        return status_of(result.error)
    return 201 if result.status == "created" else 200


def ingest_answer(result: IngestResult) -> tuple[int, dict[str, Any]]:
    """The status and body answering a single post stored (or found) as `result`."""
    if result.error is not None:  # conflict
        error = result.error
        return status_of(error), error_body(error.code, error.message, **error.details)
    return _result_status(result), result.to_json()


INGEST_PATH = "/v1/rollouts"


@router.post(
    "/rollouts",
    status_code=201,
    response_model=Accepted,
    summary="Ingest one RolloutResponse.",
    description=(
        "Stores the rollout all or nothing, and answers once it is committed (single posts "
        "arriving together share a transaction, each in a savepoint of its own). 201 "
        "`created`; 200 "
        "`duplicate` when the run_id exists with the same content; 409 `conflict` when it "
        "exists with other content (compared exactly: numbers by their decimal value, never "
        "through floats). `Content-Encoding: gzip` is accepted. NaN/Infinity tokens are "
        "refused (400): standard JSON has none. A key repeated in an object, at any depth, "
        "is refused (422, naming it), and so is a run_id of dots only."
    ),
    responses={
        200: {"model": Accepted, "description": "Duplicate: already stored, nothing written."},
        **error_responses(400, 401, 409, 413, 415, 422),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ROLLOUT_BODY}},
        }
    },
)
async def post_rollout(request: Request, state: StateDep) -> JSONBody:
    """Ingest one rollout (documents the route; `IngestRoute` serves it)."""
    return await ingest_one(request, state)


async def ingest_one(request: Request, state: AppState) -> JSONBody:
    """Store the rollout posted in `request`: its answer."""
    require_json(request, " (NDJSON goes to /v1/rollouts/batch)")
    group = group_commit(request.app, state)
    charge = Charge()
    async with group.arriving():
        raw = await read_body(request, state.settings.max_body_bytes, charge)
    # Stored with the single posts arriving with it, in one transaction and commit, each in
    # a savepoint of its own (ingest/group.py), in a write slot (api/overload.py: a bounded
    # wait, else 503 database_busy); answered once that transaction committed. Holding
    # the memory its ingest may take, with every other ingest of this worker (a bounded
    # wait, else 503 overloaded).
    async with state.lanes.parsing.hold(charge.bytes, lambda: parsed_estimate(raw)):
        result = await group.submit(raw)
    status, body = ingest_answer(result)
    return JSONBody(body, status_code=status)


def _lean(
    answer: Callable[[Request, AppState], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of a lean route: what the FastAPI route's dependencies do (refuse query
    parameters, none being declared; check the API key), then `answer`."""

    async def endpoint(request: Request) -> Response:
        state: AppState = request.app.state.tracestore
        if request.scope.get("query_string"):
            # Named as FastAPI's query check names it: the path without its convertor.
            refuse_undeclared_query(request, request.scope["route"].path_format, frozenset())
        check_key(request, state.settings)
        return await answer(request, state)

    return endpoint


class LeanRoute(Route):
    """A route served below FastAPI's dependency machinery (issue 19), reached from the
    innermost middleware by `LeanShortcut`.

    Its endpoint does what the FastAPI route's dependencies do (the API key, the query
    check); errors take the app's exception handlers, as every route's do. The FastAPI
    route of the same path stays its documentation (OpenAPI) and answers only if the lean
    one is not installed; tests/api/test_lean_routes.py runs the two side by side.
    """

    def __init__(
        self, path: str, answer: Callable[[Request, AppState], Awaitable[Response]], method: str
    ):
        super().__init__(path, _lean(answer), methods=[method], include_in_schema=False)
        # Only `method`: Starlette adds HEAD to a GET route, FastAPI's GET routes refuse it.
        self.methods = {method}

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """As Route's, and name the route in the scope (the metrics label it by template)."""
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


class IngestRoute(LeanRoute):
    """`POST /v1/rollouts`: task apps post one rollout per request, hundreds at once;
    routing through the included routers, solving the route's dependencies and FastAPI's
    per-request exit stacks cost more CPU than storing a small rollout (bench/README.md,
    item 14). `post_rollout` documents it."""

    def __init__(self) -> None:
        super().__init__(INGEST_PATH, ingest_one, "POST")


CORRELATION_PATH = "/v1/correlations/{cid:run_id}"


class CorrelationRoute(LeanRoute):
    """`GET /v1/correlations/{cid}`: a trainer's look-up, where the framework's routing and
    dependency solving cost as much CPU as the look-up (bench/README.md, item 17).
    `get_correlation` documents it."""

    def __init__(self) -> None:
        super().__init__(
            CORRELATION_PATH,
            lambda request, state: correlation_answer(request.path_params["cid"], state),
            "GET",
        )


class RolloutRoute(LeanRoute):
    """`GET /v1/rollouts/{run_id}`: a trainer's fetch of one rollout. `get_rollout`
    documents it.

    A path under a run (`/trace`, `/trajectories`, `/drift`) is not this route's: ingest
    refuses run_ids ending so (ingest/parse.py), and the routes of those paths come first
    in the routing table, so the path is left to them."""

    def __init__(self) -> None:
        super().__init__(
            "/v1" + RUN_PATH,
            lambda request, state: rollout_answer(request, request.path_params["run_id"], state),
            "GET",
        )

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """As LeanRoute's, but no match for a path under a run."""
        match, child = super().matches(scope)
        if match is not Match.NONE:
            # removesuffix: a route's `$` also matches before one final newline.
            run_id: str = child["path_params"]["run_id"]
            if run_id.removesuffix("\n").endswith(RUN_SUBRESOURCES):
                return Match.NONE, {}
        return match, child


class LeanShortcut:
    """ASGI middleware, the innermost: a request for a lean route goes straight to it.

    The request has passed every middleware of the app (errors, metrics, the in-flight
    bound); it skips the search of the routing table, FastAPI's per-request exit stack
    (for uploaded files; these routes read their bodies themselves) and Starlette's
    per-route layers (ExceptionMiddleware, Route.handle, request_response: each a
    coroutine and a send wrapper per request; together with the exit stack ~10% of a
    small post's CPU, bench/README.md items 14 and 19). Errors take the app's exception
    handlers, looked up as Starlette's ExceptionMiddleware looks them up (by status code
    for an HTTPException, else by the exception's classes); 500 and Exception are handled
    outermost, by ServerErrorMiddleware, as on the normal path. Anything else (another
    method or path, a root path) goes on down the app, where the lean routes are also
    the first routes.
    """

    def __init__(self, app: ASGIApp, *, owner: FastAPI, routes: list[LeanRoute]) -> None:
        self.app = app
        self.owner = owner
        self.ingest = next(r for r in routes if isinstance(r, IngestRoute))
        self.others = [r for r in routes if r is not self.ingest]
        self.handlers = RouteHandlers(owner)

    async def _serve(self, route: LeanRoute, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            # A lean endpoint never sends: it returns its answer, so an error here comes
            # before any byte of the answer went.
            response: Response | None = await route.endpoint(request)
        except Exception as exc:
            response = await self.handlers.answer(request, exc)
        if response is not None:  # a handler may answer nothing (Starlette allows it)
            await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call."""
        if scope["type"] == "http" and not scope.get("root_path"):
            route: LeanRoute | None = None
            if scope["method"] == "POST" and scope["path"] == INGEST_PATH:
                route, params = self.ingest, {}
            else:
                for other in self.others:
                    match, child = other.matches(scope)
                    if match is Match.FULL:
                        route, params = other, child["path_params"]
                        break
            if route is not None:
                # What the router would have put in the scope on a match.
                scope["router"] = self.owner.router
                scope["route"] = route
                scope["endpoint"] = route.endpoint
                scope["path_params"] = params
                await self._serve(route, scope, receive, send)
                return
        await self.app(scope, receive, send)


def install_lean_routes(app: FastAPI) -> IngestRoute:
    """Put the lean routes ahead of every other route of `app`, and the shortcut to them
    innermost among its middleware (call before adding any other middleware); the ingest
    route, for the ingest lane (api/lane.py)."""
    ingest = IngestRoute()
    routes: list[LeanRoute] = [ingest, CorrelationRoute(), RolloutRoute()]
    app.router.routes[:0] = routes
    app.add_middleware(LeanShortcut, owner=app, routes=routes)
    return ingest


def _array_items(raw: bytes, max_items: int) -> list[bytes]:
    """The items of a JSON-array batch body, each exactly the bytes that were posted for it."""
    if not raw.strip():
        return []
    with cyclic_gc_paused():  # finding the items: see ingest.service.cyclic_gc_paused
        return array_items(raw, max_items)


def _ingest_batch(state: StateDep, items: list[bytes]) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    counts = {"created": 0, "duplicate": 0, "conflict": 0, "invalid": 0}
    for index, result in enumerate(ingest_many(state.engine, items)):
        counts[result.status] += 1
        results.append({"index": index, "http_status": _result_status(result), **result.to_json()})
    return {"results": results, "summary": {"total": len(items), **counts}}


@router.post(
    "/rollouts/batch",
    status_code=207,
    response_model=BatchResult,
    summary="Ingest many rollouts: a JSON array, or NDJSON.",
    description=(
        "Each rollout stands or falls alone (its own transaction). 207 with one result per "
        "item, in order, and a summary. Send NDJSON with `Content-Type: application/x-ndjson`. "
        "Each item is stored as the bytes it has in the body (a JSON array's element as "
        "written there, an NDJSON line). A batch without any rollout (an empty body, `[]`, "
        "NDJSON without a line) is 422 `empty_batch`."
    ),
    responses=error_responses(400, 401, 413, 415, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"type": "array", "items": _ROLLOUT_BODY}},
                "application/x-ndjson": {"schema": {"type": "string"}},
            },
        }
    },
)
async def post_batch(request: Request, state: StateDep) -> JSONBody:
    """Ingest a batch of rollouts."""
    mt = media_type(request)
    ndjson = mt in NDJSON_TYPES
    if not ndjson and not is_json(mt):
        raise UnsupportedMediaType(
            f"Content-Type {mt!r} is not supported: send application/json (an array) or "
            "application/x-ndjson"
        )
    limit, max_items = state.settings.max_body_bytes, state.settings.max_batch_items
    # The items are counted before they are held: NDJSON lines as the body streams in, an
    # array's elements as they are sliced out (api/body.py); past max_items, 413.
    charge = Charge()
    if ndjson:
        items = await read_ndjson_items(request, limit, max_items, charge)
    else:
        raw = await read_body(request, limit, charge)
        items = await run_in_threadpool(_array_items, raw, max_items)
    if not items:
        # Not a 207 with total 0: that reads as success to a client whose body was lost.
        raise EmptyBatch(
            "the batch holds no rollouts: send a JSON array of them, or NDJSON with one per "
            "line (Content-Type application/x-ndjson)"
        )
    async with state.lanes.parsing.hold(charge.bytes):
        body = await state.lanes.writes.run(_ingest_batch, state, items)
    return JSONBody(body, status_code=207)


@router.get(
    RUN_PATH,
    summary="The rollout exactly as received.",
    description=(
        "A JSON value equal to the posted document: unknown keys and original strings included."
    ),
    responses={
        200: {"content": {"application/json": {"schema": _ROLLOUT_BODY}}},
        **error_responses(401, 404),
    },
    response_class=Response,
)
async def get_rollout(run_id: RunIdPath, request: Request, state: StateDep) -> Response:
    """Return a stored rollout (documents the route; `RolloutRoute` serves it)."""
    return await rollout_answer(request, run_id, state)


async def rollout_answer(request: Request, run_id: str, state: AppState) -> Response:
    """The rollout `run_id` as received: the answer of GET /v1/rollouts/{run_id}."""
    lane = state.lanes.reads
    # One hop to a lane thread for the whole read (session, statement, its end).
    body, legacy = await lane.run(_document_read, lane.session_engine, run_id)
    # Only a run with trajectories makes this a legacy read (migration phase 3).
    request.scope.setdefault("state", {})[LEGACY_STATE] = legacy
    return Response(body, media_type="application/json")


def _document_read(engine: Engine, run_id: str) -> tuple[bytes, bool]:
    with read_session(engine) as session:
        return get_document_read(session, run_id)


@router.get(
    "/rollouts",
    response_model=RunList,
    summary="Run summaries, newest first, filtered, keyset-paged.",
    responses=error_responses(401, 422),
)
def get_rollouts(
    session: ReadSessionDep,
    f: RunFilterDep,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> dict[str, Any]:
    """List runs."""
    items, next_cursor = list_runs(session, f, limit=limit, cursor=cursor)
    return {"items": items, "next_cursor": next_cursor}


@router.get(
    # Any text: an id synth-ai logged may hold '/' (see correlation.lookup_forms).
    CORRELATION_PATH.removeprefix("/v1"),
    response_model=CorrelationRuns,
    summary="Every run whose canonical or per-trajectory correlation id is `cid`.",
    description=(
        "`cid` as stored, or as synth-ai's `extract_trace_correlation_id` reads it from a "
        "malformed inference URL (`trace_x/v1/chat/completions` finds the runs of "
        "`trace_x`); `matched_correlation_id` says which stored id matched. Send a `/` "
        "in the id as `%2F`."
    ),
    responses=error_responses(401, 404),
)
async def get_correlation(cid: str, state: StateDep) -> Response:
    """Look runs up by correlation id (documents the route; `CorrelationRoute` serves it)."""
    return await correlation_answer(cid, state)


async def correlation_answer(cid: str, state: AppState) -> Response:
    """The runs of correlation id `cid`: the answer of GET /v1/correlations/{cid}."""
    lane = state.lanes.reads
    # The look-up and its answer's JSON in one hop to a lane thread: a sync route would
    # hop twice (the endpoint, then FastAPI's validation of its answer), each costing
    # more CPU than the look-up's own Python (bench/README.md item 17).
    body = await lane.run(_correlation_answer, lane.session_engine, cid)
    return Response(body, media_type="application/json")


_CORRELATION_RUNS = TypeAdapter(CorrelationRuns)


def _correlation_answer(engine: Engine, cid: str) -> bytes:
    with read_session(engine) as session:
        matched, runs = runs_by_correlation(session, cid)
    answer = {"correlation_id": cid, "matched_correlation_id": matched, "runs": runs}
    # Validated as the response model would be: the answer keeps its documented shape.
    return _CORRELATION_RUNS.dump_json(_CORRELATION_RUNS.validate_python(answer))
