"""tracestore's HTTP client, importable here as before; the code is `tracestore_client`.

The client is a distribution of its own (`tracestore-client`, in client/ of this
repository) so that a task app installs it without the server's dependencies. Used by
`tracestore ingest --url` and `tracestore spool replay`.
"""

from tracestore_client import (
    GZIP_ABOVE,
    RETRY_STATUSES,
    AsyncTracestoreClient,
    NonFiniteNumberError,
    ReplayResult,
    RetryPolicy,
    Rollout,
    RunFilters,
    Spool,
    SpoolStatus,
    TracestoreClient,
    TracestoreHTTPError,
    UnexpectedAnswer,
    encode_rollout,
    is_retryable,
    path_segment,
    retry_after,
)

__all__ = [
    "GZIP_ABOVE",
    "RETRY_STATUSES",
    "AsyncTracestoreClient",
    "NonFiniteNumberError",
    "ReplayResult",
    "RetryPolicy",
    "Rollout",
    "RunFilters",
    "Spool",
    "SpoolStatus",
    "TracestoreClient",
    "TracestoreHTTPError",
    "UnexpectedAnswer",
    "encode_rollout",
    "is_retryable",
    "path_segment",
    "retry_after",
]
