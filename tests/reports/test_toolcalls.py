"""The SQL tool-call name (views.sql) agrees with tracestore.toolcalls on every call seen."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import orjson

from tests.conftest import Example
from tests.reports.cases import all_cases
from tests.reports.conftest import Store
from tests.reports.figures import json_text
from tracestore.toolcalls import normalize_tool_call

DIALECTS: list[Any] = [
    {"tool_name": "a", "arguments": {"x": 1}},
    {"tool": "b", "args": {"x": 1}},
    {"tool": "c", "arguments": {}, "id": "1"},
    {"name": "d", "arguments_json": "{}"},
    {"id": "2", "type": "function", "function": {"name": "e", "arguments": "{}"}},
    {"function": "not-an-object", "name": "f"},
    {"function": {"arguments": "{}"}, "tool_name": "shadowed"},
    {"tool_name": None, "name": "g"},
    {"name": None, "tool": "h"},
    {"tool_name": 7},
    {"tool_name": "", "name": "i"},
    {"other": "no name"},
    "a string",
    42,
    None,
    ["a", "list"],
    {"tool_name": "ünïcode ☃"},
]


def _calls(value: Any) -> Iterator[Any]:
    """Every tool call anywhere in a document (steps, call records, payloads, metadata)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("tool_calls", "output_tool_calls") and isinstance(item, list):
                yield from item
            elif key == "json_payload" and isinstance(item, str):
                with contextlib.suppress(orjson.JSONDecodeError):
                    yield from _calls(orjson.loads(item))
            else:
                yield from _calls(item)
    elif isinstance(value, list):
        for item in value:
            yield from _calls(item)


def test_sql_and_python_name_every_call_alike(
    stores: dict[str, Store], examples: list[Example]
) -> None:
    docs = [ex.doc for ex in examples] + [orjson.loads(raw) for raw in all_cases()]
    seen = [call for doc in docs for call in _calls(doc)]
    assert len(seen) > 100  # the examples do carry tool calls in several places
    calls = seen + DIALECTS
    analytics = next(iter(stores.values())).live
    texts = [orjson.dumps(c).decode() for c in calls]
    got = analytics.con.execute(
        "SELECT list_transform(?::VARCHAR[], c -> tool_call_name(CAST(c AS JSON)))", [texts]
    ).fetchone()
    assert got is not None
    for call, name in zip(calls, got[0], strict=True):
        assert name == json_text(normalize_tool_call(call)["name"]), call
