"""What the client raises: the server's refusals, and rollouts it refuses to send."""

from __future__ import annotations

import json
from typing import Any

import httpx


class TracestoreHTTPError(Exception):
    """The server refused a request (4xx other than retryable ones), or retries ran out."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = error.get("code", f"http_{status}")
        self.body = body
        super().__init__(f"{status} {self.code}: {error.get('message', body)}")


class UnexpectedAnswer(TracestoreHTTPError):
    """A success status whose body is not tracestore's answer (HTML from a proxy or a
    sign-in page, a wrong base URL): nothing says the rollout was stored. A post with a
    spool spools it; otherwise this is raised."""

    def __init__(self, response: httpx.Response, expected: str) -> None:
        text = response.text[:200]
        super().__init__(
            response.status_code,
            {
                "error": {
                    "code": "unexpected_answer",
                    "message": f"not tracestore's {expected} (is the base URL right?); "
                    f"{response.headers.get('content-type', 'no content type')}: {text!r}",
                }
            },
        )


class NonFiniteNumberError(ValueError):
    """A rollout holds NaN or Infinity: JSON cannot carry them, and the server refuses them.

    Raised before anything is sent or spooled. `path` says where (`$.metrics.mean_return`),
    `index` which rollout of a batch, `run_id` which rollout.
    """

    def __init__(self, value: str, path: str, *, run_id: str | None, index: int | None) -> None:
        self.value = value
        self.path = path
        self.run_id = run_id
        self.index = index
        which = f"rollout {run_id!r}" if run_id is not None else "a rollout"
        if index is not None:
            which += f" (item {index} of the batch)"
        super().__init__(
            f"{which} holds {value} at {path}: JSON has no NaN or Infinity and tracestore "
            "refuses them; send null or a finite number (nothing was sent)"
        )


def response_body(response: httpx.Response) -> Any:
    """The JSON body of a response; for a body that is not JSON, an error of the same shape."""
    try:
        return json.loads(response.content)
    except ValueError:
        return {"error": {"code": f"http_{response.status_code}", "message": response.text[:200]}}
