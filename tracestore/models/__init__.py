"""ORM tables. Importing this package registers every table on Base.metadata."""

import tracestore.models.drift  # noqa: F401  (registers the drift tables; import them from there)
from tracestore.models.lifecycle import Dataset, DatasetRun, RetentionRule, RunDeletion
from tracestore.models.runs import Run, RunDocument
from tracestore.models.store import StoreIdentity
from tracestore.models.traces import Trace, TraceEvent, TraceMessage, TraceTimeStep
from tracestore.models.trajectories import Step, Trajectory

__all__ = [
    "Dataset",
    "DatasetRun",
    "RetentionRule",
    "Run",
    "RunDeletion",
    "RunDocument",
    "Step",
    "StoreIdentity",
    "Trace",
    "TraceEvent",
    "TraceMessage",
    "TraceTimeStep",
    "Trajectory",
]
