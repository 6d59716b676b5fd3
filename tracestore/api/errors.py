"""Every error becomes `{"error": {"code", "message", ...}}`; the status table is here."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match, Mount

from tracestore import errors
from tracestore.api.overload import ANALYTICS_LANE, BUSY_RETRY_AFTER, DatabaseBusy, ParsingBusy
from tracestore.jsontext import dumps

log = logging.getLogger("tracestore.api")


class JSONBody(Response):
    """A JSON response rendered by orjson (datetimes as ISO 8601)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialize the content."""
        return dumps(content)


# The one table from domain errors to HTTP statuses.
STATUS: dict[type[errors.TracestoreError], int] = {
    errors.InvalidJSON: 400,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.InvalidRollout: 422,
    errors.InvalidRequest: 422,
    errors.SchemaOutOfDate: 503,
    errors.Unavailable: 503,
}
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}


def status_of(exc: errors.TracestoreError) -> int:
    """HTTP status of a domain error (the most specific class in STATUS wins)."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The error shape."""
    return {"error": {"code": code, "message": message, **details}}


def error_response(exc: errors.TracestoreError) -> JSONBody:
    """The HTTP response of a domain error."""
    # Basic too: a browser then asks for the key (as the password) instead of showing 401.
    challenge = 'Bearer, Basic realm="tracestore", charset="UTF-8"'
    headers = {"WWW-Authenticate": challenge} if isinstance(exc, errors.Unauthorized) else None
    return JSONBody(
        error_body(exc.code, exc.message, **exc.details),
        status_code=status_of(exc),
        headers=headers,
    )


async def _domain(_request: Request, exc: Exception) -> JSONBody:
    assert isinstance(exc, errors.TracestoreError)
    return error_response(exc)


def validation_problems(exc: RequestValidationError) -> list[dict[str, str]]:
    """The framework's refusal of a request's parameters, one `{path, message}` each."""
    return [
        {
            "path": ".".join(str(p) for p in e.get("loc", ())),
            "message": str(e.get("msg", "invalid")),
        }
        for e in exc.errors()
    ]


async def _validation(_request: Request, exc: Exception) -> JSONBody:
    assert isinstance(exc, RequestValidationError)
    problems = validation_problems(exc)
    first = problems[0] if problems else {"path": "", "message": "invalid request"}
    return JSONBody(
        error_body("invalid_request", f"{first['path']}: {first['message']}", errors=problems),
        status_code=422,
    )


async def _http(request: Request, exc: Exception) -> JSONBody:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = exc.headers
    allow = allowed_methods(request) if exc.status_code == 405 else None
    if allow:
        headers = {**(headers or {}), "Allow": allow}
    return JSONBody(error_body(code, message), status_code=exc.status_code, headers=headers)


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str | None:
    """Every method the app answers on the request's path, for a 405's `Allow`."""
    # Starlette's router names only the first route of the path in its 405 (a path with
    # GET and POST routes said `Allow: POST`). Each method is tried on the routes as the
    # router tries it (FastAPI nests included routers, so the routes are not a flat list);
    # mounts answer any method and are left out.
    routes = [r for r in request.app.router.routes if not isinstance(r, Mount)]
    methods = [
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    ]
    if "GET" in methods:
        methods.append("HEAD")  # api/head.py
    return ", ".join(sorted(methods)) or None


# Seconds a client should wait after a 503 from a database that is busy or unreachable.
DATABASE_RETRY_AFTER = 1


def _schema_gone(exc: Exception) -> bool:
    """Whether a database error says a table or column of the schema is not there."""
    orig = getattr(exc, "orig", None)
    if type(orig).__name__ in ("UndefinedTable", "UndefinedColumn"):  # psycopg's
        return True
    text = str(orig or exc)
    return text.startswith(("no such table", "no such column"))  # SQLite's


async def _schema_changed(request: Request, exc: Exception) -> JSONBody:
    # The schema went away under a running server (`db downgrade`, a dropped table): not
    # transient, and not the client's fault. /health says the same.
    log.error("schema out of date on %s %s: %s", request.method, request.url.path, exc.args)
    return JSONBody(
        error_body(
            "schema_out_of_date",
            "the database's schema is not the one this server expects (downgraded or "
            "dropped under it?): run 'tracestore db upgrade', then retry",
        ),
        status_code=503,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
    )


async def _programming(request: Request, exc: Exception) -> JSONBody:
    if _schema_gone(exc):
        return await _schema_changed(request, exc)
    return await _unexpected(request, exc)


async def _database(request: Request, exc: Exception) -> JSONBody:
    # A lock held past the wait (SQLite's busy_timeout, PostgreSQL's lock_timeout), a
    # database restarting or unreachable: transient, and nothing of the request was
    # committed, so the client is told to retry (ingest is idempotent).
    if _schema_gone(exc):
        return await _schema_changed(request, exc)
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc.args)
    return JSONBody(
        error_body(
            "database_unavailable",
            "the database is busy or unreachable; retry after the Retry-After delay",
        ),
        status_code=503,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
    )


