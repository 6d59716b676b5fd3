"""Rollout routes: ingest (single and batch), fetch, list, look-up by correlation id."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.middleware.exceptions import ExceptionMiddleware
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
from tracestore.api.errors import JSONBody, error_body, status_of
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
from tracestore.drift.reads import has_trajectories
from tracestore.errors import EmptyBatch, UnsupportedMediaType
from tracestore.ingest.group import GroupCommit
from tracestore.ingest.service import MAX_BYTES_PER_TRANSACTION, cyclic_gc_paused, ingest_many
from tracestore.store.rollouts import IngestResult
from tracestore.store.runs import MAX_LIMIT, get_document, list_runs, runs_by_correlation

router = APIRouter(prefix="/v1", tags=["rollouts"])

_ROLLOUT_BODY = {"$ref": "#/components/schemas/RolloutIn"}


# Where an app keeps its worker's group committer (one per event loop).
_GROUP = "tracestore_group_commit"
# The transaction size the batch route uses (ingest/service.py).
_GROUP_MAX_BYTES = MAX_BYTES_PER_TRANSACTION


def group_commit(request: Request, state: AppState) -> GroupCommit:
    """The group committer of this worker's event loop (made at its first single post)."""
    group: GroupCommit | None = getattr(request.app.state, _GROUP, None)
    if group is None or group.loop is not asyncio.get_running_loop():
        settings = state.settings
        group = GroupCommit(
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
        )
        setattr(request.app.state, _GROUP, group)
    return group


def _result_status(result: IngestResult) -> int:
    if result.error is not None:
        return status_of(result.error)
    return 201 if result.status == "created" else 200


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
    group = group_commit(request, state)
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
    if result.error is not None:  # conflict
        return JSONBody(
            error_body(result.error.code, result.error.message, **result.error.details),
            status_code=status_of(result.error),
        )
    return JSONBody(result.to_json(), status_code=_result_status(result))


async def _post_rollout_lean(request: Request) -> Response:
    state: AppState = request.app.state.tracestore
    if request.scope.get("query_string"):
        refuse_undeclared_query(request, INGEST_PATH, frozenset())
    check_key(request, state.settings)
    return await ingest_one(request, state)


class IngestRoute(Route):
    """`POST /v1/rollouts`, served below FastAPI's dependency machinery (issue 19).

    Task apps post one rollout per request, hundreds at once; routing through the included
    routers, solving the route's dependencies and FastAPI's per-request exit stacks cost
    more CPU than storing a small rollout (bench/README.md, item 14). This route comes
    first in the app's routes and does what those dependencies do itself: it refuses any
    query parameter (the route declares none) and checks the API key. Errors take the
    app's exception handlers, as every route's do. `post_rollout` above stays the route's
    documentation (OpenAPI) and answers only if this route is not installed.
    """

    def __init__(self) -> None:
        super().__init__(INGEST_PATH, _post_rollout_lean, methods=["POST"], include_in_schema=False)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """As Route's, and name the route in the scope (the metrics label it by template)."""
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


class IngestShortcut:
    """ASGI middleware, the innermost: `POST /v1/rollouts` goes straight to IngestRoute.

    The request has passed every middleware of the app (errors, metrics, the in-flight
    bound); it skips only the search of the routing table and FastAPI's per-request exit
    stack (for uploaded files; this route reads its body itself), which cost ~10% of a
    small post's CPU. Errors take the app's exception handlers, through Starlette's own
    ExceptionMiddleware, as on the normal path. Anything else (another method or path, a
    root path) goes on down the app, where IngestRoute is also the first route.
    """

    def __init__(self, app: ASGIApp, *, owner: FastAPI, route: IngestRoute) -> None:
        self.app = app
        self.owner = owner
        self.route = route
        self._route_app: ASGIApp | None = None

    def _routed(self) -> ASGIApp:
        # Built at the first request, once every exception handler is in place; the same
        # handlers as FastAPI's own ExceptionMiddleware (500 and Exception are handled
        # outermost, by ServerErrorMiddleware).
        if self._route_app is None:
            handlers = {
                k: v for k, v in self.owner.exception_handlers.items() if k not in (500, Exception)
            }
            self._route_app = ExceptionMiddleware(self.route.handle, handlers=handlers)
        return self._route_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call."""
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == INGEST_PATH
            and not scope.get("root_path")
        ):
            # What the router would have put in the scope on a match.
            scope["router"] = self.owner.router
            scope["route"] = self.route
            scope["endpoint"] = self.route.endpoint
            scope["path_params"] = {}
            await self._routed()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def install_ingest_route(app: FastAPI) -> None:
    """Put `IngestRoute` ahead of every other route of `app`, and the shortcut to it
    innermost among its middleware (call before adding any other middleware)."""
    route = IngestRoute()
    app.router.routes.insert(0, route)
    app.add_middleware(IngestShortcut, owner=app, route=route)


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
def get_rollout(run_id: RunIdPath, request: Request, session: ReadSessionDep) -> Response:
    """Return a stored rollout."""
    body = get_document(session, run_id)
    # Only a run with trajectories makes this a legacy read (migration phase 3).
    request.scope.setdefault("state", {})[LEGACY_STATE] = has_trajectories(session, run_id)
    return Response(body, media_type="application/json")


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
    "/correlations/{cid:run_id}",
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
def get_correlation(cid: str, session: ReadSessionDep) -> dict[str, Any]:
    """Look runs up by correlation id."""
    matched, runs = runs_by_correlation(session, cid)
    return {"correlation_id": cid, "matched_correlation_id": matched, "runs": runs}
