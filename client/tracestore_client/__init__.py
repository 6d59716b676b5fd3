"""tracestore's Python client, alone: post rollouts to a tracestore server and lose none.

`TracestoreClient` (sync) and `AsyncTracestoreClient` (asyncio) post rollouts and
batches with retries, and with `spool=` keep what the server could not take in a local
file, delivered when it answers again. They read a run back (`get_rollout`, `get_trace`,
`get_trajectories`, `find_by_cid`, `iter_runs`). Everything is logged under `tracestore.client`.
The server distribution re-exports these names as `tracestore.client`.
"""

from tracestore_client.client import (
    GZIP_ABOVE,
    AsyncTracestoreClient,
    RunFilters,
    TracestoreClient,
    path_segment,
)
from tracestore_client.encoding import Rollout, encode_rollout
from tracestore_client.errors import NonFiniteNumberError, TracestoreHTTPError, UnexpectedAnswer
from tracestore_client.retry import RETRY_STATUSES, RetryPolicy, is_retryable, retry_after
from tracestore_client.spool import ReplayResult, Spool, SpoolStatus

__version__ = "0.1.0"

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
