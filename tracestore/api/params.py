"""Parameters every router shares: the run_id path segment, time-window instants, and the
guard that refuses query parameters a route does not declare."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.convertors import Convertor, register_url_convertor

from tracestore.errors import InvalidRequest
from tracestore.store.runs import RunFilter
from tracestore.timewindow import WHEN_HELP, parse_optional


class RunIdConvertor(Convertor[str]):
    """Any run_id: '/' (sent as %2F, decoded before routing) and line breaks included.

    Starlette's `path` convertor is `.*`, which stops at a newline; run_ids may hold one.
    """

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        """The path segment is the run_id."""
        return value

    def to_string(self, value: str) -> str:
        """The run_id is the path segment."""
        return value


register_url_convertor("run_id", RunIdConvertor())

# The routes under a run (/trace, /trajectories, /drift) are registered before the bare
# one, which would match them too, and ingest refuses run_ids that end in one of those
# suffixes (ingest/parse.py), so no id is ever ambiguous.
RUN_PATH = "/rollouts/{run_id:run_id}"

RunIdPath = Annotated[
    str,
    Path(description="The rollout's run_id (a '/' in it is sent as %2F).", min_length=1),
]


# --- since / until: one grammar on every route (tracestore/timewindow.py) -----------------

_WHEN = WHEN_HELP[0].upper() + WHEN_HELP[1:] + "."
SinceQuery = Annotated[
    str | None, Query(description=f"Runs received at or after this time. {_WHEN}")
]
UntilQuery = Annotated[str | None, Query(description=f"Runs received before this time. {_WHEN}")]

ENV_HELP = (
    "Runs of this env_id: one of their trajectories', or (when their first trajectory names "
    "none, as in a run without trajectories) the one their trace's metadata names."
)
POLICY_HELP = (
    "Runs of this policy_id: one of their trajectories', or (when their first trajectory "
    "names none, as in a run without trajectories) the one their trace's metadata names."
)


def since_until(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    """The `since` and `until` query parameters as aware UTC instants (None when absent)."""
    return parse_optional(since, name="since"), parse_optional(until, name="until")


# --- the run filters: one dependency for every list-like route ----------------------------


def run_filter(
    correlation_id: Annotated[
        str | None, Query(description="Canonical or per-trajectory cid.")
    ] = None,
    env_id: Annotated[str | None, Query(description=ENV_HELP)] = None,
    policy_id: Annotated[str | None, Query(description=POLICY_HELP)] = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
    trace_kind: Annotated[
        str | None,
        Query(
            description="full, wrapped, summary, db_row, empty, unknown, or null (runs sent "
            "without a trace)."
        ),
    ] = None,
    has_trajectories: Annotated[
        bool | None, Query(description="Only runs with (true) or without (false) trajectories.")
    ] = None,
    has_drift: Annotated[
        bool | None, Query(description="Only runs with (true) or without (false) drift findings.")
    ] = None,
) -> RunFilter:
    """The runs a list, a drift summary or a report covers (GET /v1/rollouts' filters)."""
    start, end = since_until(since, until)
    return RunFilter(
        correlation_id=correlation_id,
        env_id=env_id,
        policy_id=policy_id,
        since=start,
        until=end,
        trace_kind=trace_kind,
        has_trajectories=has_trajectories,
        has_drift=has_drift,
    )


RunFilterDep = Annotated[RunFilter, Depends(run_filter)]


# --- unknown query parameters -------------------------------------------------------------


def _query_names(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def declared_query(route: APIRoute) -> frozenset[str]:
    """The query parameters `route` declares (its own and its dependencies'), by wire name."""
    # Kept on the route: it never changes, and routes are not hashable (Starlette defines
    # __eq__ on them), so no dictionary can key on them.
    known: frozenset[str] | None = route.__dict__.get("_tracestore_query")
    if known is None:
        known = frozenset(_query_names(route.dependant))
        route.__dict__["_tracestore_query"] = known
    return known


async def only_declared_query(request: Request) -> None:
    """Refuse (422) a query parameter the route does not declare, naming the ones it does.

    A misspelt or misplaced filter (`?env=` where the name is `env_id`) would otherwise
    be ignored, and the answer would look like the filtered one.
    """
    route = request.scope.get("route")
    if isinstance(route, APIRoute):
        refuse_undeclared_query(request, route.path_format, declared_query(route))


def refuse_undeclared_query(request: Request, path_format: str, known: frozenset[str]) -> None:
    """Refuse (422) the request's query parameters that are not in `known`."""
    unknown = sorted({name for name in request.query_params if name not in known})
    if not unknown:
        return
    names = ", ".join(repr(n) for n in unknown)
    takes = f"it takes {', '.join(sorted(known))}" if known else "it takes no query parameters"
    raise InvalidRequest(
        f"unknown query parameter{'s' if len(unknown) > 1 else ''} {names} for "
        f"{request.method} {path_format}: {takes}",
        unknown=unknown,
        known=sorted(known),
    )
