"""Templates and what they are given: one Jinja environment, filters, the page response.

Templates autoescape; nothing a producer sent is ever marked safe. Pages hold store data,
so they are never cached by shared caches, and a Content-Security-Policy allows only this
origin's own scripts and styles (no inline script runs, whatever a document holds).
"""

from __future__ import annotations

import functools
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from tracestore import __version__
from tracestore.api.pages import links
from tracestore.api.pages.session import csrf_token, session_client, set_csrf
from tracestore.settings import Settings

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
# A value longer than this (as indented JSON) is cut on the page; its panel's JSON and the
# raw document hold it whole.
MAX_JSON_CHARS = 20_000
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
}


def pretty_json(value: Any) -> str:
    """Indented JSON text of a value, cut at MAX_JSON_CHARS."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # an integer beyond 64 bits: the standard library writes it
        import json

        text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    if len(text) > MAX_JSON_CHARS:
        return text[:MAX_JSON_CHARS] + f"\n… ({len(text) - MAX_JSON_CHARS:,} more characters)"
    return text


def compact_json(value: Any, limit: int = 160) -> str:
    """One line of JSON, cut at `limit` characters (for summaries)."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(value: datetime | None) -> str:
    """A UTC time to the second."""
    if value is None:
        return "-"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def size(n: int | None) -> str:
    """Bytes, for people."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def number(value: Any) -> str:
    """A number as a person reads it (`-` for none)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def json_size(value: Any) -> str:
    """The size of a value's JSON, for a collapsed block's summary."""
    try:
        return size(len(orjson.dumps(value)))
    except TypeError:
        return "?"


@functools.cache
def environment() -> Environment:
    """The templates' environment (built once per process)."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        pretty_json=pretty_json,
        compact_json=compact_json,
        when=when,
        size=size,
        number=number,
        json_size=json_size,
    )
    env.globals.update(
        run_href=links.run_href,
        run_page_href=links.run_page_href,
        cid_href=links.cid_href,
        api_cid_href=links.api_cid_href,
        api_run_href=links.api_run_href,
        panel_href=links.panel_href,
        search_href=links.search_href,
        version=__version__,
        Markup=Markup,
    )
    return env


def render_page(
    request: Request,
    settings: Settings,
    template: str,
    context: dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    """Render a page, with what every page shows (sign-in state, the sign-out form's token)."""
    token, new = csrf_token(request)
    keys = bool(settings.api_keys)
    body = (
        environment()
        .get_template(template)
        .render(
            request_path=request.url.path,
            keys_required=keys,
            signed_in=keys and session_client(request, settings) is not None,
            csrf=token,
            **context,
        )
    )
    response = HTMLResponse(
        body, status_code=status_code, headers={**SECURITY_HEADERS, **(headers or {})}
    )
    if new:
        set_csrf(response, request, token)
    return response
