"""create_app(settings): the FastAPI application."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from tracestore import __version__
from tracestore.api import limits
from tracestore.api.deps import AppState, require_api_key, require_metrics_key
from tracestore.api.errors import install_error_handlers
from tracestore.api.head import HeadAsGet
from tracestore.api.lane import IngestLane
from tracestore.api.observability import Observability, ObservabilityMiddleware
from tracestore.api.overload import Lanes
from tracestore.api.pages.install import install as install_pages
from tracestore.api.params import only_declared_query
from tracestore.api.routes import admin, convert, drift, inspect, reports, rollouts, service
from tracestore.db import migrate
from tracestore.reports import live
from tracestore.retention import schedule as retention_schedule
from tracestore.settings import Settings
from tracestore.wire.rollout import RolloutIn

DESCRIPTION = """\
tracestore keeps RL rollouts (legacy trajectories and v3 traces) losslessly, keyed by run id
and by trace correlation id. Every error body is `{"error": {"code", "message", ...}}`.
When `TRACESTORE_API_KEYS` is set, every `/v1` route, the HTML report and `/metrics` need
`X-API-Key` (or `Authorization: Bearer`; a browser asked for it sends it as the Basic-auth
password); `TRACESTORE_METRICS_PUBLIC=true` opens `/metrics` to scrapers.
"""


def _use_error_shape_for_validation(schema: dict[str, Any]) -> None:
    # FastAPI documents its parameter-validation 422 with its own body; ours is the error
    # shape (api/errors.py), so say that.
    ours = {"$ref": "#/components/schemas/ErrorBody"}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            response = operation.get("responses", {}).get("422")
            content = (response or {}).get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                content["schema"] = ours
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)


def create_app(
    settings: Settings | None = None,
    *,
    check_schema: bool = True,
    freeze_heap: bool = False,
    owns_process: bool = False,
    ingest_lane: bool = True,
) -> FastAPI:
    """Build the API over the store named by `settings` (read from the environment if None).

    `freeze_heap`: once started, move every object alive to the collector's permanent
    generation (`gc.freeze`), as `tracestore serve` does (api/server.py `served_app`).
    `owns_process`: the app is its process's only one (`tracestore serve`'s workers): at
    its end it stops the analytics children (reports/live.py), which other apps in the
    same process (tests) would otherwise share.
    `ingest_lane`: serve clean single posts in the ingest lane (api/lane.py); off, they
    take the app's whole path (the lane's tests compare the two).
    """
    settings = settings or Settings()
    # Counted from the first request on; the lifespan hands it to the AppState.
    observability = Observability()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The engines, and their connections handed out by lane (api/overload.py).
        lanes = Lanes(settings)
        engine = lanes.engine
        if check_schema:
            # Refuse to serve a stale schema, with the fix in the message.
            migrate.check_schema(engine)
        app.state.tracestore = AppState(
            settings=settings, engine=engine, observability=observability, lanes=lanes
        )
        # The retention sweep on a schedule, when TRACESTORE_RETENTION_INTERVAL is set.
        sweeper = retention_schedule.start(engine, settings)
        if freeze_heap:
            # A full collection walks every object alive: in a started worker (modules,
            # SQLAlchemy's and pydantic's structures) one took ~90 ms, on the event loop,
            # and collections were 17% of a worker's CPU under single posts (bench/README
            # item 18). What is alive now lives as long as the process: out of their way.
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            try:
                await retention_schedule.stop(sweeper)
                lanes.dispose()
            finally:
                if owns_process:
                    # uvicorn ends a worker by re-raising SIGTERM once it has shut down:
                    # no atexit runs, and nothing else stops the analytics children.
                    await anyio.to_thread.run_sync(live.shutdown)

    app = FastAPI(
        title="tracestore",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        # Every route refuses query parameters it does not declare (api/params.py).
        dependencies=[Depends(only_declared_query)],
        # Off unless TRACESTORE_OPENTELEMETRY: no per-request look for providers.
        telemetry=None
        if settings.opentelemetry
        else {"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
        docs_url=None,  # /docs and /redoc are served offline (api/pages/docs.py)
        redoc_url=None,
    )
    install_error_handlers(app)
    # POST /v1/rollouts, GET /v1/correlations/{cid} and /v1/rollouts/{run_id} ahead of
    # every route, below FastAPI's dependency machinery, and their shortcut the innermost
    # middleware: added first.
    ingest_route = rollouts.install_lean_routes(app)
    limits.install(app, settings)
    app.include_router(service.router)
    keyed = [Depends(require_api_key)]
    # The routes under a run (/trace, /trajectories, /drift) before the bare run route:
    # its `{run_id:path}` would match them too (api/params.py).
    app.include_router(convert.router, dependencies=keyed)
    app.include_router(drift.router, dependencies=keyed)
    # Reports take an analytics child and a read slot themselves, after their parameters
    # are checked, and only while the child works (api/deps.py analytics_slots).
    app.include_router(reports.router, dependencies=keyed)
    app.include_router(rollouts.router, dependencies=keyed)
    # DELETE on the run route; its own dependency asks for the admin role (api/deps.py).
    app.include_router(admin.router, dependencies=keyed)
    app.include_router(drift.pages, dependencies=keyed)
    app.include_router(inspect.router, dependencies=keyed)
    install_pages(app)  # the inspector's pages, sign-in, offline docs (api/pages/)
    app.include_router(drift.metrics_router, dependencies=[Depends(require_metrics_key)])
    app.add_middleware(ObservabilityMiddleware, state=observability)
    app.add_middleware(HeadAsGet)
    if ingest_lane:
        # Added last: the outermost. A clean single post skips every layer above.
        app.add_middleware(IngestLane, owner=app, route=ingest_route)

    def openapi() -> dict[str, Any]:
        # Rollout bodies are read raw (to store them as received), so FastAPI does not see
        # their model: add RolloutIn and its parts to the components by hand.
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            rollout = RolloutIn.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(rollout.pop("$defs", {}))
            components["RolloutIn"] = rollout
            _use_error_shape_for_validation(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
    return app
