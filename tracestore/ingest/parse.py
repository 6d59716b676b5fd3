"""Bytes to a validated document: JSON parsing and RolloutResponse validation."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from tracestore.errors import InvalidJSON, InvalidRollout
from tracestore.jsontext import first_repeated_key, json_type, repeats_keys, split_array
from tracestore.wire.rollout import RolloutIn


def parse_json(raw: bytes | str) -> Any:
    """Parse one JSON value; NaN/Infinity tokens, lone surrogates and bad UTF-8 are refused
    (400), and so is a key repeated in an object, at any depth (422).

    We refuse rather than map NaN to null: the store promises to give back what was sent,
    and standard JSON has no NaN. A repeated key would make the stored bytes say one thing
    (the first) and the typed tables another (the parser keeps the last).
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "infinity when parsed as double" in str(exc):
            # Valid JSON (RFC 8259 sets no range), but no double holds it: refused as
            # Infinity is, not called invalid.
            raise InvalidJSON(
                f"the body holds a number past a double's range (such as 1e400), refused as "
                f"NaN and Infinity are: {exc}"
            ) from None
        raise InvalidJSON(f"the body is not valid JSON: {exc}") from None
    text = raw.encode() if isinstance(raw, str) else raw
    # The quick count says whether to look; the slow look says which key, and where.
    if not repeats_keys(text, value):
        return value
    del value  # refused either way (but for an escaped colon): not held during the look
    found = first_repeated_key(text)
    if found is not None:
        path, key = found
        where = _loc((*path, key))
        raise InvalidRollout(
            f"the key {key!r} appears twice in one object (at {where}): keys must be unique",
            errors=[{"path": where, "message": "repeated key"}],
            key=key,
        )
    return orjson.loads(raw)  # an escaped colon made the count look: no key repeats


def split_batch_array(raw: bytes) -> list[bytes]:
    """The items of a JSON-array batch body, each exactly the bytes that were posted.

    InvalidJSON (400) when the body is not JSON, InvalidRollout (422) when it is JSON but
    not an array. Each item is parsed and checked on its own afterwards.
    """
    try:
        items = split_array(raw)
    except ValueError as exc:
        raise InvalidJSON(f"the body is not a valid JSON array: {exc}") from None
    if items is None:
        parse_json(raw)  # not an array: say whether it is JSON at all (400) ...
        raise InvalidRollout(  # ... or JSON of another kind (422)
            "a batch is a JSON array of RolloutResponses (or NDJSON with "
            "Content-Type application/x-ndjson)",
            errors=[{"path": "(document)", "message": "expected an array"}],
        )
    return items


# The routes under GET /v1/rollouts/{run_id}.
RUN_SUBRESOURCES = ("/trace", "/trajectories", "/drift")


def _loc(loc: tuple[int | str, ...]) -> str:
    """A path as the errors write it: trajectories[0].steps[1].obs."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def validate_rollout(doc: object) -> dict[str, Any]:
    """Check that a parsed value is a RolloutResponse (SPEC §1); return it unchanged."""
    if not isinstance(doc, dict):
        hint = " (post JSON arrays to /v1/rollouts/batch)" if isinstance(doc, list) else ""
        raise InvalidRollout(
            f"a RolloutResponse is a JSON object, not {json_type(doc)}{hint}",
            errors=[{"path": "(document)", "message": "expected an object"}],
        )
    run_id = doc.get("run_id")
    if isinstance(run_id, str) and "\x00" in run_id:
        # Ids appear in URLs and PostgreSQL text, neither of which carries NUL.
        raise InvalidRollout(
            "not a valid RolloutResponse: run_id must not contain NUL (\\u0000)",
            errors=[{"path": "run_id", "message": "contains NUL"}],
        )
    if isinstance(run_id, str) and run_id and not run_id.strip("."):
        # `.` and `..` are dot segments of a URL: clients resolve them away before sending
        # (GET /v1/rollouts/.. asks for /v1/), so such a run could never be fetched.
        raise InvalidRollout(
            "not a valid RolloutResponse: run_id must not consist of dots only (URLs "
            "resolve '.' and '..' away)",
            errors=[{"path": "run_id", "message": "dots only"}],
        )
    # removesuffix: a route's `$` also matches before one final newline.
    if isinstance(run_id, str) and run_id.removesuffix("\n").endswith(RUN_SUBRESOURCES):
        # GET /v1/rollouts/a%2Ftrace reaches the route of run "a"'s trace: such an id could
        # be stored but never fetched.
        raise InvalidRollout(
            "not a valid RolloutResponse: run_id must not end with "
            + ", ".join(RUN_SUBRESOURCES)
            + " (those are the routes under a run)",
            errors=[{"path": "run_id", "message": "ends with a sub-resource name"}],
        )
    try:
        RolloutIn.model_validate(doc)
    except ValidationError as exc:
        errors = [
            {"path": _loc(e["loc"]), "message": e["msg"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        first = errors[0]
        raise InvalidRollout(
            f"not a valid RolloutResponse: {first['path']}: {first['message']}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
            errors=errors[:50],
        ) from None
    return doc
