"""Deleting runs and reading what was deleted (issue 20): DELETE /v1/rollouts/{run_id},
GET /v1/deletions; datasets (read-only over HTTP: GET /v1/datasets[/{name}]).

Deleting needs a key with the admin role when keys are set (api/deps.require_admin).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from sqlalchemy import Engine

from tracestore.api.deps import AdminDep, ReadSessionDep, StateDep
from tracestore.api.params import RUN_PATH, RunIdPath
from tracestore.api.schemas import error_responses
from tracestore.db.uow import write_session
from tracestore.store.datasets import dataset_manifest, list_datasets
from tracestore.store.deletion import Deletion, delete_run, deletions

router = APIRouter(prefix="/v1", tags=["deleting"])

MAX_REASON = 1000


def _delete(engine: Engine, run_id: str, how: Deletion) -> dict[str, Any]:
    with write_session(engine) as session:
        return delete_run(session, run_id, how, datetime.now(UTC))


@router.delete(
    RUN_PATH,
    status_code=204,
    summary="Delete a run: its document, every projected row, its drift findings.",
    description=(
        "One transaction: the run and all its rows go, and an audit row (run_id, content "
        "hash, who, when, why; never the content) is written. 204 once done; then every "
        "read of the run is 404, and so is a second DELETE (`not_found`: nothing is "
        "deleted twice). 409 `pinned` while a dataset pins the run (`pinned_by` names "
        "them), unless `force=true`. With API keys set, the key needs the admin role "
        "(403 `forbidden` otherwise)."
    ),
    responses=error_responses(401, 403, 404, 409, 422),
    response_class=Response,
)
async def delete_rollout(
    run_id: RunIdPath,
    state: StateDep,
    who: AdminDep,
    force: Annotated[
        bool, Query(description="Delete even when a dataset pins the run (the audit says so).")
    ] = False,
    reason: Annotated[
        str | None,
        Query(max_length=MAX_REASON, description="Why: kept in the audit row."),
    ] = None,
) -> Response:
    """Delete one run."""
    how = Deletion(by=who, via="api", reason=reason or None, force=force)
    await state.lanes.writes.run(_delete, state.engine, run_id, how)
    return Response(status_code=204)


@router.get(
    "/deletions",
    summary="The deletion audit, newest first.",
    description="Who deleted which run, when and why (admin role when keys are set).",
    responses=error_responses(401, 403, 422),
)
def get_deletions(
    session: ReadSessionDep,
    _who: AdminDep,
    run_id: Annotated[str | None, Query(description="Only the deletions of this run_id.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """List deletions."""
    return {"items": deletions(session, run_id=run_id, limit=limit)}


@router.get(
    "/datasets",
    summary="Datasets: named, immutable sets of runs that pin them.",
    responses=error_responses(401),
)
def get_datasets(session: ReadSessionDep) -> dict[str, Any]:
    """List datasets."""
    return {"items": list_datasets(session)}


@router.get(
    "/datasets/{name}",
    summary="A dataset's manifest: count, filter, hash, and how many runs are still there.",
    responses=error_responses(401, 404),
)
def get_dataset(
    name: Annotated[str, Path(description="The dataset's name.")], session: ReadSessionDep
) -> dict[str, Any]:
    """One dataset's manifest."""
    return dataset_manifest(session, name)
