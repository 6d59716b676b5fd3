"""HEAD answered on every GET route: the GET's status and headers, without its body."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HeadAsGet:
    """ASGI middleware, the outermost: a HEAD request goes down the app as a GET.

    FastAPI's GET routes refuse HEAD (405), which load balancers' health checks and
    `curl -I` send. The server (uvicorn) reads the method from its own scope, still HEAD,
    and so writes the GET's status line and headers (Content-Length included) and none of
    its body, as RFC 9110 §9.3.2 asks.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI call."""
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET", HEAD: True}
        await self.app(scope, receive, send)


# In the scope of a HEAD served as a GET: the metrics label it HEAD, and it counts as no
# legacy read (no trajectories went out: api/observability.py).
HEAD = "tracestore.head"
