"""/docs and /redoc that work offline: Swagger UI and ReDoc served from this process.

FastAPI's own pages load both from a CDN, so without internet they render blank. The
assets come from the `fastapi-offline` package (Swagger UI's and ReDoc's distribution
files, as published on PyPI) and are served under /static/docs/. ReDoc's bundle still
loads one file from the internet, the Redocly logo in its menu (no option turns it off):
the bundle is served with that URL pointed at a local image, so no page load leaves the
machine and none logs a failed request.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/docs"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
REDOC_JS = "redoc.standalone.js"
REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


def assets_dir() -> Path:
    """Where the installed fastapi-offline package keeps the Swagger UI and ReDoc files."""
    return Path(str(files("fastapi_offline") / "static"))


@functools.cache
def redoc_bundle() -> bytes:
    """ReDoc's bundle with its one internet URL (the menu's logo) pointed at a local file."""
    bundle = (assets_dir() / REDOC_JS).read_bytes()
    return bundle.replace(REDOC_LOGO, f"{ASSETS}/favicon.png".encode())


def install(app: FastAPI) -> None:
    """Serve /docs, /redoc and their assets (the app is built with docs_url=None)."""
    router = APIRouter(include_in_schema=False)
    openapi_url = app.openapi_url or "/openapi.json"

    # Before the static mount below, which would serve the bundle unpatched.
    @router.get(f"{ASSETS}/{REDOC_JS}")
    async def redoc_js() -> Response:
        """ReDoc's bundle, patched (see the module docstring)."""
        return Response(
            redoc_bundle(),
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    @router.get("/docs")
    async def swagger_ui() -> HTMLResponse:
        """Swagger UI: every route, interactive."""
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            oauth2_redirect_url=OAUTH2_REDIRECT,
            # No validator badge: it would ask swagger.io to validate the schema.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @router.get(OAUTH2_REDIRECT)
    async def swagger_ui_redirect() -> HTMLResponse:
        """Swagger UI's OAuth2 redirect page."""
        return get_swagger_ui_oauth2_redirect_html()

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        """ReDoc: the same schema, as a document."""
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title}: API",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")
