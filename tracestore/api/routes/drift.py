"""Drift routes (/v1/rollouts/{run_id}/drift, /v1/drift, /v1/migration/status), the drift
report (/reports/drift) and /metrics, plus the middleware that times requests, counts ingest
outcomes and legacy-trajectory reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracestore.api.clients import LEGACY_STATE, ClientLabels, reader
from tracestore.api.deps import ReadSessionDep, StateDep
from tracestore.api.params import (
    ENV_HELP,
    POLICY_HELP,
    RUN_PATH,
    RunIdPath,
    SinceQuery,
    UntilQuery,
    since_until,
)
from tracestore.api.schemas import error_responses
from tracestore.drift import DRIFT_KINDS
from tracestore.drift.report import render_html
from tracestore.drift.service import (
    DEFAULT_MIN_TRACE_SHARE,
    DEFAULT_WINDOW_DAYS,
    LEGACY_ROUTES,
    DriftFilter,
    LegacyReadTracker,
    findings_page,
    metric_figures,
    migration_status,
    report_data,
    run_drift,
    summary,
    window,
)
from tracestore.metrics import CONTENT_TYPE, Metrics
from tracestore.store.runs import MAX_LIMIT, RunFilter

log = logging.getLogger("tracestore.api")

# Routes under /v1 and the HTML page need an API key when keys are configured; /metrics
# too, unless TRACESTORE_METRICS_PUBLIC (api/app.py adds the dependencies).
router = APIRouter(prefix="/v1", tags=["drift"])
pages = APIRouter(tags=["reports"])
metrics_router = APIRouter(tags=["reports"])

# Legacy reads are counted in memory and written this often (and at shutdown).
FLUSH_SECONDS = 5.0


# --- wire models --------------------------------------------------------------------------


class FindingOut(BaseModel):
    """One drift finding (SPEC §6): where, which kind, and both values (shortened)."""

    kind: str = Field(examples=["reward_mismatch"])
    trajectory_index: int | None
    step_index: int | None
    position: int | None = Field(description="Index in all trajectories' steps, in order.")
    expected: str | None = Field(description="The trajectory (or envelope) side.")
    actual: str | None = Field(description="The trace side.")
    message: str
    comparator_version: int


class RunDriftOut(BaseModel):
    """A run's drift check: comparability, phase-1 reproduction, findings."""

    run_id: str
    stored: bool = Field(
        description="False when the run was stored before drift checks existed: the check "
        "was computed for this answer ('tracestore drift --recompute' stores it)."
    )
    checked_at: datetime | None
    comparator_version: int
    comparable: bool
    reason: str | None = Field(description="Why the run is not comparable.")
    trajectory_steps: int
    environment_events: int
    usable_trace: bool
    dual_serialized: bool
    reproduces: bool | None = Field(
        description="The trace alone, converted, gives back the trajectory steps "
        "(null when the run does not carry both formats)."
    )
    reproduce_gap: str | None
    reproduce_detail: str | None
    converter_version: str | None
    findings: list[FindingOut]


class KindCount(BaseModel):
    """Runs with a kind, and its findings."""

    runs: int
    findings: int


class RatedGroup(BaseModel):
    """Comparable runs, those with drift, and the rate, in one group (an env, a day)."""

    model_config = {"extra": "allow"}
    comparable_runs: int
    runs_with_drift: int
    drift_rate: float | None


class ListedFinding(FindingOut):
    """A finding with its run."""

    run_id: str
    received_at: datetime


class FindingPage(BaseModel):
    """One page of findings."""

    items: list[ListedFinding]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


class DriftSummaryOut(BaseModel):
    """GET /v1/drift."""

    filters: dict[str, Any]
    runs: int
    checked_runs: int
    unchecked_runs: int = Field(description="Runs stored before drift checks existed.")
    comparable_runs: int
    runs_with_drift: int = Field(description="Runs with a finding, comparable or not.")
    comparable_runs_with_drift: int
    drift_rate: float | None = Field(
        description="comparable_runs_with_drift / comparable_runs (null when none)."
    )
    not_comparable: dict[str, int] = Field(description="Runs that cannot be compared, by why.")
    by_kind: dict[str, KindCount]
    by_env: list[RatedGroup]
    by_day: list[RatedGroup]
    findings: FindingPage


class PhaseOut(BaseModel):
    """One migration phase (SPEC §7): its gate figures and verdict."""

    phase: int
    name: str
    verdict: Literal["ready", "not_ready", "insufficient_data"]
    reasons: list[str]
    figures: dict[str, Any]


class MigrationStatusOut(BaseModel):
    """GET /v1/migration/status."""

    window: dict[str, datetime]
    runs: int
    unchecked_runs: int
    safe_through_phase: int = Field(
        description="The highest phase whose gate and every earlier one say ready (0: none)."
    )
    phases: list[PhaseOut]
    notes: list[str]


