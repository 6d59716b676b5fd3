"""Tool-call dialects (SPEC §5) normalized to (name, arguments) for comparison."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson


def _arguments(value: object) -> object:
    # Arguments arrive as an object or as a JSON string of one; compare them as objects.
    if isinstance(value, str | bytes):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def normalize_tool_call(call: object) -> dict[str, Any]:
    """Return `{"name", "arguments"}` for any SPEC §5 tool-call dialect.

    Keys that carry no meaning for comparison (`id`, `source`, `type`, `index`) are dropped.
    """
    # dict first: parsed JSON is dicts, and the Mapping ABC check is several times slower.
    if type(call) is not dict and not isinstance(call, Mapping):
        return {"name": None, "arguments": call}
    function = call.get("function")
    # OpenAI: {"id", "type": "function", "function": {...}}
    if type(function) is dict or (function is not None and isinstance(function, Mapping)):
        return {"name": function.get("name"), "arguments": _arguments(function.get("arguments"))}
    name = call.get("tool_name", call.get("name", call.get("tool")))
    if "arguments_json" in call and call.get("arguments_json") is not None:
        args: object = _arguments(call.get("arguments_json"))
    elif "arguments" in call:
        args = _arguments(call.get("arguments"))
    else:
        args = _arguments(call.get("args"))
    return {"name": name, "arguments": args}


def normalize_tool_calls(calls: object) -> list[dict[str, Any]]:
    """Normalize a list of tool calls; a missing or null list is no calls."""
    if not isinstance(calls, list):
        return []
    return [normalize_tool_call(c) for c in calls]


def trajectory_tool_call(call: object) -> dict[str, Any]:
    """One tool call in the shape producers' trajectories carry: `{"tool_name", "arguments"}`.

    Arguments sent as a JSON string come back as the object it encodes.
    """
    normalized = normalize_tool_call(call)
    return {"tool_name": normalized["name"], "arguments": normalized["arguments"]}
