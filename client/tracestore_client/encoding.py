"""Rollouts to JSON bytes, refusing NaN and Infinity instead of changing them.

The standard library's encoder does the work: with `allow_nan=False` it refuses a
non-finite float in C, at no cost to documents without one (orjson, the previous
encoder, wrote them as `null`: the store then kept a value the producer never sent).
Only when it refuses does a walk of the document find where, for the error message.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import uuid
from typing import Any

from tracestore_client.errors import NonFiniteNumberError

# bytes (sent as given), a dict, or a pydantic model such as synth-ai's RolloutResponse.
Rollout = bytes | dict[str, Any] | Any

# Tokens a non-standard JSON writer uses for non-finite numbers (Python's json, JavaScript
# engines' lenient modes): a cheap byte search before the full parse that confirms one.
_NON_FINITE_TOKENS = (b"NaN", b"Infinity")


def _default(value: Any) -> Any:
    """JSON for the types orjson (the previous encoder) wrote natively, written the same way."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of `value`; ValueError on NaN or Infinity (see encode_rollout)."""
    text = json.dumps(
        value, allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=_default
    )
    return text.encode("utf-8")


def loads(data: bytes | str) -> Any:
    """Parse JSON (a server's answer, a spooled record)."""
    return json.loads(data)


def _key_path(path: str, key: object) -> str:
    name = str(key)
    return f"{path}.{name}" if name.isidentifier() else f"{path}[{json.dumps(name)}]"


def _token(number: float) -> str:
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def find_non_finite(value: Any, path: str = "$") -> tuple[str, str] | None:
    """Where the first NaN or Infinity in `value` is, and which: ('$.a[2]', 'NaN'), or None."""
    # An explicit stack, not recursion: a deeply nested document must not hit the
    # recursion limit here when the encoder (in C) took it.
    stack: list[tuple[str, Any]] = [(path, value)]
    seen: set[int] = set()  # a cycle makes the encoder refuse too; walk it once
    while stack:
        where, item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, _token(item)
            continue
        if item is None or isinstance(item, str | int | bytes):
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            children = [(_key_path(where, k), v) for k, v in item.items()]
        elif isinstance(item, list | tuple):
            children = [(f"{where}[{i}]", v) for i, v in enumerate(item)]
        else:
            try:
                children = [(where, _default(item))]
            except TypeError:
                continue
        stack.extend(reversed(children))  # first in document order is reported
    return None


def task_app_json(value: Any, _seen: frozenset[int] = frozenset()) -> Any:
    """A model as a synth-ai task app's /rollout route puts it on the wire.

    The app factory sends `to_jsonable(response.model_dump())`: models, dataclasses and
    objects are unwrapped, enums become their values, tuples and sets lists, and anything
    else JSON has no type for (datetimes above all) its `repr`. Posting the model and
    posting the app's HTTP body of it are then the same bytes, hence the same rollout.
    """
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, enum.Enum):
        return task_app_json(value.value, _seen)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return task_app_json(dataclasses.asdict(value), _seen)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return task_app_json(dump(), _seen)
    if id(value) in _seen:
        return f"<circular type={type(value).__name__}>"
    seen = _seen | {id(value)}
    if isinstance(value, dict):
        return {str(k): task_app_json(v, seen) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [task_app_json(v, seen) for v in value]
    if isinstance(value, bytes | bytearray):
        return f"<bytes len={len(value)}>"
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return task_app_json(vars(value), seen)
    return repr(value)


def _run_id(value: Any) -> str | None:
    run_id = value.get("run_id") if isinstance(value, dict) else None
    return run_id if isinstance(run_id, str) else None


def encode_rollout(rollout: Rollout, index: int | None = None) -> bytes:
    """The bytes to send for `rollout`; NonFiniteNumberError when it holds NaN or Infinity.

    Bytes are sent as given (the store keeps them byte for byte), after the same check; a
    pydantic model (synth-ai's RolloutResponse) is written as the task app's HTTP response
    writes it (`task_app_json`). `index` is the rollout's place in a batch, for the message.
    """
    if isinstance(rollout, bytes):
        if any(token in rollout for token in _NON_FINITE_TOKENS):
            try:
                parsed = json.loads(rollout)  # reads NaN and Infinity as floats
            except (ValueError, RecursionError):
                return rollout  # not JSON at all: the server says why (400 invalid_json)
            found = find_non_finite(parsed)
            if found is not None:
                raise NonFiniteNumberError(
                    found[1], found[0], run_id=_run_id(parsed), index=index
                ) from None
        return rollout
    if not isinstance(rollout, dict) and callable(getattr(rollout, "model_dump", None)):
        rollout = task_app_json(rollout)
    try:
        return dumps(rollout)
    except ValueError:
        found = find_non_finite(rollout)
        if found is None:
            raise  # another refusal (a circular reference): the encoder's own message
        raise NonFiniteNumberError(
            found[1], found[0], run_id=_run_id(rollout), index=index
        ) from None


def run_id_of(raw: bytes) -> str | None:
    """The run_id of a rollout's bytes, or None when there is none to read."""
    try:
        return _run_id(json.loads(raw))
    except (ValueError, RecursionError):
        return None
