"""The legacy carry: what a trace made by `trajectories_to_trace` keeps for the way back.

A v3 trace has no place for several legacy values (a step's `info` and undeclared keys, a
null reward, a trajectory's `inference_url`, ...). `trajectories_to_trace` keeps them under
one metadata key, `tracestore_legacy` (`CARRY_KEY`), so that `trace_to_trajectories` gives
the input trajectories back exactly. Format `CARRY_FORMAT` = 1:

Trace `metadata["tracestore_legacy"]`::

    {"format": 1,
     "trajectories": [            # one entry per input trajectory, in order
        {"n_steps": int,          # how many environment events (in order) are its steps
         "fields": {...},         # header values the trace cannot reproduce (see below)
         "absent": [...],         # declared keys the input did not have
         "order": [...],          # the input's key order, only when not the canonical one
         "raw": value}]}          # only for a trajectory that is not an object (kept whole)

Environment event `metadata["tracestore_legacy"]`, one per step::

    {"trajectory": t, "step": j,  # which trajectory and which of its steps this event is
     "fields": {...}, "absent": [...], "order": [...], "raw": value}   # as above

`fields` holds the *original* value of every key whose value cannot be read back from the
trace itself: for a step, `info` and undeclared keys always, `reward` unless a float, `done`
and `truncated` unless a bool, `tool_calls` unless a list that survives a JSON round trip;
for a trajectory, `inference_url`, `decision_samples` and undeclared keys (e.g.
`trace_correlation_id`) always, and `env_id`, `policy_id`, `length`, `final`, `steps` only
when the trace's own values would differ. Everything else is read from the trace (obs from
`system_state_before`, tool calls from the assistant message, ...). Empty parts are omitted.

The canonical key order is the declared keys (`STEP_KEYS`, `TRAJECTORY_KEYS`) that are
present, then the undeclared keys in their original order; `order` is recorded only when the
input differs from it, so a round trip gives back the same JSON text, not only equal values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CARRY_FORMAT = 1

# Declared keys in the order the producer's own models serialize them (SPEC §1).
STEP_KEYS: tuple[str, ...] = ("obs", "tool_calls", "reward", "done", "truncated", "info")
TRAJECTORY_KEYS: tuple[str, ...] = (
    "env_id",
    "policy_id",
    "steps",
    "final",
    "length",
    "inference_url",
    "decision_samples",
)
_STEP_SET = frozenset(STEP_KEYS)
_TRAJECTORY_SET = frozenset(TRAJECTORY_KEYS)


def same(a: object, b: object) -> bool:
    """Equal and of the same type, so `1`, `1.0` and `True` are told apart (JSON text differs)."""
    return type(a) is type(b) and a == b


def derived_final(last_after: object) -> dict[str, Any] | None:
    """Return the `final` a trajectory gets from its last event's `system_state_after`."""
    return {"observation": last_after} if last_after is not None else None


def key_shape(
    original: Mapping[str, Any], declared: tuple[str, ...]
) -> tuple[list[str], list[str] | None]:
    """Return (declared keys absent from `original`, its key order when not canonical)."""
    keys = list(original)
    if len(keys) == len(declared) and tuple(keys) == declared:
        return [], None  # the common case: exactly the declared keys, in order
    declared_set = _STEP_SET if declared is STEP_KEYS else _TRAJECTORY_SET
    absent = [k for k in declared if k not in original]
    canonical = [k for k in declared if k in original]
    canonical.extend(k for k in keys if k not in declared_set)
    return absent, (None if keys == canonical else keys)


def make_entry(
    entry: dict[str, Any], fields: dict[str, Any], absent: list[str], order: list[str] | None
) -> dict[str, Any]:
    """Add the non-empty carry parts to `entry` and return it."""
    if fields:
        entry["fields"] = fields
    if order is not None:
        entry["order"] = order  # the order lists every key, so `absent` is implied
    elif absent:
        entry["absent"] = absent
    return entry


def assemble(
    derived: Mapping[str, Any], entry: Mapping[str, Any], declared: tuple[str, ...]
) -> dict[str, Any]:
    """Rebuild an object from the values read off the trace and its carry entry."""
    fields = entry.get("fields")
    if not isinstance(fields, Mapping):
        fields = {}
    order = entry.get("order")
    if isinstance(order, list):
        keys: list[Any] = order
    else:
        absent = entry.get("absent")
        skip = set(absent) if isinstance(absent, list) else set()
        declared_set = _STEP_SET if declared is STEP_KEYS else _TRAJECTORY_SET
        keys = [k for k in declared if k not in skip]
        keys.extend(k for k in fields if k not in declared_set)
    return {k: fields[k] if k in fields else derived.get(k) for k in keys}