# A flood refuses hundreds of requests a second: the log says so once per this many seconds.
BUSY_LOG_EVERY_S = 10.0
_busy_log = {"at": -BUSY_LOG_EVERY_S, "since": 0}


async def _busy(request: Request, exc: Exception) -> JSONBody:
    # Every connection of the request's lane stayed taken for the whole wait (a flood), or
    # the pool's own backstop wait ran out: nothing was done, and a retry is safe.
    _busy_log["since"] += 1
    now = time.monotonic()
    if now - _busy_log["at"] >= BUSY_LOG_EVERY_S:
        log.warning(
            "database busy: %d request(s) refused with 503 in the last %.0f s; last on %s %s: %s",
            _busy_log["since"],
            min(now - _busy_log["at"], BUSY_LOG_EVERY_S),
            request.method,
            request.url.path,
            exc,
        )
        _busy_log.update(at=now, since=0)
    what = (
        "both analytics processes stayed busy with other reports"
        if isinstance(exc, DatabaseBusy) and exc.lane == ANALYTICS_LANE
        else "every database connection stayed busy"
    )
    return JSONBody(
        error_body(
            "database_busy",
            f"{what} for the whole wait; retry after the Retry-After delay",
            retry_after=BUSY_RETRY_AFTER,
        ),
        status_code=503,
        headers={"Retry-After": str(BUSY_RETRY_AFTER)},
    )


async def _parsing_busy(_request: Request, exc: Exception) -> JSONBody:
    # The worker's ingests in progress held the memory they may take for the whole wait
    # (api/overload.py ParseBudget): nothing was parsed or written, a retry is safe.
    return JSONBody(
        error_body(
            "overloaded",
            f"{exc}: the ingests in progress hold the memory this server may spend on "
            "parsing; retry after the Retry-After delay",
            retry_after=BUSY_RETRY_AFTER,
        ),
        status_code=503,
        headers={"Retry-After": str(BUSY_RETRY_AFTER)},
    )


async def _unexpected(request: Request, exc: Exception) -> JSONBody:
    # Logged with the traceback; the client gets the error shape without internals.
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONBody(
        error_body("internal_error", "internal error; it has been logged"),
        status_code=500,
        # The server closes the connection after an unhandled error (Starlette re-raises
        # it for uvicorn to log): say so, or a client's next request on it may meet a reset.
        headers={"Connection": "close"},
    )


def install_error_handlers(app: FastAPI) -> None:
    """Make every error on `app` use the error shape."""
    app.add_exception_handler(errors.TracestoreError, _domain)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OperationalError, _database)
    app.add_exception_handler(ProgrammingError, _programming)
    app.add_exception_handler(DatabaseBusy, _busy)
    app.add_exception_handler(PoolTimeout, _busy)
    app.add_exception_handler(ParsingBusy, _parsing_busy)
    app.add_exception_handler(Exception, _unexpected)


class RouteHandlers:
    """The app's exception handlers, found as Starlette's ExceptionMiddleware finds them,
    for the routes served below it (the lean routes, the ingest lane): by status code for
    an HTTPException, else by the exception's classes. 500 and Exception are left out:
    they are handled outermost, by ServerErrorMiddleware, as on the normal path."""

    def __init__(self, owner: FastAPI) -> None:
        self.owner = owner
        # Split at the first error (once every handler is in place).
        self._split: tuple[dict[Any, Any], dict[int, Any]] | None = None

    def find(self, exc: Exception) -> Any:
        """The handler of `exc`, or None (the error goes on up)."""
        if self._split is None:
            handlers = {
                k: v for k, v in self.owner.exception_handlers.items() if k not in (500, Exception)
            }
            by_class = {k: v for k, v in handlers.items() if not isinstance(k, int)}
            by_status = {k: v for k, v in handlers.items() if isinstance(k, int)}
            self._split = (by_class, by_status)
        by_class, by_status = self._split
        if isinstance(exc, StarletteHTTPException) and exc.status_code in by_status:
            return by_status[exc.status_code]
        return next((by_class[c] for c in type(exc).__mro__ if c in by_class), None)

    async def answer(self, request: Request, exc: Exception) -> Response | None:
        """The answer to `exc` raised before any byte of the answer went: its handler's
        response (None when the handler answers nothing); re-raises when none handles it."""
        handler = self.find(exc)
        if handler is None:
            raise exc
        if inspect.iscoroutinefunction(handler):
            response: Response | None = await handler(request, exc)
        else:  # as Starlette runs a plain function: in its thread pool
            response = await run_in_threadpool(handler, request, exc)
        # A reused exception instance would gather tracebacks across requests.
        exc.__traceback__ = None
        return response
