"""What every conversion returns: the data, a loss report and provenance.

A `Conversion` holds the converted data, the `LossEntry` list (fields the target format could
not carry, or where a default was written) and the `Provenance` (converter name, version and
the sha256 of the source document's canonical JSON).

Loss entry kinds:

- `lost`: the value is not in the source, so the output holds a stand-in (`{}`, null, `""`).
- `default`: the output field holds a default or a coerced value (a null reward written as
  0.0, no tool calls found, ...) and the original is not recoverable from it.
- `replaced`: `convert_document` overwrote a part the document already had.
- `carried`: the output field holds a default or a coerced value, and the original is kept
  in the legacy carry (`trajectories_to_trace`): nothing is lost for the way back.
- `missing`: the target format has a place the source has nothing for (a trace's seed or
  model when the trajectories name none); the output leaves it null or out.
- `stand_in`: the output holds a value the source did not have, made from another of its
  values (the observation as a user prompt) or given by the caller (a creation time).
  Nothing of the source is lost.

`lossless` is true when no entry is `lost`, `default` or `replaced`: nothing the source
holds is missing from the output (a trace made from trajectories carries what it has no
place for, so converting back gives the trajectories exactly).

Per-step entries are grouped: one entry per (trajectory, field, kind, detail), with the path
`trajectories[t].steps[*].field`, the number of steps affected, and their indices when not
every step of the trajectory is affected.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import orjson

# Bump when the produced shape or a carry rule changes; it is recorded in every output.
CONVERTER_VERSION = "1"

# The one metadata key under which our outputs keep what the other format has no place for.
CARRY_KEY = "tracestore_legacy"
# Where provenance is embedded: trace metadata, and an undeclared key on each trajectory.
PROVENANCE_KEY = "tracestore_provenance"

LossKind = Literal["lost", "default", "replaced", "stand_in", "carried", "missing"]
# Kinds that leave the source whole: what was added, kept aside for the way back, or
# absent from the source in the first place.
_ADDITIVE: frozenset[str] = frozenset({"stand_in", "carried", "missing"})
Method = Literal["trajectories", "carry", "trace", "none"]
Action = Literal["filled", "kept", "replaced"]

T = TypeVar("T")


def canonical_json(doc: object) -> bytes:
    """Return the canonical JSON bytes of a parsed document (sorted keys, orjson)."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # orjson refuses integers beyond 64 bits (and non-str keys from Python callers); the
        # stdlib writes them. Such documents never come off an orjson-parsed wire.
        return json.dumps(
            doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr
        ).encode()


def source_sha256(doc: object) -> str:
    """Return the hex sha256 of a document's canonical JSON."""
    return hashlib.sha256(canonical_json(doc)).hexdigest()


@dataclass(frozen=True, slots=True)
class Provenance:
    """Which converter produced an output, at which version, from which source."""

    converter: str
    converter_version: str
    source_sha256: str

    def as_dict(self) -> dict[str, str]:
        """Return the provenance as the JSON object embedded in outputs."""
        return {
            "converter": self.converter,
            "converter_version": self.converter_version,
            "source_sha256": self.source_sha256,
        }


@dataclass(frozen=True, slots=True)
class LossEntry:
    """One field the conversion could not carry, or where it wrote a default."""

    path: str
    kind: LossKind
    detail: str
    count: int = 1
    steps: tuple[int, ...] | None = None  # affected step indices when not all of them

    def as_dict(self) -> dict[str, Any]:
        """Return the entry as a plain dict (for JSON)."""
        out: dict[str, Any] = {
            "path": self.path,
            "kind": self.kind,
            "detail": self.detail,
            "count": self.count,
        }
        if self.steps is not None:
            out["steps"] = list(self.steps)
        return out


@dataclass(frozen=True, slots=True)
class Conversion(Generic[T]):
    """A conversion's result data, loss report and provenance."""

    data: T
    losses: list[LossEntry]
    provenance: Provenance
    # `trajectories`: a trace built from legacy trajectories; `carry`: trajectories rebuilt
    # exactly from a trace we made; `trace`: trajectories read from a producer's trace;
    # `none`: nothing converted (e.g. a summary trace, or a part kept as sent).
    method: Method
    # What a whole-document conversion did with the part: `filled` a missing one, `kept`
    # the document's own, or `replaced` it (convert_document).
    action: Action = "filled"
    # What a reader must know: a part kept, a conversion that gave nothing.
    warnings: tuple[str, ...] = ()

    @property
    def lossless(self) -> bool:
        """True when nothing of the source was lost, defaulted or replaced."""
        return all(entry.kind in _ADDITIVE for entry in self.losses)

    def report(self) -> dict[str, Any]:
        """Return the loss report and provenance as a JSON-ready dict."""
        return {
            "provenance": self.provenance.as_dict(),
            "method": self.method,
            "action": self.action,
            "lossless": self.lossless,
            "warnings": list(self.warnings),
            "losses": [entry.as_dict() for entry in self.losses],
        }


@dataclass(slots=True)
class LossCollector:
    """Collects loss entries; per-step ones are grouped per trajectory and field."""

    entries: list[LossEntry] = field(default_factory=list)
    _steps: dict[tuple[int, str, LossKind, str], list[int]] = field(default_factory=dict)

    def add(self, path: str, kind: LossKind, detail: str) -> None:
        """Record a loss at one path."""
        self.entries.append(LossEntry(path, kind, detail))

    def add_step(self, trajectory: int, step: int, name: str, kind: LossKind, detail: str) -> None:
        """Record a loss on field `name` of one step."""
        self._steps.setdefault((trajectory, name, kind, detail), []).append(step)

    def finish(self, step_counts: Mapping[int, int]) -> list[LossEntry]:
        """Return all entries; `step_counts` gives each trajectory's number of steps."""
        out = list(self.entries)
        for (trajectory, name, kind, detail), indices in self._steps.items():
            every = len(indices) == step_counts.get(trajectory, -1)
            out.append(
                LossEntry(
                    path=f"trajectories[{trajectory}].steps[*].{name}",
                    kind=kind,
                    detail=detail,
                    count=len(indices),
                    steps=None if every else tuple(indices),
                )
            )
        return out
