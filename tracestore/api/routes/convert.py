"""Served reads across formats (/trace, /trajectories) and POST /v1/convert."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace as with_changes
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from tracestore.api.body import Charge, parsed_estimate, read_body, require_json
from tracestore.api.deps import AppState, StateDep
from tracestore.api.held import Part, conversion_cost, served_read
from tracestore.api.params import RUN_PATH, RunIdPath
from tracestore.api.schemas import error_responses
from tracestore.convert import convert_document
from tracestore.convert.numbers import report_rounded
from tracestore.errors import PayloadTooLarge
from tracestore.ingest.parse import parse_json, validate_rollout
from tracestore.jsontext import dumps, loads_whole, may_hold_inexact_numbers, member_text
from tracestore.store.served import Served, serve_trace, serve_trajectories

router = APIRouter(prefix="/v1", tags=["convert"])

SOURCE_HEADER = "X-Tracestore-Source"
_HEADERS_DOC = {
    SOURCE_HEADER: {
        "description": "`stored` (the producer sent this part) or `converted` (made from the "
        "other part of the rollout).",
        "schema": {"type": "string", "enum": ["stored", "converted"]},
    },
    "X-Tracestore-Converter": {
        "description": "On converted parts: converter name/version and the number of loss "
        "entries (POST /v1/convert gives the full loss report).",
        "schema": {"type": "string"},
    },
}


def _response(served: Served, body: bytes | None = None) -> Response:
    """`served` as an answer (its data serialized, unless `body` is its text already)."""
    headers: dict[str, str] = {SOURCE_HEADER: served.source}
    if served.conversion is not None:
        p = served.conversion.provenance
        headers["X-Tracestore-Converter"] = (
            f"{p.converter}/{p.converter_version}; losses={len(served.conversion.losses)}"
        )
    content = dumps(served.data) if body is None else body
    return Response(content, media_type="application/json", headers=headers)


@router.get(
    RUN_PATH + "/trace",
    summary="The run's v3 trace (full shape): stored, or converted from its trajectories.",
    description=(
        "A stored `full` trace is returned as sent; a `wrapped` one is unwrapped to its "
        "session trace. A run whose trace is null, empty or a summary, or a full or wrapped "
        "trace with nothing in it (`session_trace: null`; docs/FORMAT.md §5), gets a trace "
        "converted from its trajectories (deterministic; provenance in `metadata`). "
        "Converted parts keep every integer whole; the loss count of "
        "`X-Tracestore-Converter` includes numbers no double holds, written rounded."
    ),
    responses={
        200: {"content": {"application/json": {}}, "headers": _HEADERS_DOC},
        **error_responses(401, 404),
    },
    response_class=Response,
)
async def get_trace(run_id: RunIdPath, state: StateDep) -> Response:
    """Serve a run's trace."""
    return await _served(state, run_id, "trace")


@router.get(
    RUN_PATH + "/trajectories",
    summary="The run's legacy trajectories: stored, or converted from its trace.",
    description=(
        "For legacy readers after producers stop sending trajectories: a trace-only run is "
        "served trajectories converted from its full trace (what the trace cannot hold, such "
        "as `info`, is null; the loss report is at POST /v1/convert)."
    ),
    responses={
        200: {"content": {"application/json": {}}, "headers": _HEADERS_DOC},
        **error_responses(401, 404),
    },
    response_class=Response,
)
async def get_trajectories(run_id: RunIdPath, state: StateDep) -> Response:
    """Serve a run's trajectories."""
    return await _served(state, run_id, "trajectories")


def _steps(doc: Mapping[str, Any]) -> int:
    trajectories = doc.get("trajectories")
    if not isinstance(trajectories, list):
        return 0
    return sum(
        len(t["steps"])
        for t in trajectories
        if isinstance(t, dict) and isinstance(t.get("steps"), list)
    )


def _cost(raw: bytes, to: str) -> int:
    """What converting the document `raw` costs (bytes, all told); 4xx for bad input."""
    doc = validate_rollout(parse_json(raw))
    return conversion_cost(parsed_estimate(raw), _steps(doc), to)


