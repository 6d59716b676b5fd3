"""A small HTTP client for tracestore, used by `tracestore ingest --url` and by producers.

Posts single rollouts and batches (gzip above a size), retries connection errors, 429, 503
and other 5xx with capped exponential backoff and jitter (honouring Retry-After), treats
`duplicate` as success and surfaces `conflict` and other 4xx at once.
"""

from __future__ import annotations

import gzip
import random
import time
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

GZIP_ABOVE = 64 * 1024
RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))


class TracestoreHTTPError(Exception):
    """The server refused a request (4xx other than retryable ones), or retries ran out."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = error.get("code", f"http_{status}")
        self.body = body
        super().__init__(f"{status} {self.code}: {error.get('message', body)}")


class TracestoreClient:
    """Synchronous client; one keep-alive connection pool per instance."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff

    def __enter__(self) -> TracestoreClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            after = response.headers.get("retry-after", "")
            if after.replace(".", "", 1).isdigit():
                return min(float(after), self.max_backoff)
        # Full jitter: spreads the retries of many clients after an outage.
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))

    def _post(self, path: str, body: bytes, content_type: str) -> httpx.Response:
        headers = {"Content-Type": content_type}
        if len(body) > GZIP_ABOVE:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        attempt = 0
        while True:
            response: httpx.Response | None = None
            try:
                response = self._http.post(path, content=body, headers=headers)
                if response.status_code not in RETRY_STATUSES:
                    return response
            except httpx.TransportError:
                if attempt >= self.max_retries:
                    raise
            if attempt >= self.max_retries and response is not None:
                raise TracestoreHTTPError(response.status_code, _json(response))
            time.sleep(self._delay(attempt, response))
            attempt += 1

    def post_rollout(self, rollout: bytes | dict[str, Any]) -> dict[str, Any]:
        """Post one rollout; returns the body for created/duplicate, raises otherwise."""
        raw = rollout if isinstance(rollout, bytes) else orjson.dumps(rollout)
        response = self._post("/v1/rollouts", raw, "application/json")
        body = _json(response)
        if response.status_code in (200, 201):
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    def post_batch(self, rollouts: Sequence[bytes | dict[str, Any]]) -> dict[str, Any]:
        """Post rollouts as one NDJSON batch; returns the 207 body (results and summary)."""
        lines = [r if isinstance(r, bytes) else orjson.dumps(r) for r in rollouts]
        response = self._post("/v1/rollouts/batch", b"\n".join(lines), "application/x-ndjson")
        body = _json(response)
        if response.status_code == 207:
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    def get_rollout(self, run_id: str) -> Any:
        """The stored rollout, as received."""
        response = self._http.get(f"/v1/rollouts/{run_id}")
        if response.status_code != 200:
            raise TracestoreHTTPError(response.status_code, _json(response))
        return orjson.loads(response.content)


def _json(response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return {"error": {"code": f"http_{response.status_code}", "message": response.text[:200]}}