# --- parameters ---------------------------------------------------------------------------

# since / until: the one time grammar of every route (api/params.py).
EnvQuery = Annotated[str | None, Query(description=ENV_HELP)]
PolicyQuery = Annotated[str | None, Query(description=POLICY_HELP)]
KindQuery = Annotated[
    str | None,
    Query(description=f"Count and list only this drift kind: {', '.join(DRIFT_KINDS)}."),
]
DaysQuery = Annotated[
    int,
    Query(ge=1, le=3660, description="Without `since`: the window is the last `days` days."),
]
BudgetQuery = Annotated[
    float | None,
    Query(
        ge=0,
        le=1,
        description="Phase 2 drift budget (default: TRACESTORE_DRIFT_BUDGET, 0.001).",
    ),
]
TraceShareQuery = Annotated[
    float,
    Query(ge=0, le=1, description="Phase 1 gate: least share of runs with a usable trace."),
]


# --- routes -------------------------------------------------------------------------------


@router.get(
    RUN_PATH + "/drift",
    response_model=RunDriftOut,
    summary="A run's drift findings (SPEC §6) and whether its trace reproduces it.",
    description=(
        "The stored check of the run, written when it was ingested: comparable or not (and "
        "why), every finding with trajectory, step, kind and both values, and whether the "
        "trace alone converts back to the trajectory steps (migration phase 1)."
    ),
    responses=error_responses(401, 404),
)
def get_run_drift(run_id: RunIdPath, session: ReadSessionDep) -> dict[str, Any]:
    """Return a run's drift."""
    return run_drift(session, run_id)


@router.get(
    "/drift",
    response_model=DriftSummaryOut,
    summary="Drift summary and findings over filtered runs.",
    description=(
        "Comparable runs, runs with drift and the drift rate (comparable runs with a finding "
        "/ comparable runs), counts by kind, by env and by UTC day, runs that cannot be "
        "compared by reason, and the findings, newest run first, keyset-paged. With `kind`, "
        "only that kind counts as drift. `correlation_conflict` applies to every run, so "
        "`runs_with_drift` may exceed `comparable_runs_with_drift`."
    ),
    responses=error_responses(401, 422),
)
def get_drift(
    session: ReadSessionDep,
    env_id: EnvQuery = None,
    policy_id: PolicyQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    kind: KindQuery = None,
    correlation_id: Annotated[
        str | None, Query(description="Canonical or per-trajectory cid.")
    ] = None,
    trace_kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Findings per page.")] = 100,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> dict[str, Any]:
    """Summarize drift."""
    start, end = since_until(since, until)
    f = DriftFilter(
        RunFilter(
            correlation_id=correlation_id,
            env_id=env_id,
            policy_id=policy_id,
            since=start,
            until=end,
            trace_kind=trace_kind,
        ),
        kind=kind,
    )
    items, next_cursor = findings_page(session, f, limit=limit, cursor=cursor)
    return {**summary(session, f), "findings": {"items": items, "next_cursor": next_cursor}}


@router.get(
    "/migration/status",
    response_model=MigrationStatusOut,
    summary="Per migration phase (SPEC §7): gate figures and whether it is safe.",
    description=(
        "Over runs received in the window (default: the last 30 days). Phase 1: share of "
        "runs with a usable trace (full or wrapped, with environment events) and share of "
        "dual-serialized runs whose trace alone reproduces the trajectory steps (gate: "
        "1 - budget). Phase 2: drift rate over comparable runs against the budget. Phase 3: "
        "reads of legacy trajectories (GET /v1/rollouts/{run_id}/trajectories, and "
        "/v1/rollouts/{run_id} of a run with trajectories) per client and day, and when each "
        "client was last seen; ready when no client read any in the window. A client is an "
        "API key's name or, without keys, the X-Tracestore-Client label; reads by callers "
        "with neither, and browser page loads, are listed as `anonymous` and not counted. "
        "Verdicts: ready, not_ready, insufficient_data."
    ),
    responses=error_responses(401, 422),
)
def get_migration_status(
    request: Request,
    state: StateDep,
    session: ReadSessionDep,
    since: SinceQuery = None,
    until: UntilQuery = None,
    days: DaysQuery = DEFAULT_WINDOW_DAYS,
    budget: BudgetQuery = None,
    min_trace_share: TraceShareQuery = DEFAULT_MIN_TRACE_SHARE,
) -> dict[str, Any]:
    """Report the migration gates."""
    _flush_reads(request, state.engine)
    start, end = window(*since_until(since, until), days)
    return migration_status(
        session,
        start,
        end,
        budget=budget if budget is not None else state.settings.drift_budget,
        min_trace_share=min_trace_share,
    )


@pages.get(
    "/reports/drift",
    response_class=HTMLResponse,
    summary="The drift report: one self-contained HTML page.",
    description=(
        "Headline figures, drift rate per day and per kind (inline SVG charts), the worst "
        "runs with their findings, and the migration verdicts, over the window (default: "
        "the last 30 days). The page loads nothing else."
    ),
    responses={200: {"content": {"text/html": {}}}, **error_responses(401, 422)},
)
def get_report(
    request: Request,
    state: StateDep,
    session: ReadSessionDep,
    env_id: EnvQuery = None,
    policy_id: PolicyQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    days: DaysQuery = DEFAULT_WINDOW_DAYS,
    kind: KindQuery = None,
    budget: BudgetQuery = None,
) -> HTMLResponse:
    """Render the drift report."""
    _flush_reads(request, state.engine)
    start, end = window(*since_until(since, until), days)
    f = DriftFilter(
        RunFilter(env_id=env_id, policy_id=policy_id, since=start, until=end), kind=kind
    )
    report = report_data(
        session, f, budget=budget if budget is not None else state.settings.drift_budget
    )
    return HTMLResponse(render_html(report))


@metrics_router.get(
    "/metrics",
    summary="Prometheus metrics (text format).",
    description=(
        "`tracestore_ingest_rollouts_total{status}`, "
        "`tracestore_http_request_duration_seconds{method,route,status}`, "
        "`tracestore_legacy_reads_total{client,route}` (this process; `client` is a key's "
        "name, a bounded X-Tracestore-Client label, `other`, `unknown-key` or `anonymous`), "
        "and `tracestore_drift_findings{kind}`, `tracestore_drift_runs{state}` (the whole "
        "store). Needs a key when keys are set, unless TRACESTORE_METRICS_PUBLIC=true."
    ),
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {}}}, **error_responses(401)},
)
def get_metrics(request: Request, session: ReadSessionDep) -> Response:
    """Expose the metrics."""
    metrics = _drift_state(request).metrics
    metrics.set_drift(*metric_figures(session))
    return Response(metrics.render(), media_type=CONTENT_TYPE)


