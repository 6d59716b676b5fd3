"""Rollout routes: ingest (single and batch), fetch, list, look-up by correlation id."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from tracestore.api.body import NDJSON_TYPES, is_json, media_type, read_body, require_json
from tracestore.api.deps import ReadSessionDep, StateDep
from tracestore.api.errors import JSONBody, error_body, status_of
from tracestore.api.params import RUN_PATH, RunIdPath, instant
from tracestore.api.schemas import (
    Accepted,
    BatchResult,
    CorrelationRuns,
    RunList,
    error_responses,
)
from tracestore.errors import InvalidJSON, InvalidRollout, PayloadTooLarge, UnsupportedMediaType
from tracestore.ingest.parse import parse_json
from tracestore.ingest.service import (
    IngestResult,
    cyclic_gc_paused,
    ingest_bytes,
    ingest_many,
)
from tracestore.jsontext import dumps
from tracestore.store.runs import MAX_LIMIT, RunFilter, get_document, list_runs, runs_by_correlation

router = APIRouter(prefix="/v1", tags=["rollouts"])

_ROLLOUT_BODY = {"$ref": "#/components/schemas/RolloutIn"}


def _result_status(result: IngestResult) -> int:
    if result.error is not None:
        return status_of(result.error)
    return 201 if result.status == "created" else 200


@router.post(
    "/rollouts",
    status_code=201,
    response_model=Accepted,
    summary="Ingest one RolloutResponse.",
    description=(
        "Stores the rollout in one transaction (all or nothing). 201 `created`; 200 "
        "`duplicate` when the run_id exists with the same content; 409 `conflict` when it "
        "exists with other content. `Content-Encoding: gzip` is accepted. NaN/Infinity "
        "tokens are refused (400): standard JSON has none."
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
    """Ingest one rollout."""
    require_json(request, " (NDJSON goes to /v1/rollouts/batch)")
    raw = await read_body(request, state.settings.max_body_bytes)
    result = await run_in_threadpool(ingest_bytes, state.engine, raw)
    if result.error is not None:  # conflict
        return JSONBody(
            error_body(result.error.code, result.error.message, **result.error.details),
            status_code=status_of(result.error),
        )
    return JSONBody(result.to_json(), status_code=_result_status(result))


def _split_batch(raw: bytes, ndjson: bool) -> list[tuple[bytes, Any]]:
    """Items of a batch body as (raw bytes, parsed value or an error)."""
    if not ndjson:
        value = parse_json(raw)
        if not isinstance(value, list):
            raise InvalidRollout(
                "a batch is a JSON array of RolloutResponses (or NDJSON with "
                "Content-Type application/x-ndjson)",
                errors=[{"path": "(document)", "message": "expected an array"}],
            )
        return [(dumps(item), item) for item in value]
    items: list[tuple[bytes, Any]] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            items.append((line, parse_json(line)))
        except InvalidJSON as exc:
            items.append((line, exc))
    return items


def _batch(state: StateDep, raw: bytes, ndjson: bool) -> dict[str, Any]:
    with cyclic_gc_paused():  # parsing the items: see ingest.service.cyclic_gc_paused
        items = _split_batch(raw, ndjson)
    limit = state.settings.max_batch_items
    if len(items) > limit:
        raise PayloadTooLarge(
            f"a batch holds at most {limit} rollouts, got {len(items)}", limit=limit
        )
    results: list[dict[str, Any]] = []
    counts = {"created": 0, "duplicate": 0, "conflict": 0, "invalid": 0}
    good = [(i, item) for i, item in enumerate(items) if not isinstance(item[1], InvalidJSON)]
    outcomes = dict(
        zip(
            (i for i, _ in good),
            ingest_many(state.engine, [item for _, item in good]),
            strict=True,
        )
    )
    for index, (_raw, value) in enumerate(items):
        if isinstance(value, InvalidJSON):
            result = IngestResult(run_id=None, status="invalid", error=value)
        else:
            result = outcomes[index]
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
        "item, in order, and a summary. Send NDJSON with `Content-Type: application/x-ndjson`."
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
    raw = await read_body(request, state.settings.max_body_bytes)
    body = await run_in_threadpool(_batch, state, raw, ndjson)
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
def get_rollout(run_id: RunIdPath, session: ReadSessionDep) -> Response:
    """Return a stored rollout."""
    return Response(get_document(session, run_id), media_type="application/json")


@router.get(
    "/rollouts",
    response_model=RunList,
    summary="Run summaries, newest first, filtered, keyset-paged.",
    responses=error_responses(401, 422),
)
def get_rollouts(
    session: ReadSessionDep,
    correlation_id: Annotated[
        str | None, Query(description="Canonical or per-trajectory cid.")
    ] = None,
    env_id: str | None = None,
    policy_id: str | None = None,
    since: Annotated[datetime | None, Query(description="received_at >= since (ISO 8601).")] = None,
    until: Annotated[datetime | None, Query(description="received_at < until (ISO 8601).")] = None,
    trace_kind: str | None = None,
    has_trajectories: bool | None = None,
    has_drift: Annotated[
        bool | None, Query(description="Only runs with (true) or without (false) drift findings.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> dict[str, Any]:
    """List runs."""
    f = RunFilter(
        correlation_id=correlation_id,
        env_id=env_id,
        policy_id=policy_id,
        since=instant(since),
        until=instant(until),
        trace_kind=trace_kind,
        has_trajectories=has_trajectories,
        has_drift=has_drift,
    )
    items, next_cursor = list_runs(session, f, limit=limit, cursor=cursor)
    return {"items": items, "next_cursor": next_cursor}


@router.get(
    "/correlations/{cid}",
    response_model=CorrelationRuns,
    summary="Every run whose canonical or per-trajectory correlation id is `cid`.",
    responses=error_responses(401, 404),
)
def get_correlation(cid: str, session: ReadSessionDep) -> dict[str, Any]:
    """Look runs up by correlation id."""
    return {"correlation_id": cid, "runs": runs_by_correlation(session, cid)}
