"""The inspector's pages: home and search, the run list, a run, a correlation id, sign-in.

Pages read the store through the same services as the API (`tracestore.inspect`,
`store.runs`), never through HTTP, so a person looking at a run is never counted as a
reader of legacy trajectories. With API keys set, a page without a valid key or session
answers 401 with the sign-in form (the key goes in a POST body, never in a URL).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from tracestore.api.body import read_body
from tracestore.api.deps import ReadSessionDep, StateDep, check_key, identify
from tracestore.api.errors import status_of
from tracestore.api.held import held_inspection
from tracestore.api.pages import links
from tracestore.api.pages.chart import reward_svg
from tracestore.api.pages.render import STATIC, render_page
from tracestore.api.pages.session import (
    clear_session,
    form_is_ours,
    issue_token,
    set_session,
)

# The run_id path convertor the routes below use is registered there.
from tracestore.api.params import RunIdConvertor  # noqa: F401  (imported for its side effect)
from tracestore.errors import InvalidRequest, TracestoreError, Unauthorized
from tracestore.inspect.run import (
    MAX_POSITION,
    MAX_STEPS_PER_PAGE,
    STEPS_PER_PAGE,
)
from tracestore.inspect.search import resolve, run_links, store_figures
from tracestore.settings import Settings
from tracestore.store.runs import (
    FILTER_TRACE_KINDS,
    MAX_LIMIT,
    RunFilter,
    list_runs,
    runs_by_correlation,
)
from tracestore.timewindow import parse_optional

NEWEST_RUNS = 10
RUNS_PER_PAGE = 50
MAX_FORM_BYTES = 16 * 1024


class LoginRequired(Exception):
    """A page asked for without a valid key or session: answered with the sign-in form."""

    def __init__(self, next_path: str, message: str) -> None:
        super().__init__(message)
        self.next_path = next_path
        self.message = message


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


async def page_access(request: Request, state: StateDep) -> None:
    """Let the page through with a valid key or session; else LoginRequired."""
    try:
        check_key(request, state.settings)
    except Unauthorized as exc:
        raise LoginRequired(_here(request), exc.message) from None


pages = APIRouter(include_in_schema=False, dependencies=[Depends(page_access)])
sign_in = APIRouter(include_in_schema=False)


def error_page(request: Request, settings: Settings, exc: TracestoreError) -> Response:
    """A domain error as a page (its status, its message, the search box)."""
    return render_page(
        request,
        settings,
        "error.html",
        {"title": exc.code.replace("_", " "), "message": exc.message, "details": exc.details},
        status_code=status_of(exc),
    )


def login_page(request: Request, settings: Settings, next_path: str, error: str | None) -> Response:
    """The sign-in form (401: the page asked for needs a key)."""
    return render_page(
        request,
        settings,
        "login.html",
        {"title": "Sign in", "next": _safe_next(next_path), "error": error},
        status_code=401,
        # A scheme browsers do not prompt for: the form is the way in.
        headers={"WWW-Authenticate": 'Bearer realm="tracestore"'},
    )


def _safe_next(value: str | None) -> str:
    # Only a path of this site: never another host (`//evil`, `/\\evil`) after sign-in.
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return "/"
    return value


# --- home and search ----------------------------------------------------------------------


@pages.get("/")
def home(request: Request, state: StateDep, session: ReadSessionDep) -> Response:
    """The search box, the store's headline figures and its newest runs."""
    runs, _cursor = list_runs(session, RunFilter(), limit=NEWEST_RUNS)
    return render_page(
        request,
        state.settings,
        "home.html",
        {
            "title": "tracestore",
            "figures": store_figures(session),
            "runs": run_links(session, runs),
        },
    )


