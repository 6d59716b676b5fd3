"""Service routes: /health and /info (no API key needed)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from tracestore import __version__
from tracestore.api.deps import StateDep
from tracestore.api.errors import JSONBody
from tracestore.api.overload import DatabaseBusy
from tracestore.api.schemas import Health, Info, error_responses
from tracestore.db import migrate
from tracestore.store.runs import MAX_LIMIT

router = APIRouter(tags=["service"])


@router.get(
    "/health",
    response_model=Health,
    responses=error_responses(503),
    summary="Is the database reachable and its schema current?",
)
async def health(state: StateDep) -> JSONBody:
    """200 when the database answers and its schema is at the expected revision; else 503."""
    expected = migrate.head_revision()
    health = state.lanes.health  # its own connection and thread: never behind the pool
    try:
        current = await health.run(migrate.current_revision, health.engine)
    except SQLAlchemyError as exc:
        return JSONBody(
            {
                "healthy": False,
                "database": "unreachable",
                "schema_revision": None,
                "expected_revision": expected,
                "error": {"code": "database_unreachable", "message": str(exc.__cause__ or exc)},
            },
            status_code=503,
        )
    healthy = current == expected
    body = {
        "healthy": healthy,
        "database": "ok",
        "schema_revision": current,
        "expected_revision": expected,
    }
    if not healthy:
        body["error"] = {
            "code": "schema_out_of_date",
            "message": f"database is at {current}, code expects {expected}: "
            "run 'tracestore db upgrade'",
        }
    return JSONBody(body, status_code=200 if healthy else 503)


@router.get("/info", response_model=Info, summary="Version, backend, schema and limits.")
async def info(state: StateDep) -> Info:
    """Describe this service."""
    health = state.lanes.health
    try:
        current = await health.run(migrate.current_revision, health.engine)
    except (SQLAlchemyError, DatabaseBusy):
        current = None  # the rest of the answer needs no database
    s = state.settings
    return Info(
        service="tracestore",
        version=__version__,
        backend=state.engine.dialect.name,
        schema_revision=current,
        expected_revision=migrate.head_revision(),
        auth_required=bool(s.api_keys),
        limits={
            "max_body_bytes": s.max_body_bytes,
            "max_parsed_bytes": s.max_parsed_bytes,
            "max_batch_items": s.max_batch_items,
            "max_inflight_bytes": s.max_inflight_bytes,
            "max_header_bytes": s.max_header_bytes,
            "max_list_limit": MAX_LIMIT,
        },
    )
