"""Pure converters between legacy trajectories and v3 traces (SPEC §3, §5), with loss reports.

- `trajectories_to_trace(doc)`: a RolloutResponse's trajectories → a full v3 trace, lossless:
  `trace_to_trajectories(trajectories_to_trace(doc).data).data == doc["trajectories"]`.
- `trace_to_trajectories(doc_or_trace)`: any full or wrapped trace → trajectories.
- `convert_document(doc, to="trace" | "trajectories")`: the whole document, converted part
  filled in.

Every call returns a `Conversion` (data, losses, provenance). No I/O, no database.
"""

from tracestore.convert.carry import CARRY_FORMAT, STEP_KEYS, TRAJECTORY_KEYS
from tracestore.convert.document import TARGETS, Target, convert_document
from tracestore.convert.report import (
    CARRY_KEY,
    CONVERTER_VERSION,
    PROVENANCE_KEY,
    Conversion,
    LossEntry,
    LossKind,
    Method,
    Provenance,
    canonical_json,
    source_sha256,
)
from tracestore.convert.to_trace import trajectories_to_trace
from tracestore.convert.to_trajectories import trace_to_trajectories

__all__ = [
    "CARRY_FORMAT",
    "CARRY_KEY",
    "CONVERTER_VERSION",
    "PROVENANCE_KEY",
    "STEP_KEYS",
    "TARGETS",
    "TRAJECTORY_KEYS",
    "Conversion",
    "LossEntry",
    "LossKind",
    "Method",
    "Provenance",
    "Target",
    "canonical_json",
    "convert_document",
    "source_sha256",
    "trace_to_trajectories",
    "trajectories_to_trace",
]