# --- middleware: latencies, ingest outcomes, legacy reads ---------------------------------

INGEST_ROUTE = "/v1/rollouts"
BATCH_ROUTE = "/v1/rollouts/batch"
# POST /v1/rollouts: the response status says the outcome.
_INGEST_STATUS = {201: "created", 200: "duplicate", 409: "conflict"}
_INVALID_STATUSES = frozenset((400, 413, 415, 422))


@dataclass(slots=True)
class DriftAppState:
    """What the drift middleware and routes share in one app."""

    metrics: Metrics
    tracker: LegacyReadTracker
    labels: ClientLabels


def _drift_state(request: Request) -> DriftAppState:
    state: DriftAppState = request.app.state.drift
    return state


def _flush_reads(request: Request, engine: Any) -> None:
    # This process's pending reads count in the answer (others' within FLUSH_SECONDS).
    _drift_state(request).tracker.flush(engine)


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


class DriftMiddleware:
    """Times every request, counts ingest outcomes and legacy reads; flushes reads in the
    background (every FLUSH_SECONDS, and at shutdown) so no GET writes to the database.
    """

    def __init__(self, app: ASGIApp, state: DriftAppState) -> None:
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
        start = time.perf_counter()
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
        route, method = _route(scope), scope["method"]
        metrics = self.state.metrics
        metrics.requests.labels(method=method, route=route, status=str(status)).observe(seconds)
        if method == "GET" and status == 200 and route in LEGACY_ROUTES:
            # The whole-run route says whether the run had trajectories (LEGACY_STATE);
            # reading a trace-only run is no legacy read.
            if LEGACY_ROUTES[route] != "rollout" or scope.get("state", {}).get(LEGACY_STATE):
                client = reader(scope, self.state.labels)
                self.state.tracker.record(client, LEGACY_ROUTES[route])
                metrics.legacy_reads.labels(client=client, route=LEGACY_ROUTES[route]).inc()
        elif method == "POST" and route == INGEST_ROUTE:
            outcome = _INGEST_STATUS.get(status, "invalid" if status in _INVALID_STATUSES else "")
            if outcome:
                metrics.count_ingest(outcome)
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
            await run_in_threadpool(self.state.tracker.flush, state.engine)
        except Exception:
            # The counts stay pending; the next flush tries again.
            log.warning("could not record legacy reads; will retry", exc_info=True)


def _route(scope: Scope) -> str:
    # The route template, not the path: bounded label values, and run ids stay out.
    # `path_format` drops converters ({run_id:run_id} -> {run_id}), as the OpenAPI paths do.
    return getattr(scope.get("route"), "path_format", None) or "unmatched"


def install(app: FastAPI) -> None:
    """Add what the drift service needs beyond routes (middleware, startup work)."""
    state = DriftAppState(Metrics(), LegacyReadTracker(), ClientLabels())
    app.state.drift = state
    app.add_middleware(DriftMiddleware, state=state)
