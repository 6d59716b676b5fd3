"""Drift routes (/v1/rollouts/{run_id}/drift, /v1/drift, /v1/migration/status), the drift
report (/reports/drift) and /metrics. What the answers hold is drift/models.py; what the
middleware counts is api/observability.py.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from tracestore.api.deps import AppState, MetricsSessionDep, ReadSessionDep, StateDep
from tracestore.api.pages.links import run_href
from tracestore.api.params import (
    ENV_HELP,
    POLICY_HELP,
    RUN_PATH,
    RunFilterDep,
    RunIdPath,
    SinceQuery,
    UntilQuery,
    since_until,
)
from tracestore.api.schemas import error_responses
from tracestore.drift import DRIFT_KINDS
from tracestore.drift.gates import DEFAULT_MIN_TRACE_SHARE, migration_status, report_data
from tracestore.drift.models import DriftReport, DriftSummaryPage, MigrationStatus, RunDrift
from tracestore.drift.queries import (
    DriftFilter,
    findings_page,
    metric_figures,
    run_drift,
    summary,
    window,
)
from tracestore.drift.report import render_html
from tracestore.metrics import CONTENT_TYPE
from tracestore.store.runs import MAX_LIMIT, RunFilter
from tracestore.timewindow import DEFAULT_WINDOW_DAYS, MAX_WINDOW_DAYS

log = logging.getLogger("tracestore.api")

# Routes under /v1 and the HTML page need an API key when keys are configured; /metrics
# too, unless TRACESTORE_METRICS_PUBLIC (api/app.py adds the dependencies).
router = APIRouter(prefix="/v1", tags=["drift"])
pages = APIRouter(tags=["reports"])
metrics_router = APIRouter(tags=["reports"])


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
    Query(
        ge=1,
        le=MAX_WINDOW_DAYS,
        description="Without `since`: the window is the last `days` days.",
    ),
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
    response_model=RunDrift,
    summary="A run's drift findings (SPEC §6) and whether its trace reproduces it.",
    description=(
        "The stored check of the run, written when it was ingested: comparable or not (and "
        "why), every finding with trajectory, step, kind and both values, and whether the "
        "trace alone converts back to the trajectory steps (migration phase 1)."
    ),
    responses=error_responses(401, 404),
)
def get_run_drift(run_id: RunIdPath, session: ReadSessionDep) -> RunDrift:
    """Return a run's drift."""
    return run_drift(session, run_id)


@router.get(
    "/drift",
    response_model=DriftSummaryPage,
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
    runs: RunFilterDep,
    kind: KindQuery = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Findings per page.")] = 100,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
) -> DriftSummaryPage:
    """Summarize drift."""
    f = DriftFilter(runs, kind=kind)
    page = findings_page(session, f, limit=limit, cursor=cursor)
    return DriftSummaryPage(**dict(summary(session, f)), findings=page)


@router.get(
    "/migration/status",
    response_model=MigrationStatus,
    summary="Per migration phase (SPEC §7): gate figures and whether it is safe.",
    description=(
        "Over runs received in the window (default: the last 30 days). Phase 1: share of "
        "runs with a usable trace (full or wrapped, with environment events) and share of "
        "dual-serialized runs whose trace alone reproduces the trajectory steps (gate: "
        "1 - budget). Phase 2: drift rate over comparable runs against the budget. Phase 3: "
        "reads of legacy trajectories (GET /v1/rollouts/{run_id}/trajectories, and "
        "/v1/rollouts/{run_id} of a run with trajectories) per client and day, and when each "
        "client was last seen; ready when no client read any in the window (no data until a "
        "legacy read was ever recorded). A client is an "
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
) -> MigrationStatus:
    """Report the migration gates."""
    # This process's pending reads count in the answer (others' within FLUSH_SECONDS).
    state.observability.reads.flush(state.engine)
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
    state: StateDep,
    session: ReadSessionDep,
    runs: RunFilterDep,
    days: DaysQuery = DEFAULT_WINDOW_DAYS,
    kind: KindQuery = None,
    budget: BudgetQuery = None,
) -> HTMLResponse:
    """Render the drift report."""
    report = drift_report(state, session, runs, days, kind, budget)
    # Run ids and finding steps link to the inspector's run pages (api/pages/).
    return HTMLResponse(render_html(report, run_href=run_href, home_href="/"))


def drift_report(
    state: AppState,
    session: Session,
    runs: RunFilter,
    days: int,
    kind: str | None,
    budget: float | None,
) -> DriftReport:
    """The drift report's data over the window (`/reports/drift` and its JSON)."""
    # This process's pending reads count in the answer (others' within FLUSH_SECONDS).
    state.observability.reads.flush(state.engine)
    start, end = window(runs.since, runs.until, days)
    f = DriftFilter(replace(runs, since=start, until=end), kind=kind)
    return report_data(
        session, f, budget=budget if budget is not None else state.settings.drift_budget
    )


@metrics_router.get(
    "/metrics",
    summary="Prometheus metrics (text format).",
    description=(
        "`tracestore_ingest_rollouts_total{status}`, "
        "`tracestore_http_request_duration_seconds{method,route,status}`, "
        "`tracestore_legacy_reads_total{client,route}` (this process; `client` is a key's "
        "name, a bounded X-Tracestore-Client label, `other`, `unknown-key` or `anonymous`), "
        "and `tracestore_drift_findings{kind}`, `tracestore_drift_runs{state}` (the whole "
        "store; `tracestore_drift_figures_read` is 0 when the store could not be read at this "
        "scrape, the gauges then holding their last reading). Needs a key when keys are set, "
        "unless TRACESTORE_METRICS_PUBLIC=true."
    ),
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {}}}, **error_responses(401)},
)
def get_metrics(state: StateDep, session: MetricsSessionDep) -> Response:
    """Expose the metrics."""
    metrics = state.observability.metrics
    try:
        metrics.set_drift(*metric_figures(session))
    except DBAPIError as exc:
        # The store cannot be read (down, or its schema gone): this process's counters are
        # still served, when they matter most; the drift gauges keep their last reading,
        # flagged (a 503 lost the whole scrape).
        log.warning("/metrics: the drift figures could not be read: %s", exc.args)
        metrics.drift_read.set(0)
    else:
        metrics.drift_read.set(1)
    return Response(metrics.render(), media_type=CONTENT_TYPE)
