"""ORM tables. Importing this package registers every table on Base.metadata."""

from tracestore.models.runs import Run, RunDocument
from tracestore.models.traces import Trace, TraceEvent, TraceMessage, TraceTimeStep
from tracestore.models.trajectories import Step, Trajectory

__all__ = [
    "Run",
    "RunDocument",
    "Step",
    "Trace",
    "TraceEvent",
    "TraceMessage",
    "TraceTimeStep",
    "Trajectory",
]