def _answer(raw: bytes, to: str, replace: bool) -> bytes:
    doc = validate_rollout(parse_json(raw))
    again = may_hold_inexact_numbers(raw)
    if again:
        # orjson read an integer past 64 bits as a float, 1e-400 as 0.0: read it again
        # with integers whole (convert/numbers.py), not holding both readings at once.
        del doc
        doc = loads_whole(raw)
    # Not stored, so the request's time is when this trace came to be.
    now = datetime.now(UTC).isoformat()
    new_doc, conversion = convert_document(doc, to, replace=replace, created_at=now)
    if again:
        # The answer is the whole document: a number rounded anywhere in it is a loss.
        conversion = report_rounded(conversion, new_doc)
    # Serialized here, in the thread and inside the budget: the answer holds it all.
    return dumps({"document": new_doc, **conversion.report()})


def _serve(raw: bytes, received_at: datetime, part: Part) -> Response:
    # orjson reads 1e-400 as 0.0 and a 30-digit integer as a float: a document that may
    # hold such numbers is read with integers whole (convert/numbers.py).
    again = may_hold_inexact_numbers(raw)
    doc = loads_whole(raw) if again else orjson.loads(raw)
    served = serve_trace(doc, received_at) if part == "trace" else serve_trajectories(doc)
    if again and served.source == "stored":
        # A stored part is served from the document's own text, every number as sent.
        wrapped = part == "trace" and served.trace_kind == "wrapped"
        path = ("trace", "session_trace") if wrapped else (part,)
        text = member_text(raw, path)
        if text is not None:
            return _response(served, text)
    if again and served.conversion is not None:
        rounded = report_rounded(served.conversion, served.data, part)
        served = with_changes(served, conversion=rounded)
    return _response(served)


async def _served(state: AppState, run_id: str, part: Part) -> Response:
    """A run's `part`, stored or converted, parsed and converted inside the worker's parse
    budget (api/held.py)."""
    return await served_read(state, run_id, part, _serve)


@router.post(
    "/convert",
    summary="Convert a posted RolloutResponse without storing it.",
    description=(
        "`to=trace` fills a missing `trace` from the trajectories; `to=trajectories` fills "
        "missing `trajectories` from the trace. A part the document has is kept (`action`: "
        "`kept`, with a warning) unless `replace=true`; a conversion that gives nothing never "
        "replaces a real part. Returns the document, `action` (`filled`, `kept`, "
        "`replaced`), `warnings`, the loss report, `lossless` (nothing of the source lost) "
        "and the provenance (converter, version, source sha256). 413 also when converting "
        "the document would take more memory than a worker allows "
        "(TRACESTORE_MAX_PARSED_BYTES; `tracestore convert` does it offline)."
    ),
    responses=error_responses(400, 401, 413, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RolloutIn"}}},
        }
    },
)
async def post_convert(
    request: Request,
    state: StateDep,
    to: Annotated[Literal["trace", "trajectories"], Query(description="Target format.")],
    replace: Annotated[
        bool, Query(description="Overwrite the part the document already has.")
    ] = False,
) -> Response:
    """Convert one document."""
    require_json(request)
    charge = Charge()
    raw = await read_body(request, state.settings.max_body_bytes, charge)
    # In the worker's parse budget with its ingests (api/overload.py), in two passes of
    # one hold each: the first parses (an ingest's charge) to learn what converting costs,
    # which can be several times that; the second converts, holding it. A request never
    # waits for more while it holds: two conversions each holding their parse and waiting
    # for the rest would keep each other out until their wait ran out.
    budget = state.lanes.parsing
    async with budget.hold(charge.bytes, lambda: parsed_estimate(raw)):
        cost = await run_in_threadpool(_cost, raw, to)
    if cost > budget.limit:
        raise PayloadTooLarge(
            f"converting this document would take about {cost} bytes of memory, more than "
            f"the {budget.limit} a worker allows (TRACESTORE_MAX_PARSED_BYTES); convert it "
            "offline with `tracestore convert`",
            limit=budget.limit,
        )
    async with budget.hold(cost):
        answer = await run_in_threadpool(_answer, raw, to, replace)
    return Response(answer, media_type="application/json")