@pages.get("/search")
def search(
    request: Request,
    state: StateDep,
    session: ReadSessionDep,
    q: Annotated[str, Query(description="A run id, a cid, an inference URL or a log line.")] = "",
) -> Response:
    """Go to what `q` names: a run, the runs of a cid; or say why nothing matched."""
    found = resolve(session, q)
    if found.kind == "run" and found.run_id is not None:
        return RedirectResponse(links.run_href(found.run_id), status_code=303)
    if found.kind == "correlation" and found.correlation_id is not None:
        return RedirectResponse(links.cid_href(found.correlation_id), status_code=303)
    return render_page(
        request,
        state.settings,
        "search.html",
        # 200: a search that found nothing is an answer (and a 404 document would be
        # logged as an error in the browser's console).
        {"title": "Nothing found", "q": q, "found": found},
    )


# --- the run list -------------------------------------------------------------------------


def _flag(value: str | None, name: str) -> bool | None:
    text = (value or "").strip().lower()
    if text in ("", "any"):
        return None
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise InvalidRequest(f"{name} is yes, no or any, not {value!r}", **{name: value})


def _text(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


@pages.get("/runs")
def runs_page(
    request: Request,
    state: StateDep,
    session: ReadSessionDep,
    env_id: str | None = None,
    policy_id: str | None = None,
    correlation_id: str | None = None,
    since: str | None = None,
    until: str | None = None,
    trace_kind: str | None = None,
    has_trajectories: str | None = None,
    has_drift: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = RUNS_PER_PAGE,
    cursor: str | None = None,
) -> Response:
    """Runs, newest first, with the filters of GET /v1/rollouts and keyset paging."""
    form = {
        "env_id": env_id or "",
        "policy_id": policy_id or "",
        "correlation_id": correlation_id or "",
        "since": since or "",
        "until": until or "",
        "trace_kind": trace_kind or "",
        "has_trajectories": has_trajectories or "",
        "has_drift": has_drift or "",
    }
    context: dict[str, Any] = {
        "title": "Runs",
        "form": form,
        "trace_kinds": [*FILTER_TRACE_KINDS],
        "limit": limit,
        "default_limit": RUNS_PER_PAGE,
        "runs": [],
        "next_href": None,
        "error": None,
        "paged": cursor is not None,
    }
    try:
        kind = _text(trace_kind)  # RunFilter refuses a kind it does not know
        f = RunFilter(
            correlation_id=_text(correlation_id),
            env_id=_text(env_id),
            policy_id=_text(policy_id),
            since=parse_optional(_text(since), name="since"),
            until=parse_optional(_text(until), name="until"),
            trace_kind=kind,
            has_trajectories=_flag(has_trajectories, "has_trajectories"),
            has_drift=_flag(has_drift, "has_drift"),
        )
        runs, next_cursor = list_runs(session, f, limit=limit, cursor=cursor)
    except TracestoreError as exc:
        context["error"] = exc.message
        return render_page(request, state.settings, "runs.html", context, status_code=422)
    context["runs"] = run_links(session, runs)
    filters = {k: v for k, v in form.items() if v}
    if limit != RUNS_PER_PAGE:
        filters["limit"] = str(limit)
    context["first_href"] = "/runs" + (f"?{urlencode(filters)}" if filters else "")
    if next_cursor is not None:
        context["next_href"] = "/runs?" + urlencode({**filters, "cursor": next_cursor})
    return render_page(request, state.settings, "runs.html", context)


# --- one run ------------------------------------------------------------------------------


@pages.get("/runs/{run_id:run_id}")
async def run_page(
    run_id: str,
    request: Request,
    state: StateDep,
    offset: Annotated[int, Query(ge=0, le=MAX_POSITION)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_STEPS_PER_PAGE)] = STEPS_PER_PAGE,
    step: Annotated[int | None, Query(ge=0, le=MAX_POSITION)] = None,
) -> Response:
    """A run: header, parts, drift, reward per step, and one page of its steps."""
    try:
        # Holding what converting a part costs, when it converts one (api/held.py).
        run = await held_inspection(state, run_id, offset=offset, limit=limit, step=step)
    except TracestoreError as exc:
        return error_page(request, state.settings, exc)
    # Panel "all": every panel is there.
    assert run.steps is not None
    assert run.rewards is not None
    rewards = run.rewards

    def render() -> Response:
        return render_page(
            request,
            state.settings,
            "run.html",
            {
                "title": f"run {run_id}",
                "run": run,
                "chart": reward_svg(rewards, links.run_href(run_id)),
                "target": step,
                "default_limit": STEPS_PER_PAGE,
            },
        )

    # In a thread, as the page's plain `def` was: a run's chart and page are not drawn on
    # the event loop.
    return await run_in_threadpool(render)


