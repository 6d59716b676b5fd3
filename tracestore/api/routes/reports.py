"""Named DuckDB reports over HTTP (/v1/reports)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field
from starlette.responses import Response

from tracestore.api.deps import StateDep, analytics_slots
from tracestore.api.errors import JSONBody
from tracestore.api.params import ENV_HELP, SinceQuery, UntilQuery
from tracestore.api.schemas import error_responses
from tracestore.errors import InvalidRequest

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from tracestore.reports.catalog import Report
    from tracestore.reports.filters import Filters
    from tracestore.reports.runner import Result

router = APIRouter(prefix="/v1", tags=["reports"])


class ReportInfo(BaseModel):
    """A named report."""

    name: str = Field(examples=["returns"])
    description: str
    parameters: list[str] = Field(
        description="The filters it takes: since, until, env (the query parameter env_id)."
    )


class ReportList(BaseModel):
    """Every named report."""

    reports: list[ReportInfo]


class ReportColumn(BaseModel):
    """A result column and its DuckDB type."""

    name: str
    type: str = Field(examples=["BIGINT", "DOUBLE", "DATE", "VARCHAR"])


class ReportOutput(BaseModel):
    """A report's rows, with its columns and the parameters it ran with."""

    report: str
    description: str
    parameters: dict[str, str | None]
    source: str = Field(description="`sqlite` or `postgresql`: the store it read.")
    columns: list[ReportColumn]
    rows: list[dict[str, Any]]
    notices: list[str] = Field(
        description="Anything worth knowing: a fallback read, absent data (e.g. no drift tables)."
    )


@router.get(
    "/reports",
    response_model=ReportList,
    summary="List the named reports.",
    responses=error_responses(401),
)
def list_reports_route() -> JSONBody:
    """The reports `GET /v1/reports/{name}` runs, with one-line descriptions."""
    from tracestore.reports.catalog import list_reports

    return JSONBody(
        {
            "reports": [
                {"name": r.name, "description": r.description, "parameters": list(r.parameters)}
                for r in list_reports()
            ]
        }
    )


@router.get(
    "/reports/{name}",
    response_model=ReportOutput,
    summary="Run a named report over the store.",
    description=(
        "Runs the report's SQL with DuckDB over the live store (read-only). `format=csv` "
        "answers `text/csv`, `format=parquet` a Parquet file. 404 `not_found` for an "
        "unknown report; 422 `invalid_request` for bad parameters."
    ),
    responses={
        200: {
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/vnd.apache.parquet": {
                    "schema": {"type": "string", "format": "binary"}
                },
            }
        },
        **error_responses(401, 404, 422),
    },
)
async def run_report_route(
    state: StateDep,
    name: Annotated[str, Path(description="Report name (see GET /v1/reports).")],
    since: SinceQuery = None,
    until: UntilQuery = None,
    env_id: Annotated[str | None, Query(description=ENV_HELP)] = None,
    env: Annotated[
        str | None,
        Query(description="The former name of `env_id`, still accepted.", deprecated=True),
    ] = None,
    fmt: Annotated[
        Literal["json", "csv", "parquet"], Query(alias="format", description="Response format.")
    ] = "json",
) -> Response:
    """Run one report in one of this worker's analytics children, holding it and a read
    slot only for that (api/deps.py `analytics_slots`); the answer is rendered after."""
    from tracestore.reports.catalog import get_report
    from tracestore.reports.filters import Filters

    report = get_report(name)  # an unknown name or a bad parameter waits for nothing
    filters = Filters.parse(since, until, _one_env(env_id, env))
    async with analytics_slots(state):
        result = await anyio.to_thread.run_sync(_run, state.engine, report, filters)
    return await anyio.to_thread.run_sync(_answer, result, report, fmt)


def _answer(result: Result, report: Report, fmt: str) -> Response:
    from tracestore.reports import output

    if fmt == "csv":
        return Response(output.to_csv(result), media_type="text/csv; charset=utf-8")
    if fmt == "parquet":
        return Response(
            output.to_parquet(result),
            media_type="application/vnd.apache.parquet",
            headers={"Content-Disposition": f'attachment; filename="{report.name}.parquet"'},
        )
    return JSONBody(output.document(result))


def _one_env(env_id: str | None, env: str | None) -> str | None:
    """`env_id`, or its former name `env` (kept so that no existing caller breaks)."""
    if env_id is not None and env is not None and env_id != env:
        raise InvalidRequest(
            "env_id and env (its former name) name different environments: give one",
            env_id=env_id,
            env=env,
        )
    return env_id if env_id is not None else env


def _run(engine: Engine, report: Report, filters: Filters) -> Result:
    """Run on the live store; DuckDB never opens a SQLite store in this process."""
    from tracestore.reports import live

    return live.report(engine.url, report.name, filters)
