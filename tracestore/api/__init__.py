"""The HTTP API: create_app(settings), routers per resource, one error-to-HTTP table."""

from tracestore.api.app import create_app

__all__ = ["create_app"]