# --- one correlation id -------------------------------------------------------------------


@pages.get("/correlations/{cid:run_id}")
def correlation_page(
    cid: str, request: Request, state: StateDep, session: ReadSessionDep
) -> Response:
    """Every run of a correlation id (canonical or any trajectory's)."""
    try:
        matched, runs = runs_by_correlation(session, cid)
    except TracestoreError as exc:
        return error_page(request, state.settings, exc)
    return render_page(
        request,
        state.settings,
        "correlation.html",
        {"title": f"cid {cid}", "cid": cid, "matched": matched, "runs": run_links(session, runs)},
    )


# --- sign in and out ----------------------------------------------------------------------


async def _form(request: Request) -> dict[str, str]:
    raw = await read_body(request, MAX_FORM_BYTES)
    parsed = parse_qs(raw.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items() if v}


@sign_in.get("/login")
async def login_form(
    request: Request,
    state: StateDep,
    next_path: Annotated[str | None, Query(alias="next")] = None,
    failed: Annotated[str | None, Query(description="Set after a wrong key.")] = None,
) -> Response:
    """The sign-in form (or straight on, when the server has no keys)."""
    if not state.settings.api_keys:
        return RedirectResponse(_safe_next(next_path), status_code=303)
    error = "That key is not valid." if failed else None
    response = login_page(request, state.settings, _safe_next(next_path), error)
    response.status_code = 200
    return response


@sign_in.post("/login")
async def login(request: Request, state: StateDep) -> Response:
    """Check the key; on success set the session cookie and go where the person was going."""
    settings = state.settings
    form = await _form(request)
    target = _safe_next(form.get("next"))
    if not settings.api_keys:
        return RedirectResponse(target, status_code=303)
    if not form_is_ours(request, form):
        return render_page(
            request,
            settings,
            "error.html",
            {
                "title": "sign-in refused",
                "message": "The sign-in form expired or came from another site: reload the "
                "page and sign in again.",
                "details": {},
            },
            status_code=403,
        )
    name = identify(form.get("key", ""), settings.api_clients())
    if name is None:
        # Back to the form, saying so (a 401 document would be logged in the console).
        again = "/login?" + urlencode({"next": target, "failed": "1"})
        return RedirectResponse(again, status_code=303)
    client = next(c for c in settings.api_clients() if c.name == name)
    response = RedirectResponse(target, status_code=303)
    set_session(response, request, issue_token(client))
    return response


@sign_in.get("/favicon.ico")
async def favicon() -> Response:
    """The icon browsers ask every page's host for (the drift report's too)."""
    return Response(
        (STATIC / "favicon.svg").read_bytes(),
        media_type="image/svg+xml",
        headers={"Cache-Control": "public, max-age=86400"},
    )


@sign_in.post("/logout")
async def logout(request: Request, state: StateDep) -> Response:
    """Sign the browser out (a CSRF-checked form)."""
    form = await _form(request)
    if not form_is_ours(request, form):
        return render_page(
            request,
            state.settings,
            "error.html",
            {
                "title": "sign-out refused",
                "message": "The form came from another site or expired: reload and retry.",
                "details": {},
            },
            status_code=403,
        )
    response = RedirectResponse("/", status_code=303)
    clear_session(response, request)
    return response
