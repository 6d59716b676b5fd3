"""The inspector's JSON: every panel of the run page (/v1/inspect/{run_id}), and the whole
drift report as JSON (/v1/drift/report, what `tracestore drift --url` renders)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tracestore.api.deps import ReadSessionDep, StateDep
from tracestore.api.held import held_inspection
from tracestore.api.params import RunFilterDep, RunIdPath
from tracestore.api.routes.drift import BudgetQuery, DaysQuery, KindQuery, drift_report
from tracestore.api.schemas import error_responses
from tracestore.drift.models import DriftReport
from tracestore.inspect.models import PANELS, Panel, RunInspection
from tracestore.inspect.run import (
    MAX_POSITION,
    MAX_STEPS_PER_PAGE,
    STEPS_PER_PAGE,
)
from tracestore.timewindow import DEFAULT_WINDOW_DAYS

router = APIRouter(prefix="/v1", tags=["inspector"])


@router.get(
    # A prefix of its own, not a suffix under /v1/rollouts/{run_id}: any run_id may end in
    # any text but the three suffixes ingest refuses (api/params.py).
    "/inspect/{run_id:run_id}",
    response_model=RunInspection,
    response_model_exclude_none=False,
    summary="A run as the inspector shows it: header, parts, drift, rewards, a page of steps.",
    description=(
        "The panels of the run page (`/runs/{run_id}`), as JSON. `panel` picks one "
        f"({', '.join(PANELS)}; the others are null). Steps: the trajectory step and the "
        "trace's environment event at each position (docs/FORMAT.md §6), side by side, with "
        "the time step's LM calls, messages and tool calls, and each drift finding marked on "
        "its step and field; one page of `limit` from `offset`, or the page holding `step`. "
        "A part converted on read comes with its loss report (`parts`)."
    ),
    responses=error_responses(401, 404, 422),
)
async def get_inspection(
    run_id: RunIdPath,
    state: StateDep,
    panel: Annotated[Panel, Query(description="The panel to answer with.")] = "all",
    offset: Annotated[int, Query(ge=0, le=MAX_POSITION, description="First step of the page.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_STEPS_PER_PAGE, description="Steps per page.")
    ] = STEPS_PER_PAGE,
    step: Annotated[
        int | None,
        Query(ge=0, le=MAX_POSITION, description="Answer with the page holding this step."),
    ] = None,
) -> RunInspection:
    """Inspect a run (holding what converting a part costs, when it converts one)."""
    return await held_inspection(state, run_id, panel=panel, offset=offset, limit=limit, step=step)


@router.get(
    "/drift/report",
    response_model=DriftReport,
    summary="The drift report as JSON: summary, worst runs, migration status.",
    description=(
        "What `/reports/drift` shows, for machines: the same window (default: the last "
        "`days` days), filters, kind and budget."
    ),
    responses=error_responses(401, 422),
)
def get_drift_report(
    state: StateDep,
    session: ReadSessionDep,
    runs: RunFilterDep,
    days: DaysQuery = DEFAULT_WINDOW_DAYS,
    kind: KindQuery = None,
    budget: BudgetQuery = None,
) -> DriftReport:
    """The drift report's data."""
    return drift_report(state, session, runs, days, kind, budget)
