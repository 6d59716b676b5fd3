"""The domain error tree; the API maps it to HTTP in one table (api/errors.py)."""

from __future__ import annotations

from typing import Any


class TracestoreError(Exception):
    """Base of every error tracestore reports to a user."""

    code = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (analytics run in a child process): keep the
        # details, which the default pickling (the positional args only) would drop.
        return (_rebuild, (type(self), self.message, self.details))


class InvalidJSON(TracestoreError):
    """The body is not JSON (or not the JSON shape a route expects at the top)."""

    code = "invalid_json"


class InvalidRollout(TracestoreError):
    """The JSON is well-formed but is not a RolloutResponse; `errors` lists failing paths."""

    code = "invalid_rollout"


class PayloadTooLarge(TracestoreError):
    """The body (after decompression) exceeds the configured limit."""

    code = "payload_too_large"


class UnsupportedMediaType(TracestoreError):
    """The body's Content-Type or Content-Encoding is not one we read."""

    code = "unsupported_media_type"


class NotFound(TracestoreError):
    """The requested resource does not exist."""

    code = "not_found"


class Conflict(TracestoreError):
    """The run_id exists with other content."""

    code = "conflict"


class Unauthorized(TracestoreError):
    """Missing or wrong API key."""

    code = "unauthorized"


class Forbidden(TracestoreError):
    """A valid API key whose role does not allow this (deleting needs `admin`)."""

    code = "forbidden"


class Pinned(Conflict):
    """The run is pinned by a dataset: deleting it needs `force` (`pinned_by` names them)."""

    code = "pinned"


class InvalidRequest(TracestoreError):
    """A query parameter or path parameter is wrong."""

    code = "invalid_request"


class EmptyBatch(InvalidRequest):
    """A batch with no rollouts in it (an empty body, `[]`, NDJSON without a line)."""

    code = "empty_batch"


class SchemaOutOfDate(TracestoreError):
    """The database schema is not at the revision this code expects."""

    code = "schema_out_of_date"


class Unavailable(TracestoreError):
    """A part of the service could not answer now (nothing was wrong with the request)."""

    code = "unavailable"


def _rebuild(cls: type[TracestoreError], message: str, details: dict[str, Any]) -> TracestoreError:
    return cls(message, **details)


def first_line(exc: BaseException) -> str:
    """The first line of an error message (DuckDB adds context lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
