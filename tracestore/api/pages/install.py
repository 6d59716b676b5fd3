"""Adding the inspector to the API: its pages, sign-in, static files and offline docs."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

from tracestore.api.errors import validation_problems
from tracestore.api.pages import docs
from tracestore.api.pages.render import STATIC, TEMPLATES, environment
from tracestore.api.pages.routes import LoginRequired, error_page, login_page, pages, sign_in
from tracestore.errors import InvalidRequest


async def _login_required(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoginRequired)
    if request.method == "GET" and request.headers.get("sec-fetch-mode") == "navigate":
        # A browser going to a page: on to the sign-in page, which answers 200 (a 401
        # document is logged as an error in the browser's console).
        target = "/login?" + urlencode({"next": exc.next_path})
        return RedirectResponse(target, status_code=303)
    return login_page(request, request.app.state.tracestore.settings, exc.next_path, None)


def _page_validation(api_handler: Any) -> Any:
    """The app's handler of bad parameters, answering a page's own with an HTML page: a
    browser was given the API's JSON (`/runs?limit=abc`, `/runs/X?step=-1`)."""
    # The app's routes are copies of the router's (include_router): same endpoints.
    page_endpoints = {getattr(route, "endpoint", None) for route in pages.routes} - {None}

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        if getattr(request.scope.get("route"), "endpoint", None) not in page_endpoints:
            return cast(Response, await api_handler(request, exc))
        problems = [f"{p['path']}: {p['message']}" for p in validation_problems(exc)]
        refusal = InvalidRequest("; ".join(problems) or "invalid request")
        return error_page(request, request.app.state.tracestore.settings, refusal)

    return handle


def install(app: FastAPI) -> None:
    """Add the pages to `app` (built with docs_url=None and redoc_url=None)."""
    # Assets hold no store data: served to anyone, like /docs.
    app.mount("/static/inspector", StaticFiles(directory=STATIC), name="inspector-assets")
    docs.install(app)
    app.include_router(sign_in)
    app.include_router(pages)
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(
        RequestValidationError,
        _page_validation(app.exception_handlers[RequestValidationError]),
    )
    # Compile the templates now (a fifth of a second), not in the first page's answer.
    for template in TEMPLATES.glob("*.html"):
        environment().get_template(template.name)
